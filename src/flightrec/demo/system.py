"""`flightrec demo`: broker, materializer, dashboard and a simulated fleet on one machine.

Each simulated instance is a real process tree: `examples/entrypoint.sh` (shipped
in this package as ``entrypoint.sh``) run by
bash, every stage wrapped by `flightrec agent run`, the stage commands played by
`flightrec.demo.fleet` (which runs the real proving core for the benchmark). The
instances meet the fates real ones meet (see FLEET_PLAN); one is destroyed
mid-supervisor with its agent killed, while its broker connection is cut, and its
spooled events are delivered afterwards by `flightrec agent flush`. The demo plays
the manager too: a `rented` manager event per instance, `destroyed` for that one.

Guarantees: every process the demo starts is stopped when it ends, on Ctrl-C
(SIGINT), SIGTERM and SIGHUP alike; a broker that was already running is reused
and left running. The demo's broker is its own (port 9192 and data in the demo's
folder), so producers configured for the default localhost:9092 never write into
the demo's database. Progress counts this run's fleet only.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import IO

from flightrec.broker import LocalBroker
from flightrec.broker.roles import AGENT, OPERATOR, Role
from flightrec.db.query import run_query
from flightrec.demo.fleet import FATE_GPU, GPUS
from flightrec.errors import ConfigError, FlightrecError, QueryError
from flightrec.settings import Settings

log = logging.getLogger(__name__)
MANAGER_SOURCE = "manager@demo"
DEMO_HOST_ID = 41000  # simulated provider host ids (manager `rented` events), one per instance


# The first six instances meet the six failure fates (the destroyed one is healthy
# through its benchmark); every further instance is healthy.
FLEET_PLAN = ("destroyed", "no_kernel_image", "cuda_oom", "params_download", "too_slow", "daemon_signal")
# What each fate ends as, in the words the database and the README's table use: a failure class or a status.
FATE_ENDS_AS = {
    "no_kernel_image": "gpu_arch_unsupported",
    "cuda_oom": "cuda_out_of_memory",
    "params_download": "params_download_failed",
    "too_slow": "below_min_rate",
    "daemon_signal": "daemon_crashed",
    "destroyed": "destroyed (evidence incomplete)",
    "healthy": "finished",
}
# One minimum rate for the whole fleet, as an operator sets it. Healthy instances prove at
# k = 8 (on these CPUs several thousand proofs/hour); the "too slow" one plays a slow GPU with
# a proof 512 times larger (k = 17: about a thousand proofs/hour), so it falls below.
MIN_RATE = 2000.0
PROOF_K = {"too_slow": 17}
DEFAULT_PROOF_K = 8
DEAD_BOOTSTRAP = "127.0.0.1:9"  # the destroyed instance's network is cut: nothing listens there
DEMO_PORT = 9192  # not Kafka's usual 9092: only the demo's own fleet publishes to the demo's broker
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Stopped(KeyboardInterrupt):
    """Raised in the demo's main thread by SIGINT (Ctrl-C), SIGTERM or SIGHUP."""


