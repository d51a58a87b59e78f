"""Settings: flags first, then FLIGHTREC_* environment variables, then defaults."""

from __future__ import annotations

import dataclasses
import os
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flightrec.errors import ConfigError

# The topic names live in flightrec.schemas.topics (the wire's contract); they are re-exported
# here, on first use, so that reading settings does not load the Avro codec.
_TOPIC_NAMES = ("TOPIC_LIFECYCLE", "TOPIC_LOGS", "TOPIC_EXITS", "TOPIC_METRICS", "TOPICS")
STOCK_MAX_MESSAGE_BYTES = 1_048_588  # Kafka's default message.max.bytes (and so each topic's max.message.bytes)


def _home() -> Path:
    """The user's home folder; /var/tmp where there is none to find (no $HOME and a user id that /etc/passwd does
    not list: a container started as an arbitrary user, an image without /etc/passwd)."""
    try:
        return Path.home()
    except (RuntimeError, KeyError):
        return Path("/var/tmp")


def _default_cache_dir() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or str(_home() / ".cache")
    return str(Path(base) / "flightrec")


def _default_state_dir() -> str:
    base = os.environ.get("XDG_STATE_HOME") or str(_home() / ".local" / "state")
    return str(Path(base) / "flightrec")


@dataclass(frozen=True)
class Setting:
    """One documented setting: its environment variable, default (as shown) and meaning (Markdown)."""

    env: str
    default: str
    help: str


def _env(env: Mapping[str, str], name: str) -> str | None:
    value = env.get(name)
    return value if value not in (None, "") else None


def _upper(raw: str) -> str:
    return raw.upper()


def _protocol(raw: str) -> str:
    protocol = raw.upper()
    if protocol not in ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"):
        raise ConfigError(
            f"FLIGHTREC_SECURITY_PROTOCOL={protocol!r} is not one of PLAINTEXT, SSL, SASL_PLAINTEXT, "
            "SASL_SSL; set it to one of them or unset it"
        )
    return protocol


def _shown(default: Any) -> str:
    if default is None or default == ():
        return ""
    if isinstance(default, float):
        return f"{default:g}"
    return str(default)


def setting(
    env: str,
    default: Any = None,
    help: str = "",
    *,
    factory: Callable[[], Any] | None = None,
    shown: str | None = None,
    parse: Callable[[str], Any] | None = None,
    repr: bool = True,
) -> Any:
    """A field of Settings defined once: its environment variable, default, meaning (docs/settings.md is made from
    it: `make docs`), and how its text is read when the type alone does not say (``parse``)."""
    meta = {"setting": Setting(env, _shown(default) if shown is None else shown, help), "parse": parse}
    if factory is not None:
        return field(default_factory=factory, metadata=meta, repr=repr)
    return field(default=default, metadata=meta, repr=repr)


def _unauthenticated(text: str) -> str:
    value = text.strip().lower()
    if value not in ("accept", "refuse"):
        raise ConfigError(f"FLIGHTREC_UNAUTHENTICATED={text!r}: choose accept or refuse")
    return value


