"""Settings: flags first, then FLIGHTREC_* environment variables, then defaults."""

from __future__ import annotations

import dataclasses
import os
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from flightrec.errors import ConfigError

# The topic names live in flightrec.schemas.topics (the wire's contract); they are re-exported
# here, on first use, so that reading settings does not load the Avro codec.
_TOPIC_NAMES = ("TOPIC_LIFECYCLE", "TOPIC_LOGS", "TOPIC_EXITS", "TOPIC_METRICS", "TOPICS")
STOCK_MAX_MESSAGE_BYTES = 1_048_588  # Kafka's default message.max.bytes (and so each topic's max.message.bytes)


def _default_cache_dir() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return str(Path(base) / "flightrec")


def _default_state_dir() -> str:
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return str(Path(base) / "flightrec")


@dataclass(frozen=True)
class Setting:
    """One documented setting: its environment variable, default and meaning."""

    env: str
    default: str
    help: str


# Every setting flightrec reads from the environment. docs/settings.md documents
# each one; a test checks that none is missing there.
SETTINGS: tuple[Setting, ...] = (
    Setting("FLIGHTREC_BOOTSTRAP", "localhost:9092", "Kafka bootstrap servers, comma separated."),
    Setting("FLIGHTREC_DB", "flightrec.duckdb", "Path of the DuckDB database the materializer writes and readers read, or a DuckLake: 'ducklake:postgres:dbname=… host=… port=… user=…' (docs/lake.md)."),
    Setting("FLIGHTREC_DATA_PATH", "", "Data folder (or object-storage URL) of a DuckLake --db ('ducklake:…'), where its Parquet files go; same as --data-path. Writers need it; readers take the one the lake's catalog recorded."),
    Setting("FLIGHTREC_INSTANCE", "<hostname>", "This instance's id, used by the agent when --instance is not given."),
    Setting("FLIGHTREC_SPOOL", "$XDG_STATE_HOME/flightrec/spool", "The agent's durable spool folder (boot id, seq counter, unsent events)."),
    Setting("FLIGHTREC_HOME", ".flightrec", "Folder for local state of `flightrec broker` and `flightrec demo` (broker data, demo databases)."),
    Setting("FLIGHTREC_CACHE", "$XDG_CACHE_HOME/flightrec", "Folder for what flightrec downloads or builds once (Kafka's jars, the compiled CUDA kernels); `make` and the tests set it to the checkout's `.cache`."),
    Setting("FLIGHTREC_KAFKA_LIBS", "$FLIGHTREC_CACHE/kafka/<version>/libs", "Where Kafka's jars are cached once fetched with Maven."),
    Setting("FLIGHTREC_PARTITIONS", "6", "Partitions per topic when flightrec creates its topics."),
    Setting("FLIGHTREC_REPLICATION", "1", "Replication factor when flightrec creates its topics."),
    Setting("FLIGHTREC_RETENTION_MS", "-1", "Topic retention in milliseconds when flightrec creates its topics; -1 keeps everything so replay always works."),
    Setting("FLIGHTREC_REDACT", "", "Comma-separated names of environment variables whose values are masked in every shipped line."),
    Setting("FLIGHTREC_SECRET_SHAPES", "", "Secrets masked by their shape (AWS keys, GitHub/GitLab tokens, Authorization headers, private keys, password=/token= values...): unset, the built-in list (producer/secret_shapes.toml); a path, a TOML file of more shapes in the same format (it may also `disable` built-in ones by name); `off`, none (names and URL credentials are still masked)."),
    Setting("FLIGHTREC_SECURITY_PROTOCOL", "PLAINTEXT", "Kafka security protocol: PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL."),
    Setting("FLIGHTREC_SASL_MECHANISM", "", "SASL mechanism (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512) when a SASL protocol is used."),
    Setting("FLIGHTREC_SASL_USERNAME", "", "SASL user name."),
    Setting("FLIGHTREC_SASL_PASSWORD", "", "SASL password (prefer FLIGHTREC_SASL_PASSWORD_FILE: an environment is easy to leak)."),
    Setting("FLIGHTREC_SASL_PASSWORD_FILE", "", "File holding the SASL password (its first line); used when FLIGHTREC_SASL_PASSWORD is not set."),
    Setting("FLIGHTREC_SSL_CAFILE", "", "CA bundle to verify the brokers' TLS certificates."),
    Setting("FLIGHTREC_SSL_CERTFILE", "", "Client certificate for TLS client authentication."),
    Setting("FLIGHTREC_SSL_KEYFILE", "", "Client key for TLS client authentication."),
    Setting("FLIGHTREC_FACTS", "", "JSON file of InstanceFacts fields that override the agent's probe (e.g. a simulated RTX 4090 on a CPU machine); GPU fields there skip nvidia-smi."),
    Setting("FLIGHTREC_FLUSH_TIMEOUT", "10", "Seconds an exiting agent waits for Kafka to acknowledge its events; the rest stays in the spool. Not waited for when Kafka does not answer (an attempt made at exit fails, or one has not come back for 2 s, and no bootstrap address accepts a TCP connection): the stage ends as fast as without the agent."),
    Setting("FLIGHTREC_MAX_MESSAGE_BYTES", "", "Largest Kafka message the agent builds, in bytes. Unset: each topic's max.message.bytes as the cluster describes it, else Kafka's stock 1048588. Set it where the agent may not describe topic configs, or to stay below them."),
    Setting("FLIGHTREC_MAX_LINE", "65536", "Longest log line shipped, in bytes; longer lines are cut and flagged truncated."),
    Setting("FLIGHTREC_TAIL_LINES", "100", "Lines of stdout, stderr and each followed file kept in a process-exit event."),
    Setting("FLIGHTREC_FOLLOW_GRACE", "2", "Seconds at most that `agent run` keeps reading followed files after CMD exits when no process the stage started still runs (it stops once they were read to their end: 0.2 s without new bytes)."),
    Setting("FLIGHTREC_SEAL_WAIT", "10", "Seconds a seal waits for the boot's other running stages (a background tunnel) and a facts probe (a slow nvidia-smi) to end; what still runs then is named in the seal and its later events are not recorded."),
    Setting("FLIGHTREC_HEARTBEAT_S", "30", "Seconds between the agent's heartbeats while a stage runs (0: none); an unsealed instance silent for 3 intervals has status `lost`."),
    Setting("FLIGHTREC_LATE_WAIT", "60", "Seconds a seal waits at most for late output: until every process a stage left behind that can still write it (holds its pipes, or carries its token while its files are followed) has ended. Quiet is not an end: a proving daemon loads tens of GB of parameters for seconds before a GPU error. What still writes then is named in the seal; its later lines are passed on but not recorded."),
    Setting("FLIGHTREC_WEBHOOK", "", "The materializer posts one Slack-compatible JSON message per new failure or incomplete boot to this URL (same as `materialize --webhook`)."),
    Setting("FLIGHTREC_ALERT_ON", "failed,lost,below_min_rate,incomplete", "Which alerts the webhook gets, comma separated (same as `materialize --alert-on`)."),
    Setting("FLIGHTREC_DASHBOARD_URL", "http://localhost:8501", "The dashboard's address, for the links in alerts."),
    Setting("FLIGHTREC_CLOCK_OFFSET_S", "0", "Testing and diagnostics only: seconds added to every timestamp the agent stamps on its events, to play an instance whose clock is wrong (negative: behind) without touching the machine's clock. Liveness does not follow it (the materializer judges by Kafka's receive time); the instance page shows the offset."),
    Setting("FLIGHTREC_LOG_LEVEL", "INFO", "Level of flightrec's own log on stderr (DEBUG, INFO, WARNING, ERROR). Kafka client (aiokafka) warnings and errors, such as refused credentials or an untrusted certificate, are shown once each; its INFO lines only at DEBUG."),
)