class StopSignals:
    """SIGINT, SIGTERM and SIGHUP stop the demo whenever they come, and none is lost (a context manager).

    The handler notes the signal and raises :class:`Stopped` in the main thread. The note stays:
    where library code turns the exception into another one or swallows it (DuckDB turns it into
    ``RuntimeError: Query interrupted``; ``except BaseException`` blocks), the demo's loops
    :meth:`check` the note and stop all the same. Inside :meth:`held` the exception waits for
    the block's end (a child started but not yet recorded would be left running).

    While installed, SIGINT has this handler rather than Python's
    default one, so ``asyncio.run`` does not put in its own (that one only cancels the task: a
    coroutine that catches the cancellation, as ``except BaseException`` blocks do, would lose it).
    """

    def __init__(self) -> None:
        self.received: str | None = None
        self._held = 0
        self._previous: dict[int, object] = {}
        self._hook = sys.unraisablehook  # restored on exit

    def __enter__(self) -> StopSignals:
        self._hook = sys.unraisablehook
        sys.unraisablehook = self._unraisable
        self._previous = {sig: signal.signal(sig, self._handle) for sig in STOP_SIGNALS}
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)  # type: ignore[arg-type]  # restored as saved / set once the instance started
        sys.unraisablehook = self._hook

    def _unraisable(self, info: sys.UnraisableHookArgs) -> None:
        """A stop signal that landed in a callback Python cannot raise from (a weakref's, the garbage collector's):
        its exception is swallowed there and the signal acted on at the next check(), so no traceback is printed."""
        if isinstance(info.exc_value, Stopped):
            return
        self._hook(info)

    def _handle(self, signum: int, frame: object) -> None:
        if self.received is None:
            self.received = signal.Signals(signum).name
        if not self._held:
            raise Stopped(self.received)

    def check(self) -> None:
        """Raise :class:`Stopped` if a stop signal came (even one whose exception was swallowed)."""
        if self.received is not None and not self._held:
            raise Stopped(self.received)

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """A block a stop signal does not interrupt: it stops the demo as soon as the block ends."""
        self._held += 1
        try:
            yield
        finally:
            self._held -= 1
        self.check()

    def ignore(self) -> None:
        """From now on stop signals are ignored (the demo is stopping: a second one must not cut that short)."""
        for sig in STOP_SIGNALS:
            signal.signal(sig, signal.SIG_IGN)


@dataclass(frozen=True)
class Instance:
    """One simulated instance: its id, fate and GPU."""

    instance_id: str
    fate: str
    gpu: str


@dataclass
class Running:
    """A process the demo started, with the file its output goes to."""

    name: str
    proc: subprocess.Popen[bytes]
    log_path: Path
    output: IO[bytes] | None = None
    instance: Instance | None = None
    ended: bool = False


def plan_fleet(n: int) -> list[Instance]:
    """The fleet for ``n`` instances: the failure fates first, then healthy ones on varied GPUs."""
    fates = list(FLEET_PLAN[:n]) + ["healthy"] * max(0, n - len(FLEET_PLAN))
    out = []
    for i, fate in enumerate(fates):
        choices = FATE_GPU[fate]
        gpu = choices[i % len(choices)]
        out.append(Instance(f"{gpu}-{i + 1:02d}", fate, gpu))
    return out


def fleet_summary(fleet: list[Instance]) -> str:
    """What the fleet is meant to end as, in failure classes and statuses: "12 instances started, to end as: ..."."""
    counts: dict[str, int] = {}
    for inst in fleet:
        ends = FATE_ENDS_AS[inst.fate]
        counts[ends] = counts.get(ends, 0) + 1
    parts = [f"{n} {ends}" for ends, n in sorted(counts.items(), key=lambda kv: (kv[0] == "finished", kv[0]))]
    return f"{len(fleet)} instances started, to end as: {', '.join(parts)}"


def entrypoint() -> Path:
    """The example entrypoint each simulated instance runs, as shipped in this package
    (in a checkout, a link to examples/entrypoint.sh)."""
    path = Path(str(resources.files("flightrec.demo") / "entrypoint.sh"))
    if not path.is_file():
        raise FlightrecError(
            f"the demo's entrypoint {path} is missing from the installed package; "
            "reinstall flightrec (pip install --force-reinstall flightrec)"
        )
    return path


