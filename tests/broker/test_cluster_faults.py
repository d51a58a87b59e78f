"""A three-node cluster's everyday faults while real agents write and a real materializer folds: nothing lost or
doubled, the materializer goes on, the stages keep their exit codes, and sealed boots open `wait-sealed`."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import pytest
from cluster_helpers import heal, leader_for, node_log, partition_of

from flightrec.broker.cluster import LocalCluster
from flightrec.db.query import run_query
from flightrec.errors import QueryError
from flightrec.settings import Settings

pytestmark = [pytest.mark.integration, pytest.mark.slow]

FLIGHTREC = str(Path(sys.executable).parent / "flightrec")
LINES = 1500  # per writer: a few seconds of output (the stage sleeps 0.25 s every 100 lines)
STAGE_CODE = 3  # the stage's own exit code, which the agent must pass on
STAGE = (
    "import sys, time\n"
    f"for i in range({LINES}):\n"
    "    print(f'fault stream line {i}', flush=True)\n"
    "    if i % 100 == 99:\n"
    "        time.sleep(0.25)\n"
    f"sys.exit({STAGE_CODE})\n"
)
FLUSH_TIMEOUT = 10  # FLIGHTREC_FLUSH_TIMEOUT of the writers: the documented bound on what an exiting agent waits
SLACK_S = 20  # a loaded 2-core machine: start-up of python and the agent, on top of the stage and the flush bound


@pytest.fixture
def cluster(kafka_cluster: LocalCluster) -> Iterator[LocalCluster]:
    """The module's cluster, healed (every node up, every partition with 3 in-sync replicas) before each test."""
    heal(kafka_cluster)
    yield kafka_cluster


@dataclass
class Writer:
    """One instance: `flightrec agent run` of a stage printing LINES numbered lines, with its own spool."""

    cluster: LocalCluster
    tmp: Path
    instance: str
    proc: subprocess.Popen[bytes] | None = None
    started: float = 0.0
    ended: float = 0.0
    stderr: str = ""

    @property
    def spool(self) -> Path:
        return self.tmp / f"spool-{self.instance}"

    def env(self) -> dict[str, str]:
        return dict(
            os.environ,
            FLIGHTREC_BOOTSTRAP=self.cluster.bootstrap,
            FLIGHTREC_SPOOL=str(self.spool),
            FLIGHTREC_INSTANCE=self.instance,
            FLIGHTREC_FLUSH_TIMEOUT=str(FLUSH_TIMEOUT),
            FLIGHTREC_FACTS="",
            FLIGHTREC_LOG_LEVEL="WARNING",
        )

    def start(self) -> None:
        self.started = time.monotonic()
        self.proc = subprocess.Popen(
            [FLIGHTREC, "agent", "run", "--instance", self.instance, "--stage", "work", "--", sys.executable, "-c"]
            + [STAGE],
            env=self.env(),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )

    def wait(self, timeout: float = 120) -> int:
        assert self.proc is not None
        _, err = self.proc.communicate(timeout=timeout)
        self.ended = time.monotonic()
        self.stderr = err.decode("utf-8", "replace")
        return self.proc.returncode

    def agent(self, action: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [FLIGHTREC, "agent", action, "--instance", self.instance, *args],
            env=self.env(),
            capture_output=True,
            text=True,
            timeout=timeout,
        )


def writers_on_one_partition(cluster: LocalCluster, tmp: Path, n: int = 2) -> list[Writer]:
    """``n`` writers whose instance ids go to the same partition (so one leader serves them all)."""
    partitions = Settings.from_env({}).partitions
    by_partition: dict[int, list[str]] = {}
    while True:
        instance = f"i-fault-{uuid.uuid4().hex[:10]}"
        ids = by_partition.setdefault(partition_of(instance.encode(), partitions), [])
        ids.append(instance)
        if len(ids) == n:
            return [Writer(cluster, tmp, i) for i in ids]


