"""A three-node cluster's everyday faults while real agents write and a real materializer folds: nothing lost or
doubled, the materializer goes on, the stages keep their exit codes, and sealed boots open `wait-sealed`."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from cluster_helpers import heal, leaders, node_log, partition_of
from flightrec.broker.cluster import LocalCluster
from flightrec.db.query import run_query

from flightrec.errors import QueryError
from flightrec.settings import TOPICS, Settings

pytestmark = [pytest.mark.integration, pytest.mark.slow]

FLIGHTREC = str(Path(sys.executable).parent / "flightrec")
LINES = 1500  # per writer: a few seconds of output (the stage sleeps 0.25 s every 100 lines)
STAGE_CODE = 3  # the stage's own exit code, which the agent must pass on
PAUSE_S = 0.25  # the stage sleeps this long after every 100 lines: 15 pauses


def stage(pause: float = PAUSE_S) -> str:
    """The stage's code: LINES numbered lines, a pause every 100, then exit STAGE_CODE."""
    return (
        "import sys, time\n"
        f"for i in range({LINES}):\n"
        "    print(f'fault stream line {i}', flush=True)\n"
        "    if i % 100 == 99:\n"
        f"        time.sleep({pause})\n"
        f"sys.exit({STAGE_CODE})\n"
    )


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
    flush_timeout: int = 10  # FLIGHTREC_FLUSH_TIMEOUT: the documented bound on what an exiting agent waits
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
            FLIGHTREC_FLUSH_TIMEOUT=str(self.flush_timeout),
            FLIGHTREC_FACTS="",
            FLIGHTREC_LOG_LEVEL="WARNING",
        )

    def start(self, pause: float = PAUSE_S) -> None:
        self.started = time.monotonic()
        self.proc = subprocess.Popen(
            [FLIGHTREC, "agent", "run", "--instance", self.instance, "--stage", "work", "--", sys.executable, "-c"]
            + [stage(pause)],
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


def writers_led_by(cluster: LocalCluster, tmp: Path, node: int | None = None, n: int = 2) -> tuple[list[Writer], int]:
    """``n`` writers whose instance ids go to one partition of the logs topic, led by ``node`` (by any node when
    None); and that leader's node id. The lifecycle and exits topics' partitions of the same key may be led by
    others."""
    led = leaders(cluster.bootstrap, "flightrec.logs")
    wanted = [p for p, leader in led.items() if node is None or leader == node]
    assert wanted, f"node {node} leads no partition of flightrec.logs: {led}"
    ids: list[str] = []
    while len(ids) < n:
        instance = f"i-fault-{uuid.uuid4().hex[:10]}"
        if partition_of(instance.encode(), len(led)) == wanted[0]:
            ids.append(instance)
    return [Writer(cluster, tmp, i) for i in ids], led[wanted[0]]


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
    """The boot complete (`wait-sealed` opens: every seq of the boot stored, each topic read that far), then every
    line of the stage stored once, its exit once with the stage's code, no lifecycle event twice."""
    done = subprocess.run(
        [FLIGHTREC, "wait-sealed", w.instance, "--db", str(m.db), "--timeout", "60"],
        env=dict(os.environ, FLIGHTREC_BOOTSTRAP=m.cluster.bootstrap),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    rows = run_query(m.db, "SELECT text FROM log_lines WHERE instance_id = ?", [w.instance]).to_pylist()
    texts = sorted(r["text"] for r in rows)
    assert texts == sorted(f"fault stream line {i}" for i in range(LINES)), (
        f"{w.instance}: {len(texts)} lines stored, {len(set(texts))} distinct, of {LINES}"
    )
    exits = run_query(m.db, "SELECT exit_code FROM process_exits WHERE instance_id = ?", [w.instance]).to_pylist()
    assert exits == [{"exit_code": STAGE_CODE}], f"{w.instance}: exits stored {exits}"
    dup = run_query(
        m.db,
        "SELECT count(*) AS n, count(DISTINCT seq) AS d FROM lifecycle_events WHERE instance_id = ?",
        [w.instance],
    ).to_pylist()[0]
    assert dup["n"] == dup["d"], f"{w.instance}: lifecycle events stored twice: {dup}"


def delivered(m: Materializer, w: Writer) -> float:
    """Seconds until the agent's lines are all stored. An agent that Kafka did not acknowledge within its flush
    timeout (a fault longer than that, on a loaded machine) exits with the rest in its spool and says so; then
    `agent flush` delivers it, nothing lost, and the figure counts from the agent's exit."""
    if "agent flush" not in w.stderr:
        return m.wait_lines(w.instance)
    print(f"\n{w.instance}: the agent left events in its spool (flush timeout {w.flush_timeout} s): agent flush")
    flush = w.agent("flush", "--timeout", "60")
    assert flush.returncode == 0, flush.stdout + flush.stderr
    m.wait_lines(w.instance)
    return time.monotonic() - w.ended


def run_fault(
    cluster: LocalCluster, tmp: Path, fault: Callable[[int], object], node: int | None = None, pause: float = PAUSE_S
) -> dict[str, object]:
    """Writers to a partition led by ``node`` stream while ``fault(leader)`` runs (from 1.5 s into the stream), then
    each boot is sealed and checked. Returns figures: the stages' wall time, how late the evidence was after each
    stage ended."""
    m = Materializer(cluster, tmp / "fleet.duckdb")
    try:  # from here on the materializer is stopped however this ends (it was left running once)
        writers, leader = writers_led_by(cluster, tmp, node)
        for w in writers:
            w.start(pause)
        time.sleep(1.5)
        fault(leader)
        codes = [w.wait() for w in writers]
        assert codes == [STAGE_CODE] * len(writers), [w.stderr for w in writers]
        late = [delivered(m, w) for w in writers]
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
    # the stage alone pauses 15 times; the agent may add at most the flush timeout (documented) plus start-up
    assert max(walls) < 15 * pause + writers[0].flush_timeout + SLACK_S, walls
    figures = {"leader": leader, "stage_wall_s": [round(x, 1) for x in walls], "late_s": [round(x, 1) for x in late]}
    print(f"\nfigures: {figures}")
    return figures


def start_materializer(cluster: LocalCluster, db: Path) -> None:
    """Start an in-process Materializer on ``db`` and close it (what `flightrec materialize` does first). The
    database holds offset 0 for every partition, so the start seeks without asking the (absent) leaders."""
    from flightrec.consumers.materializer import DEFAULT_GROUP, Materializer
    from flightrec.consumers.options import Options
    from flightrec.db.filestore import FileStore
    from flightrec.db.fold import fold

    if not db.exists():
        store = FileStore(db, DEFAULT_GROUP)
        try:
            offsets = {(t, p): 0 for t in TOPICS for p in range(Settings.from_env({}).partitions)}
            store.commit(dataclasses.replace(fold([]), offsets=offsets))
        finally:
            store.close()

    async def go() -> None:
        async with Materializer(cluster.client_settings.kafka_kwargs(), Options(db=str(db), until_idle=1)):
            pass

    asyncio.run(go())


def _later(seconds: float, what: Callable[[], object]) -> threading.Thread:
    def go() -> None:
        time.sleep(seconds)
        what()

    t = threading.Thread(target=go, daemon=True)
    t.start()
    return t


def test_the_partition_leader_and_active_controller_killed_mid_stream_loses_and_doubles_nothing(cluster, tmp_path):
    """SIGKILL the node that leads the writers' partition, chosen to be the quorum's active controller too, mid-
    stream; it starts again 3 s later."""
    back: list[threading.Thread] = []
    controller = cluster.active_controller()

    def fault(leader: int) -> None:
        cluster.node(leader).kill(signal.SIGKILL)
        back.append(_later(3.0, lambda: cluster.node(leader).start(timeout=120)))

    figures = run_fault(cluster, tmp_path, fault, node=controller)
    back[0].join(timeout=150)
    assert all(n._pid() for n in cluster.nodes)
    print(f"killed node {figures['leader']}, the active controller was {controller}")


def test_a_leader_stopped_longer_than_the_session_timeout_then_continued(cluster, tmp_path):
    """SIGSTOP the writers' partition leader (the active controller too) for 12 s, then SIGCONT."""

    def fault(leader: int) -> None:
        cluster.node(leader).kill(signal.SIGSTOP)
        time.sleep(12.0)  # > broker.session.timeout.ms (9 s) and replica.lag.time.max.ms (10 s): fenced, out of ISR
        cluster.node(leader).kill(signal.SIGCONT)

    run_fault(cluster, tmp_path, fault, node=cluster.active_controller())


def test_a_rolling_restart_of_all_three_brokers(cluster, tmp_path):
    """Each node in turn stopped cleanly and started again, the next only once every partition has 3 in-sync
    replicas again (as an operator rolls a cluster), while the writers stream and the materializer folds."""
    done: list[threading.Thread] = []

    def roll() -> None:
        for n in cluster.nodes:
            n.stop()
            n.start(timeout=120)
            heal(cluster)

    run_fault(cluster, tmp_path, lambda leader: done.append(_later(0.0, roll)), pause=1.0)
    done[0].join(timeout=300)
    assert not done[0].is_alive() and all(n._pid() for n in cluster.nodes)


def test_two_brokers_lost_at_once_the_spool_keeps_what_kafka_did_not_take(cluster, tmp_path):
    """Below min.insync.replicas (and without a controller quorum) nothing is acknowledged: the agents exit with the
    stage's code after the flush timeout, `agent flush` says events are left, and once the brokers are back it
    delivers them, each once (a record marked sent that Kafka did not take would be missing at the end). A
    materializer started during the outage starts (it used to die on a broker the survivor still names)."""
    m = Materializer(cluster, tmp_path / "fleet.duckdb")
    writers, leader = writers_led_by(cluster, tmp_path)
    for w in writers:
        w.flush_timeout = 5
    lost = [leader, leader % 3 + 1]
    try:
        for w in writers:
            w.start()
        time.sleep(1.5)
        for node in lost:
            cluster.node(node).kill(signal.SIGKILL)
        codes = [w.wait() for w in writers]
        assert codes == [STAGE_CODE] * len(writers), [w.stderr for w in writers]
        walls = [w.ended - w.started for w in writers]
        assert max(walls) < 15 * PAUSE_S + 5 + SLACK_S, walls
        t0 = time.monotonic()
        for _ in range(4):  # each asks a random broker the metadata names: 2 of 3 are dead
            start_materializer(cluster, tmp_path / "started-in-the-outage.duckdb")
        starts = time.monotonic() - t0
        t0 = time.monotonic()
        left = writers[0].agent("flush", "--timeout", "3")
        flush_away = time.monotonic() - t0
        assert left.returncode == 1, left.stdout + left.stderr  # events wait in the spool: not told "sent"
        assert flush_away < 3 + 5, f"flush --timeout 3 took {flush_away:.1f} s"  # 13 s before the exit's wait went
        assert all(m.lines(w.instance)[0] < LINES for w in writers)
        m.alive()
        t0 = time.monotonic()
        heal(cluster)
        back = time.monotonic() - t0
        for w in writers:
            flushed = w.agent("flush", "--timeout", "60")
            assert flushed.returncode == 0, flushed.stdout + flushed.stderr
        late = [round(m.wait_lines(w.instance), 1) for w in writers]
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
    print(
        f"\nfigures: lost {lost}, stage_wall_s {[round(x, 1) for x in walls]}, 4 materializer starts {starts:.1f}s, "
        f"flush --timeout 3 while away {flush_away:.1f}s, brokers back in {back:.1f}s, then visible in {late}s"
    )


def test_a_materializer_group_on_a_lake_across_a_broker_death(cluster, lake, tmp_path):
    """Two `flightrec materialize` members of one group write a lake while the writers' partition leader is
    SIGKILLed (back 3 s later): partitions move, the members end cleanly, every line is in the lake once."""
    from flightrec.db import lake as lakes

    db, data_path = lake
    group = f"lake-{uuid.uuid4().hex[:8]}"
    env = dict(os.environ, FLIGHTREC_BOOTSTRAP=cluster.bootstrap, FLIGHTREC_LOG_LEVEL="INFO", PYTHONSAFEPATH="1")
    logs = [tmp_path / "a.log", tmp_path / "b.log"]
    writers, leader = writers_led_by(cluster, tmp_path)
    members: list[subprocess.Popen[bytes]] = []
    back: list[threading.Thread] = []
    try:
        for log in logs:
            members.append(
                subprocess.Popen(
                    [FLIGHTREC, "materialize", "--db", db, "--data-path", data_path, "--group", group]
                    + ["--until-idle", "20"],
                    env=env,
                    stdout=subprocess.DEVNULL,
                    stderr=log.open("ab"),
                )
            )
        for w in writers:
            w.start(pause=0.5)
        time.sleep(3.0)
        cluster.node(leader).kill(signal.SIGKILL)
        back.append(_later(3.0, lambda: cluster.node(leader).start(timeout=120)))
        codes = [w.wait() for w in writers]
        assert codes == [STAGE_CODE] * len(writers), [w.stderr for w in writers]
        for w in writers:
            seal = w.agent("seal")
            assert seal.returncode == 0, seal.stdout + seal.stderr
        for m in members:
            assert m.wait(240) == 0, "\n".join(log.read_text()[-3000:] for log in logs)
    finally:
        for m in members:
            if m.poll() is None:
                m.kill()
                m.wait(30)
        if back:
            back[0].join(timeout=150)
    con = lakes.connect(lakes.parse_db(db, data_path))
    try:
        for w in writers:
            n, distinct = con.execute(
                "SELECT count(*), count(DISTINCT text) FROM log_lines WHERE instance_id = ?", [w.instance]
            ).fetchone()
            assert (n, distinct) == (LINES, LINES), w.instance
            exits = con.execute("SELECT exit_code FROM process_exits WHERE instance_id = ?", [w.instance]).fetchall()
            assert exits == [(STAGE_CODE,)]
            complete = con.execute("SELECT complete FROM instances WHERE instance_id = ?", [w.instance]).fetchall()
            assert complete == [(True,)], w.instance
    finally:
        con.close()