@dataclass
class Demo:
    """The demo's processes and paths; :meth:`run` drives it from start to end."""

    settings: Settings
    instances: int = 12
    fresh: bool = False
    headless: bool = False
    port: int = DEMO_PORT
    dashboard_port: int = 8501
    home: Path = field(default_factory=lambda: Path(".flightrec") / "demo")
    supervisor_seconds: float = 6.0
    security: str = "plaintext"  # or sasl_ssl: every process of the demo talks SCRAM-SHA-512 over TLS
    say: Callable[[str], None] = lambda line: print(line, flush=True)
    procs: list[Running] = field(default_factory=list)
    stops: StopSignals = field(default_factory=StopSignals)

    def __post_init__(self) -> None:
        self.home = Path(self.home).resolve()
        self.db = self.home / "flightrec.duckdb"
        self.broker = LocalBroker(port=self.port, data=self.home / "broker", settings=self.settings)
        self.started_broker = False
        self.py = sys.executable
        self.flightrec = str(Path(self.py).with_name("flightrec"))
        if not os.path.exists(self.flightrec):
            self.flightrec = shutil.which("flightrec") or "flightrec"

    # -- pieces -------------------------------------------------------------------

    def _env(self, role: Role = OPERATOR, **extra: str) -> dict[str, str]:
        """The environment of a demo process; on a SASL_SSL broker, with ``role``'s credential (the fleet's agents
        get the write-only agent role, as instances do)."""
        env = dict(os.environ)
        env.update(PYTHONSAFEPATH="1", PYTHONUNBUFFERED="1", FLIGHTREC_BOOTSTRAP=self.broker.bootstrap)
        if self.broker.security == "sasl_ssl":
            env.update(self.broker.secure.client_env(self.broker.bootstrap, role))
        env.update(extra)
        return env

    def _spawn(
        self,
        name: str,
        cmd: list[str],
        env: dict[str, str],
        instance: Instance | None = None,
        new_session: bool = False,
        log_path: Path | None = None,
    ) -> Running:
        log_path = log_path or self.home / "logs" / f"{name}.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.stops.held():  # started and recorded, or neither: stop() stops what is recorded
            out = log_path.open("ab")
            proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=self.home,
                start_new_session=new_session,
            )
            running = Running(name, proc, log_path, out, instance)
            self.procs.append(running)
        return running

    def _pause(self, seconds: float) -> None:
        """Sleep, then stop if a stop signal came meanwhile (or earlier, its exception swallowed)."""
        self.stops.check()
        time.sleep(seconds)
        self.stops.check()

    def start_broker(self) -> None:
        if self.fresh:
            self.broker.stop()
            shutil.rmtree(self.home, ignore_errors=True)
            self.broker = LocalBroker(port=self.port, data=self.home / "broker", settings=self.settings)
        if self.broker.security != self.security and (
            self.broker.status().running or (self.home / "broker" / "logs").exists()
        ):
            raise ConfigError(
                f"the demo's broker in {self.home / 'broker'} is {self.broker.security}; "
                f"run `flightrec demo --fresh --security {self.security}` to start over"
            )
        self.broker = LocalBroker(
            port=self.port, data=self.home / "broker", settings=self.settings, security=self.security
        )
        self.home.mkdir(parents=True, exist_ok=True)
        was_running = self.broker.status().running
        self.started_broker = not was_running  # before start(): a signal while it starts still stops it
        self.say(f"broker:       {self.broker.start()}")

    def start_materializer(self) -> None:
        self._spawn("materializer", [self.flightrec, "materialize", "--db", str(self.db)], self._env())
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            if self.procs[-1].proc.poll() is not None:
                raise FlightrecError(f"the materializer exited at start; see {self.home / 'logs' / 'materializer.log'}")
            try:
                run_query(self.db, "SELECT count(*) FROM instances")
                self.say(f"materializer: running, writing {self.db}")
                return
            except QueryError:
                self._pause(0.3)
        raise FlightrecError("the materializer did not come up within 90 s")

    def start_dashboard(self) -> None:
        self._spawn(
            "dashboard",
            [self.flightrec, "dashboard", "--db", str(self.db), "--port", str(self.dashboard_port)],
            self._env(),
        )
        self.say(f"dashboard:    http://localhost:{self.dashboard_port}  (starting)")

    def start_fleet(self, run_dir: Path) -> list[Instance]:
        script = entrypoint()
        fleet = plan_fleet(self.instances)
        for n, inst in enumerate(fleet):
            gpu = GPUS[inst.gpu]
            work = run_dir / inst.instance_id
            work.mkdir(parents=True, exist_ok=True)
            facts = work / "facts.json"
            facts.write_text(
                json.dumps(
                    {
                        "gpu_model": gpu.model,
                        "gpu_count": 1,
                        "gpu_memory_mib": gpu.memory_mib,
                        "driver_version": "570.133.07",
                        "cuda_version": "12.8",
                        "compute_capability": gpu.compute_capability,
                        "price_per_hour": gpu.price_per_hour,
                        "image": "prover:2026.11.3",
                        "attributes": {"meant_to_end_as": FATE_ENDS_AS[inst.fate], "simulated": "true"},
                    }
                )
            )
            fleet_cmd = f"{self.py} -m flightrec.demo.fleet"
            daemon_log = work / "prover-daemon.log"
            k = PROOF_K.get(inst.fate, DEFAULT_PROOF_K)
            destroyed = inst.fate == "destroyed"
            env = self._env(
                AGENT,
                FLIGHTREC_INSTANCE=inst.instance_id,
                FLIGHTREC_SPOOL=str(work / "spool"),
                FLIGHTREC_FACTS=str(facts),
                FLIGHTREC=self.flightrec,
                WORK=str(work),
                DAEMON_LOG=str(daemon_log),
                MIN_RATE=str(MIN_RATE),
                IMAGE="prover:2026.11.3",
                MANAGER_TOKEN="demo-secret-token",
                TUNNEL_CMD=f"{fleet_cmd} tunnel --fate {inst.fate}",
                REGISTER_CMD=f"{fleet_cmd} register --fate {inst.fate}",
                PARAMS_CMD=f"{fleet_cmd} params --fate {inst.fate}",
                BENCHMARK_CMD=f"{fleet_cmd} benchmark --fate {inst.fate} --log {daemon_log} --k {k} --proofs 2 "
                f"--min-rate {MIN_RATE:g}",
                SUPERVISOR_CMD=f"{fleet_cmd} supervisor --fate {inst.fate} "
                f"--seconds {600 if destroyed else self.supervisor_seconds}",
            )
            if destroyed:  # its network is cut: every event stays in its spool until flushed later
                env.update(FLIGHTREC_BOOTSTRAP=DEAD_BOOTSTRAP, FLIGHTREC_FLUSH_TIMEOUT="0.2")
            self.manager_event(
                inst.instance_id,
                "rented",
                f"{gpu.model} at ${gpu.price_per_hour:.2f}/hour",
                {
                    "gpu": inst.gpu,
                    "price_per_hour": f"{gpu.price_per_hour:.2f}",  # the Cost page
                    "host_id": str(DEMO_HOST_ID + n),
                },
            )
            self._spawn(
                inst.instance_id, ["bash", str(script)], env, inst, new_session=True, log_path=work / "console.log"
            )
            self._pause(0.3)  # a staggered start, as a real fleet comes up
        self.say(f"fleet:        {fleet_summary(fleet)}")
        return fleet

    # -- progress -----------------------------------------------------------------

    def progress(self, t0: float, fleet: list[Instance] | None = None, since_us: int = 0) -> str:
        """One line of progress, counting this run only: its instances, events at or after ``since_us``."""
        ids = [i.instance_id for i in fleet or []]
        try:
            rows = run_query(
                self.db,
                "SELECT coalesce(stage, '?') AS stage, coalesce(state, '?') AS state, "
                "count(*) AS n FROM instances WHERE list_contains(?, instance_id) "
                "AND last_event_us >= ? GROUP BY ALL ORDER BY ALL",
                [ids, since_us],
            ).to_pylist()
            lines = run_query(
                self.db,
                "SELECT count(*) AS n FROM log_lines WHERE list_contains(?, instance_id) AND ts_us >= ?",
                [ids, since_us],
            ).to_pylist()[0]["n"]
            fails = run_query(
                self.db,
                "SELECT count(*) AS n FROM failures WHERE list_contains(?, instance_id) AND ts_us >= ?",
                [ids, since_us],
            ).to_pylist()[0]["n"]
        except QueryError as exc:
            return f"[{time.monotonic() - t0:5.0f}s] waiting for the materializer ({exc})"
        by = ", ".join(f"{r['n']} {r['stage']}/{r['state']}" for r in rows) or "none seen yet"
        return f"[{time.monotonic() - t0:5.0f}s] instances: {by} | {lines} log lines, {fails} failures explained"

    def _destroy_when_supervising(self, running: Running) -> bool:
        """SIGKILL the destroyed instance's whole process tree once it is in its supervisor stage."""
        if running.ended or "supervisor: production proving" not in running.log_path.read_text(errors="replace"):
            return False
        self._pause(1.0)
        os.killpg(running.proc.pid, signal.SIGKILL)
        running.proc.wait()
        running.ended = True
        self.say(f"fleet:        {running.name} destroyed mid-supervisor (agent killed; events left in its spool)")
        self.manager_event(running.name, "destroyed", "host stopped answering mid-supervisor (simulated)")
        return True

    def manager_event(self, instance: str, kind: str, detail: str, attrs: dict[str, str] | None = None) -> None:
        """What the manager did, as `flightrec manager event` publishes it (from the demo's own manager spool)."""
        from flightrec.producer.manager import send_manager_event

        settings = dataclasses.replace(
            self.settings, bootstrap=self.broker.bootstrap, spool=str(self.home / "manager-spool")
        )
        try:
            send_manager_event(settings, instance, kind, detail, attrs, source=MANAGER_SOURCE)
        except FlightrecError as exc:  # the demo goes on; the event stays spooled
            log.warning("manager event %s for %s not sent: %s", kind, instance, exc)

    def _flush_spool(self, inst: Instance, run_dir: Path) -> None:
        spool = run_dir / inst.instance_id / "spool"
        r = subprocess.run(
            [
                self.flightrec,
                "agent",
                "flush",
                "--instance",
                inst.instance_id,
                "--spool",
                str(spool),
                "--timeout",
                "60",
            ],
            env=self._env(AGENT),
            capture_output=True,
            text=True,
        )
        self.say(
            f"fleet:        {inst.instance_id}'s spooled events delivered late by `flightrec agent flush` "
            f"(exit {r.returncode})"
        )
        for line in r.stdout.strip().splitlines()[-5:]:  # its own words, each on a line of its own
            self.say(f"              {line[:200]}")

    def wait_materialized(self, fleet: list[Instance], since_us: int, timeout: float = 120.0) -> None:
        """Wait until every instance of this run is in the database and every sealed one is complete."""
        deadline = time.monotonic() + timeout
        want = {i.instance_id for i in fleet if i.fate != "destroyed"}
        while time.monotonic() < deadline:
            try:  # rows of an earlier demo run (same instance ids) do not count
                rows = run_query(
                    self.db, "SELECT instance_id, complete FROM instances WHERE last_event_us >= ?", [since_us]
                ).to_pylist()
                done = {r["instance_id"] for r in rows if r["complete"]}
                seen = {r["instance_id"] for r in rows}
                if want <= done and {i.instance_id for i in fleet} <= seen:
                    return
            except QueryError:
                pass
            self._pause(0.5)
        raise FlightrecError(
            f"the fleet's events were not all materialized within {timeout:.0f} s; "
            f"see {self.home / 'logs'} and each instance's console.log"
        )

    def summary(self, fleet: list[Instance]) -> None:
        ids = [i.instance_id for i in fleet]
        from flightrec.db.views import VIEWS

        rows = run_query(
            self.db,
            """
            SELECT i.instance_id, i.gpu_model, i.status, i.complete, round(i.proofs_per_hour) AS proofs_per_hour,
                   string_agg(f.failure_class, ',') AS classes
            FROM fleet i LEFT JOIN failures f ON f.instance_id = i.instance_id AND f.boot_id = i.boot_id
            WHERE list_contains(?, i.instance_id) GROUP BY ALL ORDER BY i.instance_id""",
            [ids],
            prelude=VIEWS,
        ).to_pylist()
        self.say("")
        self.say(f"{'instance':18} {'gpu':32} {'status':14} {'complete':9} {'proofs/h':>9}  failure class")
        for r in rows:
            self.say(
                f"{r['instance_id']:18} {r['gpu_model'] or '?':32} {r['status'] or '?':14} "
                f"{str(r['complete']):9} {r['proofs_per_hour'] or 0:9.0f}  {r['classes'] or ''}"
            )

    # -- the whole run --------------------------------------------------------------

    def run(self) -> int:
        """Run the demo; every process it started is stopped when it ends, however it ends."""
        with self.stops:
            try:
                return self._run()
            except KeyboardInterrupt as exc:
                self.stops.ignore()  # a second signal must not cut the stopping short
                self.say(f"\nstopping ({exc or 'SIGINT'}) ...")
                return 0
            except Exception:
                if self.stops.received is None:
                    raise
                # a stop signal that library code turned into another exception (DuckDB: "Query interrupted")
                self.stops.ignore()
                self.say(f"\nstopping ({self.stops.received}) ...")
                return 0
            finally:
                self.stops.ignore()
                self.stop()

    def _run(self) -> int:
        t0, since_us = time.monotonic(), time.time_ns() // 1000
        run_dir = self.home / "runs" / time.strftime("%Y%m%d-%H%M%S")
        self.start_broker()
        self.stops.check()
        self.start_materializer()
        if not self.headless:
            self.start_dashboard()
        fleet = self.start_fleet(run_dir)
        last = 0.0
        destroyed = [r for r in self.procs if r.instance and r.instance.fate == "destroyed"]
        while any(r.instance and r.proc.poll() is None for r in self.procs):
            for r in destroyed:
                self._destroy_when_supervising(r)
            if time.monotonic() - last >= 3:
                self.say(self.progress(t0, fleet, since_us))
                last = time.monotonic()
            self._pause(0.3)
        for r in destroyed:
            self._pause(2.0)  # the evidence arrives later, as it would from a recovered disk
            self._flush_spool(r.instance, run_dir)  # type: ignore[arg-type]  # restored as saved / set once the instance started
        self.wait_materialized(fleet, since_us)
        self.say(self.progress(t0, fleet, since_us))
        self.summary(fleet)
        self.say(f"\nthe whole fleet is materialized in {self.db}  ({time.monotonic() - t0:.0f} s)")
        if self.headless:
            return 0
        self.say(f"dashboard:    http://localhost:{self.dashboard_port}   (Ctrl-C stops everything the demo started)")
        while True:
            self._pause(1.0)

    def stop(self) -> None:
        """Stop every process the demo started (instances, dashboard, materializer), then its broker."""
        for r in reversed(self.procs):
            if r.proc.poll() is None:
                try:
                    if r.instance:
                        os.killpg(r.proc.pid, signal.SIGTERM)
                    else:
                        r.proc.send_signal(signal.SIGINT if r.name == "materializer" else signal.SIGTERM)
                except ProcessLookupError:
                    pass
        for r in reversed(self.procs):
            try:
                r.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                r.proc.kill()
                r.proc.wait()
            if r.instance:  # the whole tree: children that outlive the entrypoint's bash too
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(r.proc.pid, signal.SIGKILL)
            if r.output:
                r.output.close()
        if self.started_broker:
            self.say(self.broker.stop())
        else:
            self.say(f"broker left running on {self.broker.bootstrap} (it was running before the demo)")
