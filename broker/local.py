"""Run one local single-node Kafka (KRaft combined mode) from Kafka's own jars."""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import os
import re
import shutil
import signal
import subprocess
import time
import uuid
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from flightrec.broker.roles import ADMIN, GRANTS, Role, fingerprint, quota_args, user_args
from flightrec.broker.secure import MECHANISM, SECURITIES, Secure
from flightrec.broker.topics import answering_cluster, answers_metadata, ensure_topics

from flightrec.errors import BrokerError
from flightrec.localservice import LOG_TAIL_LINES, free_port, log_tail, pid_alive, port_free  # noqa: F401 - free_port: tests import it from here
from flightrec.settings import Settings

_POM = resources.files("flightrec.broker") / "pom.xml"
KAFKA_VERSION = re.search(r"<kafka.version>([^<]+)</kafka.version>", _POM.read_text("utf-8")).group(1)  # type: ignore[union-attr]  # the shipped pom.xml names both versions
SLF4J_VERSION = re.search(r"<slf4j.version>([^<]+)</slf4j.version>", _POM.read_text("utf-8")).group(1)  # type: ignore[union-attr]  # the shipped pom.xml names both versions


_START_MARK = "=== flightrec starting Kafka"
ACL_COMMAND = "org.apache.kafka.tools.AclCommand"  # kafka-acls.sh
CONFIG_COMMAND = "kafka.admin.ConfigCommand"  # kafka-configs.sh
_LOG_LINE = re.compile(r"^\[[^\]]+\] (ERROR|FATAL) (.*?)(?: \([\w.$]+\))?$")
_EXCEPTION = re.compile(r"^(?:Caused by: )?[\w.$]+(?:Exception|Error): (.+)$")


def log_cause(text: str) -> str:
    """The first ERROR of Kafka's log since our last start, with the exception message under it ("" if none).

    Pure. Kafka prints ``[time] ERROR message (logger)`` and, on the next line, the exception's class and
    message; both together name the real cause in one line.
    """
    at = text.rfind(_START_MARK)
    lines = text[at:].splitlines() if at >= 0 else text.splitlines()
    for i, line in enumerate(lines):
        m = _LOG_LINE.match(line)
        if not m:
            continue
        cause = m.group(2).strip()
        nxt = _EXCEPTION.match(lines[i + 1].strip()) if i + 1 < len(lines) else None
        if nxt and nxt.group(1) not in cause:
            cause = f"{cause}: {nxt.group(1).strip()}"
        return cause[:500]
    return ""


def check_java() -> str:
    """Return the java executable if it is Java >= 17; else raise BrokerError saying what to install."""
    java = shutil.which(
        "java",
        path=(os.environ.get("JAVA_HOME", "") + "/bin:" if os.environ.get("JAVA_HOME") else "")
        + os.environ.get("PATH", ""),
    )
    if not java:
        raise BrokerError("Java not found: Kafka 4 needs Java >= 17 (install openjdk-17-jre-headless or set JAVA_HOME)")
    out = subprocess.run([java, "-version"], capture_output=True, text=True).stderr
    m = re.search(r'version "(\d+)(?:\.(\d+))?', out)
    if not m:
        raise BrokerError(f"cannot read the Java version from `java -version`: {out.strip()[:200]}")
    major = int(m.group(1)) if m.group(1) != "1" else int(m.group(2) or 0)
    if major < 17:
        raise BrokerError(f"Java {major} found at {java}: Kafka 4 needs Java >= 17 (set JAVA_HOME to a newer JDK)")
    return java


def kafka_libs_dir(settings: Settings | None = None) -> Path:
    """Where Kafka's jars live: FLIGHTREC_KAFKA_LIBS, else <FLIGHTREC_CACHE>/kafka/<version>/libs.

    Nothing here depends on where the package is installed; a checkout's make and tests
    set FLIGHTREC_CACHE to its ``.cache``."""
    settings = settings or Settings.from_env()
    if settings.kafka_libs:
        return Path(settings.kafka_libs)
    return Path(settings.cache).expanduser() / "kafka" / KAFKA_VERSION / "libs"