def _commit_interval(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ConfigError(f"FLIGHTREC_COMMIT_INTERVAL={text!r}: a number of seconds, e.g. 0.5") from None
    if not 0 < value <= 60:  # NaN fails too
        raise ConfigError(f"FLIGHTREC_COMMIT_INTERVAL={text!r}: more than 0 and at most 60 seconds, e.g. 0.5")
    return value


def _bounded(name: str, kind: type, low: float | None = None, high: float | None = None) -> Callable[[str], Any]:
    """How a number with bounds is read: a finite ``kind`` between ``low`` and ``high``, else ConfigError naming
    the setting and what it takes (a value the agent's parts would refuse later, stopping a stage, is refused here,
    where `agent run` falls back to the default: cli.run_command)."""
    what = "a whole number" if kind is int else "a number"
    shown = [f"{int(b):,}" if float(b).is_integer() else f"{b:g}" for b in (low, high) if b is not None]
    if low is not None and high is not None:
        span = f" from {shown[0]} to {shown[1]}"
    elif low is not None:
        span = f" of at least {shown[0]}"
    else:
        span = f" of at most {shown[0]}" if shown else ""

    def parse(text: str) -> Any:
        try:
            value = kind(text.strip())
        except ValueError:
            raise ConfigError(f"{name}={text!r} is not {what}; set it to {what}{span} or unset it") from None
        if value != value or value in (float("inf"), float("-inf")) or (low is not None and value < low):
            raise ConfigError(f"{name}={text!r}: set it to {what}{span} or unset it")
        if high is not None and value > high:
            raise ConfigError(f"{name}={text!r}: set it to {what}{span} or unset it")
        return value

    return parse


def parse_days(name: str, text: str) -> float | None:
    """Days from a setting's text; ``forever`` (or ``never``, ``off``) is None: kept for ever."""
    value = text.strip().lower()
    if value in ("forever", "never", "off"):
        return None
    try:
        days = float(value)
    except ValueError:
        raise ConfigError(f"{name}={text!r}: a number of days (e.g. 14) or `forever`") from None
    if not 0 < days < float("inf"):  # NaN fails too
        raise ConfigError(f"{name}={text!r}: more than 0 days (e.g. 14), or `forever`")
    return days


def _default_spool() -> str:
    return str(Path(_default_state_dir()) / "spool")


def _read(name: str, hint: str, raw: str, parse: Callable[[str], Any] | None) -> Any:
    """The text of FLIGHTREC_… as the field's type (its annotation's text: this module postpones them)."""
    if parse is not None:
        return parse(raw)
    kind = hint.replace(" | None", "")
    try:
        if kind == "int":
            return int(raw)
        if kind == "float":
            return float(raw)
    except ValueError as exc:
        what = "a whole number" if kind == "int" else "a number"
        raise ConfigError(f"{name}={raw!r} is not {what}; set it to {what} or unset it") from exc
    if kind == "tuple[str, ...]":
        return tuple(n.strip() for n in raw.split(",") if n.strip())
    return raw


@dataclass(frozen=True)
class Settings:
    """Resolved configuration. Build it with :meth:`from_env`, then :meth:`with_overrides` for flags.

    Each field is defined once, here: its environment variable, default and meaning (``setting``). The documented
    table (``SETTINGS``, docs/settings.md) and the environment's reading are made from these definitions.
    """

    bootstrap: str = setting(
        "FLIGHTREC_BOOTSTRAP",
        "localhost:9092",
        "Kafka bootstrap servers, comma separated.",
    )
    db: str = setting(
        "FLIGHTREC_DB",
        "flightrec.duckdb",
        "Path of the DuckDB database the materializer writes and readers read, or a DuckLake: "
        "`ducklake:postgres:dbname=… host=… port=… user=…` ([lake.md](lake.md)).",
    )
    data_path: str | None = setting(
        "FLIGHTREC_DATA_PATH",
        None,
        "Data folder (or object-storage URL) of a DuckLake `--db` (`ducklake:…`), where its Parquet files go; "
        "same as `--data-path`. Writers need it; readers take the one the lake's catalog recorded (docs/lake.md).",
    )
    instance: str = setting(
        "FLIGHTREC_INSTANCE",
        None,
        "This instance's id, used by the agent when --instance is not given.",
        factory=socket.gethostname,
        shown="<hostname>",
    )
    spool: str = setting(
        "FLIGHTREC_SPOOL",
        None,
        "The agent's durable spool folder (boot id, seq counter, unsent events).",
        factory=_default_spool,
        shown="$XDG_STATE_HOME/flightrec/spool",
    )
    home: str = setting(
        "FLIGHTREC_HOME",
        ".flightrec",
        "Folder for local state of `flightrec broker` and `flightrec demo` (broker data, demo databases).",
    )
    cache: str = setting(
        "FLIGHTREC_CACHE",
        None,
        "Folder for what flightrec downloads or builds once (Kafka's jars, the compiled CUDA kernels); `make` and"
        " the tests set it to the checkout's `.cache`.",
        factory=_default_cache_dir,
        shown="$XDG_CACHE_HOME/flightrec",
    )
    kafka_libs: str | None = setting(
        "FLIGHTREC_KAFKA_LIBS",
        None,
        "Where Kafka's jars are cached once fetched with Maven.",
        shown="$FLIGHTREC_CACHE/kafka/<version>/libs",
    )
    partitions: int = setting(
        "FLIGHTREC_PARTITIONS",
        6,
        "Partitions per topic when flightrec creates its topics.",
    )
    replication: int = setting(
        "FLIGHTREC_REPLICATION",
        1,
        "Replication factor when flightrec creates its topics.",
    )
    retention_ms: int = setting(
        "FLIGHTREC_RETENTION_MS",
        -1,
        "Topic retention in milliseconds when flightrec creates its topics; -1 keeps everything so replay always "
        "works.",
    )
    agent_byte_rate: int = setting(
        "FLIGHTREC_AGENT_BYTE_RATE",
        5242880,
        "Bytes per second each agent (each client id of the agent principal) may produce, the quota `flightrec "
        "broker start --security sasl_ssl` sets at the broker; beyond it Kafka slows that agent down "
        "(docs/security.md).",
    )
    redact: tuple[str, ...] = setting(
        "FLIGHTREC_REDACT",
        (),
        "Comma-separated names of environment variables whose values are masked in every shipped line.",
    )
    secret_shapes: str | None = setting(
        "FLIGHTREC_SECRET_SHAPES",
        None,
        "Secrets masked by their shape (AWS keys, GitHub/GitLab tokens, Authorization headers, private keys, "
        "password=/token= values...): unset, the built-in list (`producer/secret_shapes.toml`); a path, a TOML "
        "file of more shapes in the same format (it may also `disable` built-in ones by name); `off`, none (names"
        " and URL credentials are still masked). A file that cannot be used is said on the agent's stderr and the"
        ' built-in list masks instead. See docs/agent.md, "Secrets".',
    )
    security_protocol: str = setting(
        "FLIGHTREC_SECURITY_PROTOCOL",
        "PLAINTEXT",
        "Kafka security protocol: PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL.",
        parse=_protocol,
    )
    sasl_mechanism: str | None = setting(
        "FLIGHTREC_SASL_MECHANISM",
        None,
        "SASL mechanism (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512) when a SASL protocol is used.",
    )
    sasl_username: str | None = setting(
        "FLIGHTREC_SASL_USERNAME",
        None,
        "SASL user name.",
    )
    sasl_password: str | None = setting(
        "FLIGHTREC_SASL_PASSWORD",
        None,
        "SASL password (prefer FLIGHTREC_SASL_PASSWORD_FILE: an environment is easy to leak). Never shown by "
        "`repr(Settings)`.",
        repr=False,
    )
    sasl_password_file: str | None = setting(
        "FLIGHTREC_SASL_PASSWORD_FILE",
        None,
        "File holding the SASL password (its first line); used when FLIGHTREC_SASL_PASSWORD is not set. "
        "`flightrec broker start --security sasl_ssl` writes one.",
    )
    ssl_cafile: str | None = setting(
        "FLIGHTREC_SSL_CAFILE",
        None,
        "CA bundle to verify the brokers' TLS certificates.",
    )
    ssl_certfile: str | None = setting(
        "FLIGHTREC_SSL_CERTFILE",
        None,
        "Client certificate for TLS client authentication.",
    )
    ssl_keyfile: str | None = setting(
        "FLIGHTREC_SSL_KEYFILE",
        None,
        "Client key for TLS client authentication.",
    )
    instance_key: str | None = setting(
        "FLIGHTREC_INSTANCE_KEY",
        None,
        "This instance's key, as `flightrec manager enroll --instance ID` printed it: the agent tags every "
        "message with it so the materializer can tell its events from forged ones (docs/security.md). Never "
        "shown by `repr(Settings)`, never written to the spool or a log.",
        repr=False,
    )
    fleet_key: str | None = setting(
        "FLIGHTREC_FLEET_KEY",
        None,
        "The operator's fleet key (hex, from `flightrec manager fleet-key`): the materializer verifies every "
        "message's tag with it, `flightrec manager` signs with it and enrolls instances. Never put it into an "
        "instance. Never shown by `repr(Settings)`.",
        repr=False,
    )
    unauthenticated: str | None = setting(
        "FLIGHTREC_UNAUTHENTICATED",
        None,
        "What the materializer does with an event that carries no tag: `accept` (folded; its instance shown as "
        "unauthenticated) or `refuse` (a dead letter). Default: `refuse` when FLIGHTREC_FLEET_KEY is set, "
        "`accept` without (nothing can be verified then).",
        shown="refuse with a fleet key, else accept",
        parse=_unauthenticated,
    )
    facts: str | None = setting(
        "FLIGHTREC_FACTS",
        None,
        "JSON file of InstanceFacts fields that override the agent's probe (e.g. a simulated RTX 4090 on a CPU "
        "machine); GPU fields there skip nvidia-smi. See docs/agent.md.",
    )
    flush_timeout: float = setting(
        "FLIGHTREC_FLUSH_TIMEOUT",
        10.0,
        "Seconds an exiting agent waits for Kafka to acknowledge its events; the rest stays in the spool. Not "
        "waited for when Kafka does not answer (an attempt made at exit fails, or one has not come back for 2 s, "
        "and no bootstrap address accepts a TCP connection): the stage ends as fast as without the agent.",
        parse=_bounded("FLIGHTREC_FLUSH_TIMEOUT", float, 0, 86400),
    )
    max_message_bytes: int | None = setting(
        "FLIGHTREC_MAX_MESSAGE_BYTES",
        None,
        "Largest Kafka message the agent builds, in bytes. Unset: each topic's `max.message.bytes` as the cluster"
        " describes it, else Kafka's stock 1048588. Set it where the agent may not describe topic configs, or to "
        "stay below them.",
        parse=_bounded("FLIGHTREC_MAX_MESSAGE_BYTES", int, 1024, 1 << 31),
    )
    max_line: int = setting(
        "FLIGHTREC_MAX_LINE",
        65536,
        "Longest log line shipped, in bytes; longer lines are cut and flagged truncated.",
        parse=_bounded("FLIGHTREC_MAX_LINE", int, 16, 1 << 26),
    )
    tail_lines: int = setting(
        "FLIGHTREC_TAIL_LINES",
        100,
        "Lines of stdout, stderr and each followed file kept in a process-exit event.",
        parse=_bounded("FLIGHTREC_TAIL_LINES", int, 0, 100_000),
    )
    follow_grace: float = setting(
        "FLIGHTREC_FOLLOW_GRACE",
        2.0,
        "Seconds at most that `agent run` keeps reading followed files after CMD exits when no process the stage "
        "started still runs (it stops once they were read to their end: 0.2 s without new bytes).",
        parse=_bounded("FLIGHTREC_FOLLOW_GRACE", float, 0, 86400),
    )
    seal_wait: float = setting(
        "FLIGHTREC_SEAL_WAIT",
        10.0,
        "Seconds a seal waits for the boot's other running stages (a background tunnel) and a facts probe (a slow"
        " nvidia-smi) to end; what still runs then is named in the seal and its later events are not recorded.",
        parse=_bounded("FLIGHTREC_SEAL_WAIT", float, 0, 86400),
    )
    heartbeat_s: float = setting(
        "FLIGHTREC_HEARTBEAT_S",
        30.0,
        "Seconds between the agent's heartbeats while a stage runs (0: none). The interval travels in each "
        "heartbeat, so readers know it: an unsealed instance silent for 3 intervals has status `lost`.",
        parse=_bounded("FLIGHTREC_HEARTBEAT_S", float, None, 86400),
    )
    late_wait: float = setting(
        "FLIGHTREC_LATE_WAIT",
        60.0,
        "Seconds a seal waits at most for late output: until every process a stage left behind that can still "
        "write it (holds its pipes, or carries its token while its files are followed) has ended. Quiet is not an"
        " end: a proving daemon loads tens of GB of parameters for seconds before a GPU error. What still writes "
        "then is named in the seal; its later lines are passed on but not recorded.",
        parse=_bounded("FLIGHTREC_LATE_WAIT", float, 0, 86400),
    )
    rules_file: str | None = setting(
        "FLIGHTREC_RULES_FILE",
        None,
        "The operator's own failure rules: a TOML file of `[[rule]]` entries as in `db/rules.toml`, tried before "
        "the packaged ones (which stay as they are); `flightrec rules propose --save` appends to it. Each failure "
        "records the rule and the rules version (of both tables) that classed it. A running materializer reads "
        "the file again when it changes and classes the stored failures again, without a replay; a file that "
        "does not parse is refused with one log line and the rules in use stay (docs/materializer.md).",
    )
    webhook: str | None = setting(
        "FLIGHTREC_WEBHOOK",
        None,
        "The materializer posts one Slack-compatible JSON message per new failure, incomplete boot, lost instance "
        "and new or regressed failure kind to this URL "
        '(same as `materialize --webhook`; see docs/materializer.md, "Alerts").',
    )
    alert_on: str | None = setting(
        "FLIGHTREC_ALERT_ON",
        None,
        "Which alerts the webhook gets, comma separated (same as `materialize --alert-on`).",
        shown="failed,lost,below_min_rate,incomplete,refused,failure_kind",
    )
    alert_max_age: float = setting(
        "FLIGHTREC_ALERT_MAX_AGE",
        900.0,
        "Seconds: a failure, incomplete boot or silence whose evidence Kafka received longer ago than this when the "
        "materializer first sees it is recorded in the alerts outbox but not posted (`outcome` 'historical'): a "
        "database built from old topics, or a materializer restarted after hours, posts no history. 0: post all.",
    )
    commit_interval: float = setting(
        "FLIGHTREC_COMMIT_INTERVAL",
        0.5,
        "Seconds a materializer lets a partial batch wait before it commits it: the batch window (a full batch, "
        "5,000 messages or 16 MiB on a file, 48 MiB on a lake, commits at once; so does a partial one once the "
        "topics go quiet, on a lake only one of 4 MiB or more). "
        "Longer: fewer commits, so one lake catalog carries more members (docs/lake.md), and a lake's lines become "
        "visible that much later.",
        parse=_commit_interval,
    )
    dashboard_url: str = setting(
        "FLIGHTREC_DASHBOARD_URL",
        "http://localhost:8501",
        "The dashboard's address, for the links in alerts.",
    )
    clock_offset_s: float = setting(
        "FLIGHTREC_CLOCK_OFFSET_S",
        0.0,
        "Testing and diagnostics only: seconds added to every timestamp the agent stamps on its events "
        "(`flightrec.schemas.now_us`), to play an instance whose clock is wrong (negative: behind) without "
        "touching the machine's clock; read once per process, an unreadable value is no shift. Liveness does not "
        "follow it: the materializer judges `lost` by when Kafka received the events; the instance page shows the"
        ' offset (docs/materializer.md, "Clocks").',
        parse=_bounded("FLIGHTREC_CLOCK_OFFSET_S", float, -(10**9), 10**9),  # schemas.events.MAX_CLOCK_OFFSET_S
    )
    keep_lines_days: float | None = setting(
        "FLIGHTREC_KEEP_LINES_DAYS",
        14.0,
        "Days a log line is kept after Kafka received it (`forever`: every line is kept), except the context of a "
        "failure (`FLIGHTREC_KEEP_FAILURES_DAYS`). The materializer deletes expired lines in small steps between "
        "its commits, on a file and on a lake (docs/retention.md).",
        parse=lambda text: parse_days("FLIGHTREC_KEEP_LINES_DAYS", text),
    )
    keep_failures_days: float | None = setting(
        "FLIGHTREC_KEEP_FAILURES_DAYS",
        None,
        "Days the context of a failure outlives the lines around it, counted from when its boot last spoke: every "
        "line of the failed stage and of the minutes before it (`FLIGHTREC_KEEP_CONTEXT_MINUTES`), and the last "
        "minutes of a boot that never completed. `forever` keeps them. The failures rows themselves (tails, last "
        "lines), exits, lifecycle events, instances, boots and manager events are always kept.",
        shown="forever",
        parse=lambda text: parse_days("FLIGHTREC_KEEP_FAILURES_DAYS", text),
    )
    keep_context_minutes: float = setting(
        "FLIGHTREC_KEEP_CONTEXT_MINUTES",
        10.0,
        "Minutes of a failed boot's lines kept before its failed stage began (other stages' lines: the daemon a "
        "previous stage started), and of the last lines of a boot that never completed.",
    )
    keep_samples_days: float | None = setting(
        "FLIGHTREC_KEEP_SAMPLES_DAYS",
        30.0,
        "Days throughput samples are kept one by one; older ones are merged into one row per stage and hour (proofs "
        "and seconds summed). `forever` keeps every sample. Benchmark results are always kept.",
        parse=lambda text: parse_days("FLIGHTREC_KEEP_SAMPLES_DAYS", text),
    )
    kinds_new_hours: float = setting(
        "FLIGHTREC_KINDS_NEW_HOURS",
        24.0,
        "Hours a failure kind stays `new` after its first failure, and a kind's return after a quiet spell (or its "
        "change of class after a rule explained it) stays `regressed` (the `failure_kinds` view, `flightrec kinds`; "
        'read by each reader, docs/materializer.md, "Failure kinds").',
        parse=_bounded("FLIGHTREC_KINDS_NEW_HOURS", float, 1e-3, 24 * 3650),
    )
    kinds_quiet_days: float = setting(
        "FLIGHTREC_KINDS_QUIET_DAYS",
        7.0,
        "Days without a failure of a kind after which its next failure makes it `regressed`.",
        parse=_bounded("FLIGHTREC_KINDS_QUIET_DAYS", float, 1e-3, 3650),
    )
    compact_free_share: float = setting(
        "FLIGHTREC_COMPACT_FREE_SHARE",
        0.5,
        "A materializer compacts its database file (`flightrec compact`) at a quiet moment once this share of the "
        "file is free space that deletes left (0: never by itself). Commits wait while it copies (docs/retention.md)"
        ".",
    )
    archive: str | None = setting(
        "FLIGHTREC_ARCHIVE",
        None,
        "Where `flightrec archive` keeps the topics' raw records as Parquet files (a folder, or a URL such as "
        "`s3://bucket/prefix`), and where `flightrec replay` reads what the topics no longer hold "
        "(docs/retention.md).",
    )
    archive_keep_days: float | None = setting(
        "FLIGHTREC_ARCHIVE_KEEP_DAYS",
        None,
        "Days the archive keeps a file after its newest record (`forever`: the archive is the history). "
        "The database's retention does not apply to it.",
        shown="forever",
        parse=lambda text: parse_days("FLIGHTREC_ARCHIVE_KEEP_DAYS", text),
    )
    log_level: str = setting(
        "FLIGHTREC_LOG_LEVEL",
        "INFO",
        "Level of flightrec's own log on stderr (DEBUG, INFO, WARNING, ERROR). Kafka client (aiokafka) warnings "
        "and errors, such as refused credentials or an untrusted certificate, are shown once each; its INFO lines"
        " only at DEBUG.",
        parse=_upper,
    )

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, unusable: list[str] | None = None) -> Settings:
        """Read every FLIGHTREC_* variable; unset or empty ones take the default. A value that cannot be read raises
        ConfigError, or, given ``unusable``, takes the default and its message is appended there (the agent's
        `run`: a stage never waits on the agent's configuration)."""
        env = os.environ if env is None else env
        given: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            s: Setting = f.metadata["setting"]
            raw = _env(env, s.env)
            if raw is None:
                continue
            try:
                given[f.name] = _read(s.env, str(f.type), raw, f.metadata["parse"])
            except ConfigError as exc:
                if unusable is None:
                    raise
                unusable.append(str(exc))
        return cls(**given)

    def with_overrides(self, **flags: Any) -> Settings:
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
            raise ConfigError(
                f"cannot read FLIGHTREC_SASL_PASSWORD_FILE {self.sasl_password_file}: {exc.strerror}; "
                "point it at a readable file holding the password"
            ) from exc


def __getattr__(name: str) -> Any:
    """The topic names, from flightrec.schemas.topics (``from flightrec.settings import TOPICS`` keeps working)."""
    if name in _TOPIC_NAMES:
        from flightrec.schemas import topics

        return getattr(topics, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# Every setting flightrec reads from the environment, in the order docs/settings.md lists them.
SETTINGS: tuple[Setting, ...] = tuple(f.metadata["setting"] for f in dataclasses.fields(Settings))


def markdown() -> str:
    """docs/settings.md, made from the definitions (`make docs`; a test checks it is current)."""
    rows = "\n".join(f"| `{s.env}` | {f'`{s.default}`' if s.default else ''} | {s.help} |" for s in SETTINGS)
    return (
        "# Settings\n\nflightrec reads its configuration from flags first, then these environment\n"
        "variables, then the defaults below. Each is defined once, as a field of `Settings` in\n"
        "`src/flightrec/settings.py`; this page is made from those definitions (`make docs`).\n\n"
        "| variable | default | meaning |\n| --- | --- | --- |\n" + rows + "\n"
    )


if __name__ == "__main__":
    print(markdown(), end="")