def _env(env: Mapping[str, str], name: str) -> str | None:
    value = env.get(name)
    return value if value not in (None, "") else None


def _number(env: Mapping[str, str], name: str, default: Any, kind: type, what: str) -> Any:
    raw = _env(env, name)
    if raw is None:
        return default
    try:
        return kind(raw)
    except ValueError as exc:
        raise ConfigError(f"{name}={raw!r} is not {what}; set it to {what} or unset it") from exc


def _int(env: Mapping[str, str], name: str, default: int) -> int:
    return _number(env, name, default, int, "a whole number")


def _float(env: Mapping[str, str], name: str, default: float) -> float:
    return _number(env, name, default, float, "a number")


@dataclass(frozen=True)
class Settings:
    """Resolved configuration. Build it with :meth:`from_env`, then :meth:`with_overrides` for flags."""

    bootstrap: str = "localhost:9092"
    db: str = "flightrec.duckdb"
    instance: str = field(default_factory=socket.gethostname)
    spool: str = field(default_factory=lambda: str(Path(_default_state_dir()) / "spool"))
    home: str = ".flightrec"
    kafka_libs: str | None = None
    cache: str = field(default_factory=_default_cache_dir)
    partitions: int = 6
    replication: int = 1
    retention_ms: int = -1
    redact: tuple[str, ...] = ()
    secret_shapes: str | None = None
    security_protocol: str = "PLAINTEXT"
    sasl_mechanism: str | None = None
    sasl_username: str | None = None
    sasl_password: str | None = field(default=None, repr=False)
    sasl_password_file: str | None = None
    ssl_cafile: str | None = None
    ssl_certfile: str | None = None
    ssl_keyfile: str | None = None
    log_level: str = "INFO"
    facts: str | None = None
    flush_timeout: float = 10.0
    max_line: int = 65536
    tail_lines: int = 100
    follow_grace: float = 2.0
    seal_wait: float = 10.0
    max_message_bytes: int | None = None
    heartbeat_s: float = 30.0
    late_wait: float = 60.0
    webhook: str | None = None
    alert_on: str | None = None
    dashboard_url: str = "http://localhost:8501"

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "Settings":
        """Read every FLIGHTREC_* variable; unset or empty ones take the default."""
        env = os.environ if env is None else env
        base = cls()
        redact = _env(env, "FLIGHTREC_REDACT")
        protocol = (_env(env, "FLIGHTREC_SECURITY_PROTOCOL") or base.security_protocol).upper()
        if protocol not in ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"):
            raise ConfigError(
                f"FLIGHTREC_SECURITY_PROTOCOL={protocol!r} is not one of PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL"
            )
        return cls(
            bootstrap=_env(env, "FLIGHTREC_BOOTSTRAP") or base.bootstrap,
            db=_env(env, "FLIGHTREC_DB") or base.db,
            instance=_env(env, "FLIGHTREC_INSTANCE") or base.instance,
            spool=_env(env, "FLIGHTREC_SPOOL") or base.spool,
            home=_env(env, "FLIGHTREC_HOME") or base.home,
            kafka_libs=_env(env, "FLIGHTREC_KAFKA_LIBS"),
            cache=_env(env, "FLIGHTREC_CACHE") or base.cache,
            partitions=_int(env, "FLIGHTREC_PARTITIONS", base.partitions),
            replication=_int(env, "FLIGHTREC_REPLICATION", base.replication),
            retention_ms=_int(env, "FLIGHTREC_RETENTION_MS", base.retention_ms),
            redact=tuple(n.strip() for n in redact.split(",") if n.strip()) if redact else (),
            secret_shapes=_env(env, "FLIGHTREC_SECRET_SHAPES"),
            security_protocol=protocol,
            sasl_mechanism=_env(env, "FLIGHTREC_SASL_MECHANISM"),
            sasl_username=_env(env, "FLIGHTREC_SASL_USERNAME"),
            sasl_password=_env(env, "FLIGHTREC_SASL_PASSWORD"),
            sasl_password_file=_env(env, "FLIGHTREC_SASL_PASSWORD_FILE"),
            ssl_cafile=_env(env, "FLIGHTREC_SSL_CAFILE"),
            ssl_certfile=_env(env, "FLIGHTREC_SSL_CERTFILE"),
            ssl_keyfile=_env(env, "FLIGHTREC_SSL_KEYFILE"),
            log_level=(_env(env, "FLIGHTREC_LOG_LEVEL") or base.log_level).upper(),
            facts=_env(env, "FLIGHTREC_FACTS"),
            flush_timeout=_float(env, "FLIGHTREC_FLUSH_TIMEOUT", base.flush_timeout),
            max_line=_int(env, "FLIGHTREC_MAX_LINE", base.max_line),
            tail_lines=_int(env, "FLIGHTREC_TAIL_LINES", base.tail_lines),
            follow_grace=_float(env, "FLIGHTREC_FOLLOW_GRACE", base.follow_grace),
            seal_wait=_float(env, "FLIGHTREC_SEAL_WAIT", base.seal_wait),
            max_message_bytes=_int(env, "FLIGHTREC_MAX_MESSAGE_BYTES", None),  # type: ignore[arg-type]
            heartbeat_s=_float(env, "FLIGHTREC_HEARTBEAT_S", base.heartbeat_s),
            late_wait=_float(env, "FLIGHTREC_LATE_WAIT", base.late_wait),
            webhook=_env(env, "FLIGHTREC_WEBHOOK"),
            alert_on=_env(env, "FLIGHTREC_ALERT_ON"),
            dashboard_url=_env(env, "FLIGHTREC_DASHBOARD_URL") or base.dashboard_url,
        )

    def with_overrides(self, **flags: Any) -> "Settings":
        """Apply command-line flags; a flag left as None keeps the env/default value."""
        given = {k: v for k, v in flags.items() if v is not None}
        return dataclasses.replace(self, **given)

    def kafka_kwargs(self) -> dict[str, Any]:
        """Connection keyword arguments for aiokafka clients (bootstrap, TLS, SASL)."""
        kwargs: dict[str, Any] = {
            "bootstrap_servers": self.bootstrap,
            "security_protocol": self.security_protocol,
        }
        if self.security_protocol in ("SSL", "SASL_SSL"):
            from aiokafka.helpers import create_ssl_context

            kwargs["ssl_context"] = create_ssl_context(
                cafile=self.ssl_cafile, certfile=self.ssl_certfile, keyfile=self.ssl_keyfile
            )
        if self.security_protocol.startswith("SASL"):
            password = self.password()
            if not (self.sasl_mechanism and self.sasl_username and password):
                raise ConfigError(
                    "a SASL protocol needs FLIGHTREC_SASL_MECHANISM, FLIGHTREC_SASL_USERNAME and "
                    "FLIGHTREC_SASL_PASSWORD_FILE (or FLIGHTREC_SASL_PASSWORD)"
                )
            kwargs.update(
                sasl_mechanism=self.sasl_mechanism,
                sasl_plain_username=self.sasl_username,
                sasl_plain_password=password,
            )
        return kwargs

    def password(self) -> str | None:
        """The SASL password: FLIGHTREC_SASL_PASSWORD, else the first line of FLIGHTREC_SASL_PASSWORD_FILE."""
        if self.sasl_password:
            return self.sasl_password
        if not self.sasl_password_file:
            return None
        try:
            with open(self.sasl_password_file, encoding="utf-8") as f:
                return f.readline().rstrip("\r\n") or None
        except OSError as exc:
            raise ConfigError(f"cannot read FLIGHTREC_SASL_PASSWORD_FILE {self.sasl_password_file}: {exc.strerror}; "
                              "point it at a readable file holding the password") from exc


def __getattr__(name: str) -> Any:
    """The topic names, from flightrec.schemas.topics (``from flightrec.settings import TOPICS`` keeps working)."""
    if name in _TOPIC_NAMES:
        from flightrec.schemas import topics

        return getattr(topics, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