def _libs_complete(libs: Path) -> bool:
    """The folder holds Kafka's jars and exactly the pinned slf4j API (an older one silences the broker's log)."""
    slf4j = sorted(p.name for p in libs.glob("slf4j-api-*.jar")) if libs.is_dir() else []
    return (
        (libs / f"kafka_2.13-{KAFKA_VERSION}.jar").exists()
        and (libs / f"kafka-tools-{KAFKA_VERSION}.jar").exists()
        and slf4j == [f"slf4j-api-{SLF4J_VERSION}.jar"]
    )


def fetch_kafka(settings: Settings | None = None, quiet: bool = True) -> Path:
    """Copy Kafka's jars from Maven Central into the cache folder once; return that folder."""
    libs = kafka_libs_dir(settings)
    if _libs_complete(libs):
        return libs
    mvn = shutil.which("mvn")
    if not mvn:
        raise BrokerError("Maven (mvn) not found: it fetches Kafka's jars from Maven Central; install maven")
    libs.parent.mkdir(parents=True, exist_ok=True)
    for stale in libs.glob("*.jar") if libs.is_dir() else ():  # jars of an older pom must not stay on the classpath
        stale.unlink()
    cmd = [mvn, "-B", "-f", str(_POM), "dependency:copy-dependencies", f"-Dkafka.libs={libs}"]
    if quiet:
        cmd.insert(2, "-q")
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0 or not _libs_complete(libs):
        tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-LOG_TAIL_LINES:])
        raise BrokerError(
            f"Maven could not fetch Kafka {KAFKA_VERSION} (exit {proc.returncode}); is Maven Central reachable?", tail
        )
    return libs


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode("utf-8", "replace")
    except OSError:
        return ""