@dataclass
class Materializer:
    """`flightrec materialize` on a DuckDB file, reading the whole cluster."""

    cluster: LocalCluster
    db: Path
    proc: subprocess.Popen[bytes] = field(init=False)

    def __post_init__(self) -> None:
        env = dict(os.environ, FLIGHTREC_BOOTSTRAP=self.cluster.bootstrap, FLIGHTREC_LOG_LEVEL="WARNING")
        self.proc = subprocess.Popen(
            [FLIGHTREC, "materialize", "--db", str(self.db)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )

    def alive(self) -> None:
        if self.proc.poll() is not None:
            raise AssertionError(f"the materializer stopped ({self.proc.returncode}): {self.proc.communicate()[1]!r}")

    def lines(self, instance: str) -> tuple[int, int]:
        """(lines stored, distinct lines stored) of ``instance``."""
        try:
            row = run_query(
                self.db,
                "SELECT count(*) AS n, count(DISTINCT text) AS d FROM log_lines WHERE instance_id = ?",
                [instance],
            ).to_pylist()[0]
        except QueryError:
            return (0, 0)
        return (row["n"], row["d"])

    def wait_lines(self, instance: str, timeout: float = 120) -> float:
        """Seconds until all LINES lines of ``instance`` are stored (the materializer alive all along)."""
        t0 = time.monotonic()
        got = (0, 0)
        while time.monotonic() - t0 < timeout:
            self.alive()
            got = self.lines(instance)
            if got[0] >= LINES:
                return time.monotonic() - t0
            time.sleep(0.3)
        raise AssertionError(f"{instance}: {got[0]} of {LINES} lines stored after {timeout:.0f}s")

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        _, err = self.proc.communicate(timeout=60)
        assert self.proc.returncode == 0, err.decode()


def check_exactly_once(m: Materializer, w: Writer) -> None:
    """Every line of the stage stored once, its exit once with the stage's code, the boot complete."""
    rows = run_query(m.db, "SELECT text FROM log_lines WHERE instance_id = ?", [w.instance]).to_pylist()
    texts = sorted(r["text"] for r in rows)
    assert texts == sorted(f"fault stream line {i}" for i in range(LINES)), (
        f"{w.instance}: {len(texts)} lines stored, {len(set(texts))} distinct, of {LINES}"
    )
    exits = run_query(m.db, "SELECT exit_code FROM process_exits WHERE instance_id = ?", [w.instance]).to_pylist()
    assert exits == [{"exit_code": STAGE_CODE}]
    done = subprocess.run(
        [FLIGHTREC, "wait-sealed", w.instance, "--db", str(m.db), "--timeout", "60"],
        env=dict(os.environ, FLIGHTREC_BOOTSTRAP=m.cluster.bootstrap),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    dup = run_query(
        m.db,
        "SELECT count(*) AS n, count(DISTINCT seq) AS d FROM lifecycle_events WHERE instance_id = ?",
        [w.instance],
    ).to_pylist()[0]
    assert dup["n"] == dup["d"], f"{w.instance}: lifecycle events stored twice: {dup}"


def run_fault(cluster: LocalCluster, tmp: Path, fault: Callable[[int], None], after_stage: float = 0.0) -> dict:
    """Writers stream while ``fault(leader node id)`` runs (from 1.5 s into the stream), then each is sealed and
    checked. Returns figures: the stages' wall time, how late the evidence was after each stage ended."""
    m = Materializer(cluster, tmp / "fleet.duckdb")
    writers = writers_on_one_partition(cluster, tmp)
    _, leader = leader_for(cluster.bootstrap, "flightrec.logs", writers[0].instance.encode())
    try:
        for w in writers:
            w.start()
        time.sleep(1.5)
        fault(leader)
        codes = [w.wait() for w in writers]
        assert codes == [STAGE_CODE] * len(writers), [w.stderr for w in writers]
        late = [m.wait_lines(w.instance, timeout=120 + after_stage) for w in writers]
        for w in writers:
            seal = w.agent("seal")
            assert seal.returncode == 0, seal.stdout + seal.stderr
        for w in writers:
            check_exactly_once(m, w)
        m.alive()
    except BaseException:
        print(node_log(cluster))
        raise
    finally:
        m.stop()
    walls = [w.ended - w.started for w in writers]
    # the stage alone sleeps 15 x 0.25 s; the agent may add at most the flush timeout (documented) plus start-up
    assert max(walls) < 15 * 0.25 + FLUSH_TIMEOUT + SLACK_S, walls
    figures = {"leader": leader, "stage_wall_s": [round(x, 1) for x in walls], "late_s": [round(x, 1) for x in late]}
    print(f"\nfigures: {figures}")
    return figures


def _later(seconds: float, what: Callable[[], object]) -> threading.Thread:
    def go() -> None:
        time.sleep(seconds)
        what()

    t = threading.Thread(target=go, daemon=True)
    t.start()
    return t


def test_the_partition_leader_killed_mid_stream_loses_and_doubles_nothing(cluster, tmp_path):
    back: list[threading.Thread] = []

    def fault(leader: int) -> None:
        cluster.node(leader).kill(signal.SIGKILL)
        back.append(_later(3.0, lambda: cluster.node(leader).start(timeout=120)))

    run_fault(cluster, tmp_path, fault)
    back[0].join(timeout=150)
    assert cluster.node(1)._pid() and cluster.node(2)._pid() and cluster.node(3)._pid()


def test_a_leader_stopped_longer_than_the_session_timeout_then_continued(cluster, tmp_path):
    def fault(leader: int) -> None:
        cluster.node(leader).kill(signal.SIGSTOP)
        time.sleep(12.0)  # > broker.session.timeout.ms (9 s) and replica.lag.time.max.ms (10 s): fenced, out of ISR
        cluster.node(leader).kill(signal.SIGCONT)

    run_fault(cluster, tmp_path, fault)