def _argv(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return [a.decode("utf-8", "replace") for a in f.read().split(b"\0") if a]
    except OSError:
        return []


def _listens_on(config: Path, port: int) -> bool:
    """Whether the server.properties at ``config`` has a client listener (not the controller's) on ``port``."""
    try:
        text = config.read_text()
    except OSError:
        return False
    m = re.search(r"^listeners=(.*)$", text, re.MULTILINE)
    entries = m.group(1).split(",") if m else []
    return any(not e.startswith("CONTROLLER:") and e.rsplit(":", 1)[-1].strip() == str(port) for e in entries)


def data_on_port(port: int) -> Path | None:
    """The data folder of the broker flightrec started that listens on ``port`` (whatever ``--data`` it was given),
    read from the running Kafka processes' own configuration; None when no such broker runs."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        argv = _argv(int(entry))
        if "kafka.Kafka" not in argv or not argv[-1].endswith("server.properties"):
            continue
        config = Path(argv[-1])
        try:  # flightrec's pid file names it, and it is this user's (another user's broker cannot be stopped)
            ours = int((config.parent / "broker.pid").read_text().strip()) == int(entry)
            ours = ours and os.stat(f"/proc/{entry}").st_uid == os.getuid()
        except (OSError, ValueError):
            ours = False
        if ours and _listens_on(config, port):
            return config.parent
    return None


@dataclass(frozen=True)
class BrokerStatus:
    """What `flightrec broker status` reports."""

    running: bool
    answering: bool
    pid: int | None
    port: int
    data: str
    version: str = KAFKA_VERSION

    def line(self) -> str:
        if self.running:
            state = "running and answering" if self.answering else "running but not answering yet"
            return f"Kafka {self.version} {state} on localhost:{self.port} (pid {self.pid}, data {self.data})"
        return f"no broker running for data {self.data} (port {self.port})"


class LocalBroker:
    """A single-node Kafka in KRaft combined mode (broker + controller in one JVM).

    Guarantees: ``start`` returns only once the broker answers metadata requests
    and the flightrec topics exist, and is a no-op when this broker already runs;
    ``stop`` waits until the process is gone. Failures raise BrokerError with a
    one-line cause and the tail of the broker's own log.
    """

    def __init__(
        self,
        port: int = 9092,
        data: str | Path | None = None,
        settings: Settings | None = None,
        heap: str = "512m",
        security: str | None = None,
    ) -> None:
        self.settings = settings or Settings.from_env()
        self.port = port
        self.data = Path(data) if data else Path(self.settings.home) / f"broker-{port}"
        self.data = self.data.resolve()
        self.heap = heap
        self._proc: subprocess.Popen[bytes] | None = None
        formatted = self._formatted_security()
        if security is not None and security not in SECURITIES:
            raise BrokerError(f"--security {security!r} is not one of {', '.join(SECURITIES)}")
        if security is not None and formatted is not None and security != formatted:
            raise BrokerError(
                f"the data folder {self.data} holds a {formatted} broker; choose another --data for a {security} one"
            )
        self.security = security or formatted or "plaintext"
        self.secure = Secure(self.data)

    @classmethod
    def on_port(cls, port: int, settings: Settings | None = None) -> LocalBroker:
        """The broker for ``port`` when no ``--data`` is given: the default data folder's, else the one flightrec
        started on that port with its data elsewhere. BrokerError when another process holds the port."""
        default = cls(port=port, settings=settings)
        if default.running_pid() is not None:
            return default
        found = data_on_port(port)
        if found is not None:
            return cls(port=port, data=found, settings=settings)
        if not port_free(port):
            raise BrokerError(
                f"port {port} is in use, but not by a broker flightrec started with data {default.data} or any "
                "other data folder it can see: give the broker's own --data DIR (the folder it was started with)"
            )
        return default

    def running_pid(self) -> int | None:
        """The pid of this data folder's broker when it runs, else None."""
        return self._pid()

    def _formatted_security(self) -> str | None:
        try:
            return (self.data / "security").read_text().strip() or None
        except OSError:
            return "plaintext" if (self.data / "logs" / "meta.properties").exists() else None

    @property
    def client_settings(self) -> Settings:
        """Settings for a client of this broker (bootstrap, and SASL_SSL where it requires it)."""
        base = dataclasses.replace(self.settings, bootstrap=self.bootstrap)
        if self.security == "sasl_ssl":
            return self.secure.client_settings(base, self.bootstrap)
        return dataclasses.replace(base, security_protocol="PLAINTEXT")

    @property
    def bootstrap(self) -> str:
        return f"localhost:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.data / "broker.log"

    @property
    def _pid_path(self) -> Path:
        return self.data / "broker.pid"

    def _pid(self) -> int | None:
        try:
            pid = int(self._pid_path.read_text().strip())
        except (OSError, ValueError):
            return None
        if pid_alive(pid) and str(self.data) in _cmdline(pid):
            return pid
        return None

    def _kafka_kwargs(self) -> dict[str, object]:
        """What ``broker start`` itself connects as: the super user on a SASL_SSL broker (it creates the topics)."""
        if self.security == "sasl_ssl":
            self.secure.password(ADMIN)  # a folder from before the roles: its super user's password moves first
            return self.secure.client_settings(self.client_settings, self.bootstrap, ADMIN).kafka_kwargs()
        return self.client_settings.kafka_kwargs()

    def status(self) -> BrokerStatus:
        pid = self._pid()
        answering = bool(pid) and asyncio.run(answers_metadata(self._kafka_kwargs(), timeout=2.0))
        return BrokerStatus(running=pid is not None, answering=answering, pid=pid, port=self.port, data=str(self.data))

    # -- configuration ----------------------------------------------------

    def _controller_port(self) -> int:
        path = self.data / "controller.port"
        try:
            port = int(path.read_text())
            if port_free(port):
                return port
        except (OSError, ValueError):
            pass
        port = free_port()
        path.write_text(str(port))
        return port

    def _write_config(self) -> Path:
        self.data.mkdir(parents=True, exist_ok=True)
        cport = self._controller_port()
        props = {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.voters": f"1@127.0.0.1:{cport}",
            "listeners": f"PLAINTEXT://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{cport}",
            "advertised.listeners": f"PLAINTEXT://localhost:{self.port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "log.dirs": str(self.data / "logs"),
            "num.partitions": str(self.settings.partitions),
            "auto.create.topics.enable": "false",
            "log.retention.ms": str(self.settings.retention_ms),
            "log.retention.bytes": "-1",
            "offsets.topic.replication.factor": "1",
            "offsets.topic.num.partitions": "6",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "share.coordinator.state.topic.replication.factor": "1",
            "share.coordinator.state.topic.min.isr": "1",
            "group.initial.rebalance.delay.ms": "0",
            # no raised message.max.bytes: Kafka's stock limits, as on any real cluster
        }
        if self.security == "sasl_ssl":
            self.secure.make_certificates()
            props.update(self.secure.server_properties(self.port, cport))
        path = self.data / "server.properties"
        # 0600: a SASL_SSL broker's file holds the super user's password (its JAAS settings)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write("".join(f"{k}={v}\n" for k, v in props.items()))
        path.chmod(0o600)
        (self.data / "log4j2.properties").write_text(
            "status = warn\n"
            "appender.console.type = Console\nappender.console.name = STDOUT\n"
            "appender.console.layout.type = PatternLayout\n"
            "appender.console.layout.pattern = [%d] %p %m (%c)%n\n"
            "rootLogger.level = INFO\nrootLogger.appenderRef.stdout.ref = STDOUT\n"
            "logger.request.name = kafka.request.logger\nlogger.request.level = WARN\n"
        )
        return path

    def _java(self, java: str, libs: Path, main: str, *args: str, heap: str = "256m") -> list[str]:
        return [
            java,
            f"-Xmx{heap}",
            "-Xss1m",
            "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={self.data / 'log4j2.properties'}",
            "-cp",
            f"{libs}/*",
            main,
            *args,
        ]

    def _format(self, java: str, libs: Path, config: Path, cluster_id: str | None = None) -> None:
        if (self.data / "logs" / "meta.properties").exists():
            return
        cluster_id = cluster_id or base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        extra = self.secure.format_args() if self.security == "sasl_ssl" else []
        cmd = self._java(
            java, libs, "kafka.tools.StorageTool", "format", f"--cluster-id={cluster_id}", "-c", str(config), *extra
        )
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise BrokerError(
                f"formatting the KRaft storage in {self.data / 'logs'} failed (exit {proc.returncode})",
                "\n".join((proc.stdout + proc.stderr).splitlines()[-LOG_TAIL_LINES:]),
            )
        if self.security == "sasl_ssl":
            self.secure.record_users()
        (self.data / "security").write_text(self.security + "\n")

    def _started(self, what: str) -> str:
        if self.security != "sasl_ssl":
            return what
        client, *others = self.secure.write_env_files(self.bootstrap)
        return (
            f"{what}; SASL_SSL ({MECHANISM}) with ACLs: client settings in {client} (`source` it); "
            + ", ".join(str(p) for p in others)
            + " for the other roles (docs/security.md)"
        )

    # -- lifecycle ----------------------------------------------------------

    def start(self, timeout: float = 90.0) -> str:
        """Start the broker (fetching Kafka first if needed) and create the topics. Returns what happened."""
        if self.security == "sasl_ssl":
            quota_args(self.settings.agent_byte_rate)  # a wrong FLIGHTREC_AGENT_BYTE_RATE is said before anything runs
        pid = self._pid()
        if pid is not None and asyncio.run(answers_metadata(self._kafka_kwargs())):
            self._ensure_topics()
            self._apply_roles()
            return self._started(f"Kafka already running on {self.bootstrap} (pid {pid}, data {self.data})")
        java = check_java()
        if not port_free(self.port):
            raise BrokerError(f"port {self.port} is in use by another process; choose another with --port")
        libs = fetch_kafka(self.settings)
        config = self._write_config()
        self._format(java, libs, config)
        with open(self.log_path, "ab") as log_file:
            log_file.write(
                f"\n=== flightrec starting Kafka {KAFKA_VERSION} on port {self.port} at {time.ctime()} ===\n".encode()
            )
            log_file.flush()
            cmd = self._java(java, libs, "kafka.Kafka", str(config), heap=self.heap)
            cmd[1:1] = [f"-Xms{self.heap}", "-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20"]
            self._proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                cwd=self.data,
                start_new_session=True,
            )
        self._pid_path.write_text(str(self._proc.pid))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                tail = log_tail(self.log_path, 400)
                cause = log_cause(tail)
                raise BrokerError(
                    f"the Kafka broker exited with code {self._proc.returncode} while starting"
                    + (f": {cause}" if cause else " (its log names no cause)"),
                    "\n".join(tail.splitlines()[-LOG_TAIL_LINES:]),
                )
            if self._answering_is_ours():  # answers, and is this broker (not one that took the port)
                self._ensure_topics()
                self._apply_roles(java, libs)
                return self._started(
                    f"Kafka {KAFKA_VERSION} started on {self.bootstrap} (pid {self._proc.pid}, data {self.data})"
                )
            time.sleep(0.3)
        self.stop()
        tail = log_tail(self.log_path, 400)
        cause = log_cause(tail)
        raise BrokerError(
            f"the Kafka broker did not answer on {self.bootstrap} within {timeout:.0f}s"
            + (f"; its log says: {cause}" if cause else ""),
            "\n".join(tail.splitlines()[-LOG_TAIL_LINES:]),
        )

    def _cluster_id(self) -> str | None:
        """The cluster id this broker's storage was formatted with (logs/meta.properties); None before formatting."""
        try:
            text = (self.data / "logs" / "meta.properties").read_text()
        except OSError:
            return None
        m = re.search(r"^cluster\.id=(\S+)", text, re.MULTILINE)
        return m.group(1) if m else None

    def _answering_is_ours(self) -> bool:
        """Whether the broker answering on the port is this one (same cluster id); False when that cannot be told
        yet. Raises BrokerError (this broker stopped) when another cluster answers: the port was free when checked
        and another broker took it before this one could listen (a busy machine starting brokers at once)."""
        theirs = asyncio.run(answering_cluster(self._kafka_kwargs(), timeout=2.0))
        ours = self._cluster_id()
        if theirs is None or ours is None:
            return False
        if theirs != ours:
            self.stop()
            raise BrokerError(
                f"another Kafka (cluster {theirs}, not this broker's {ours}) took port {self.port} "
                "while this broker was starting; start it again, on another port (--port)"
            )
        return True

    # -- roles (SASL_SSL): ACLs and quotas through Kafka's own tools -------------------------------------

    @property
    def _roles_marker(self) -> Path:
        return self.data / "roles.applied"

    def kafka_tool(
        self, main: str, *args: str, role: Role = ADMIN, java: str | None = None, libs: Path | None = None
    ) -> list[str]:
        """The command line of one of Kafka's own admin tools (``main``: its class) against this broker, connecting
        as ``role`` (the super user unless told): ``--bootstrap-server`` and a 0600 ``--command-config``."""
        java = java or check_java()
        libs = libs or fetch_kafka(self.settings)
        cmd = self._java(java, libs, main, "--bootstrap-server", self.bootstrap, *args, heap="96m")
        quiet = self.data / "tools-log4j2.properties"  # a tool's own INFO lines would bury its answer
        if not quiet.exists():
            quiet.write_text(
                "status = warn\nappender.console.type = Console\nappender.console.name = STDERR\n"
                "appender.console.target = SYSTEM_ERR\nappender.console.layout.type = PatternLayout\n"
                "appender.console.layout.pattern = [%d] %p %m (%c)%n\n"
                "rootLogger.level = WARN\nrootLogger.appenderRef.stderr.ref = STDERR\n"
            )
        cmd[1:1] = ["-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC", "-Xshare:auto"]  # a short-lived JVM: start fast
        cmd[cmd.index(f"-Dlog4j2.configurationFile={self.data / 'log4j2.properties'}")] = (
            f"-Dlog4j2.configurationFile={quiet}"
        )
        if self.security == "sasl_ssl":
            cmd += ["--command-config", str(self.secure.command_config(role))]
        return cmd

    def _apply_roles(self, java: str | None = None, libs: Path | None = None) -> None:
        """On a SASL_SSL broker: create the SCRAM users its metadata lacks, the ACLs of every role and the agents'
        produce quota, all at once (one JVM each, in parallel), unless the marker says they are in place."""
        if self.security != "sasl_ssl":
            return
        wanted = fingerprint(self.settings.agent_byte_rate)
        try:
            if self._roles_marker.read_text().strip() == wanted and not self.secure.missing_users():
                return
        except OSError:
            pass
        java = java or check_java()
        libs = libs or fetch_kafka(self.settings)
        missing = self.secure.missing_users()
        cmds = [self.kafka_tool(ACL_COMMAND, *g.acl_args(), java=java, libs=libs) for g in GRANTS]
        cmds.append(self.kafka_tool(CONFIG_COMMAND, *quota_args(self.settings.agent_byte_rate), java=java, libs=libs))
        for role in missing:
            args = user_args(role, MECHANISM, self.secure.password(role))
            cmds.append(self.kafka_tool(CONFIG_COMMAND, *args, java=java, libs=libs))
        procs = [
            subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
            for cmd in cmds
        ]
        failed = []
        deadline = time.monotonic() + 120
        for cmd, proc in zip(cmds, procs, strict=True):
            try:
                out, _ = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                for p in procs:
                    p.kill()
                    p.wait()
                raise BrokerError(
                    "Kafka's tools did not set the broker's ACLs and quotas within 120 s; start the broker again "
                    f"to retry (its log: {self.log_path})"
                ) from None
            if proc.returncode != 0:
                what = " ".join(a for a in cmd[cmd.index("--bootstrap-server") + 2 :] if "password=" not in a)
                failed.append((what, proc.returncode, out.decode("utf-8", "replace")))
        if failed:
            what, code, said = failed[0]
            tail = "\n".join(said.splitlines()[-LOG_TAIL_LINES:])
            if "SecurityDisabledException" in said:  # running since before the roles: no authorizer loaded
                raise BrokerError(
                    f"the broker on {self.bootstrap} runs without an authorizer (started before its roles existed): "
                    f"restart it (`flightrec broker stop --port {self.port}`, then start) to load its ACLs",
                    tail,
                )
            raise BrokerError(
                f"setting the broker's ACLs and quotas failed (exit {code}) for: {what[:300]}; "
                f"start the broker again to retry",
                tail,
            )
        self.secure.record_users(missing)
        self._roles_marker.write_text(wanted + "\n")

    def _ensure_topics(self) -> list[str]:
        return asyncio.run(
            ensure_topics(
                self._kafka_kwargs(),
                partitions=self.settings.partitions,
                replication=1,
                retention_ms=self.settings.retention_ms,
            )
        )

    def stop(self, timeout: float = 60.0) -> str:
        """Stop the broker cleanly (SIGTERM, then SIGKILL after ``timeout``) and wait until it is gone."""
        pid = self._pid()
        if pid is None and self._proc is not None and self._proc.poll() is None:
            pid = self._proc.pid  # started here, its pid file not written yet (a signal came in between)
        if pid is None:
            return f"no broker running for data {self.data}"
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self._still_running(pid):
            time.sleep(0.1)
        how = "stopped"
        if self._still_running(pid):
            os.kill(pid, signal.SIGKILL)
            while self._still_running(pid):
                time.sleep(0.05)
            how = f"killed (did not stop within {timeout:.0f}s)"
        self._pid_path.unlink(missing_ok=True)
        return f"Kafka on {self.bootstrap} {how} (data {self.data})"

    def _still_running(self, pid: int) -> bool:
        if self._proc is not None and self._proc.pid == pid:
            return self._proc.poll() is None
        return pid_alive(pid)
