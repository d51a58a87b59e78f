"""Issue 14: heartbeats, manager events and one derived status per instance, through the real broker."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from flightrec.db.query import run_query
from flightrec.db.rowwriter import MATERIALIZED_TABLES
from flightrec.db.views import VIEWS
from flightrec.schemas import Heartbeat, Lifecycle, now_us
from materializer_helpers import Boot, flightrec, materialize, motivating_boot, publish

from flightrec.errors import FlightrecError

pytestmark = pytest.mark.integration
EXE = str(Path(sys.executable).with_name("flightrec"))


def _fleet(db: Path, instance: str) -> dict:
    rows = run_query(db, "SELECT * FROM fleet WHERE instance_id = ?", [instance], prelude=VIEWS).to_pylist()
    assert rows, f"{instance} is not in the fleet view"
    return rows[0]


def _wait_status(db: Path, instance: str, want: str, within: float) -> dict:
    """Poll the fleet view until ``instance`` has status ``want``; its row then (fails after ``within``)."""
    t0 = time.monotonic()
    last = None
    while time.monotonic() - t0 < within:
        try:
            last = _fleet(db, instance)
            if last["status"] == want:
                return last
        except (AssertionError, FlightrecError):  # not materialized yet
            pass
        time.sleep(0.2)
    raise AssertionError(f"{instance} did not become {want} within {within}s; last row: {last}")


def test_sigkilled_agent_is_lost_at_once_while_a_live_one_stays_running(kafka, tmp_path, db, env_for):
    env = env_for(
        FLIGHTREC_HEARTBEAT_S="1", FLIGHTREC_SPOOL=str(tmp_path / "spool"), FLIGHTREC_FACTS="", PYTHONSAFEPATH="1"
    )
    dead, alive = f"lost-{uuid.uuid4().hex[:8]}", f"alive-{uuid.uuid4().hex[:8]}"
    kafka.seed_at_mark(db)
    mat = subprocess.Popen(
        [EXE, "materialize", "--db", str(db)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    agents = {
        i: subprocess.Popen(
            [EXE, "agent", "run", "--instance", i, "--stage", "benchmark", "--", "sleep", "120"],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        for i in (dead, alive)
    }
    try:
        for i in (dead, alive):
            _wait_status(db, i, "running", 90)
        row = _fleet(db, dead)
        assert row["heartbeat_interval_s"] == 1.0 and row["last_heartbeat_us"] is not None
        os.killpg(agents[dead].pid, signal.SIGKILL)  # the agent and its stage: no heartbeat, no exit, no seal
        killed = time.monotonic()
        row = _wait_status(db, dead, "lost", 5)
        assert time.monotonic() - killed <= 5.5
        assert row["status_detail"].startswith("lost contact") and "no heartbeat since" in row["status_detail"]
        assert not row["sealed"]
        # fresh heartbeats keep the other one running (polled: a materializer behind by more than
        # 3 intervals on a loaded machine shows it lost for a moment, which is what it can know)
        _wait_status(db, alive, "running", 10)
        time.sleep(2)
        assert _wait_status(db, dead, "lost", 1)["status"] == "lost"  # and the dead one stays lost

        t0 = time.monotonic()
        gate = flightrec("wait-sealed", dead, "--db", str(db), "--timeout", "60", env=env, check=False)
        assert gate.returncode != 0
        assert time.monotonic() - t0 < 30, "wait-sealed waited although the instance is lost"
        assert "lost" in gate.stderr and "not sealed" in gate.stderr, gate.stderr

        timeline = flightrec("timeline", dead, "--db", str(db), env=env).stdout
        assert "no heartbeat since" in timeline and "lost contact" in timeline
    finally:
        for p in agents.values():
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
            p.wait(30)
        mat.terminate()
        mat.wait(60)


def _read_until(kafka, db: Path, instance: str, want: str, within: float) -> dict:  # type: ignore[no-untyped-def]  # kafka: the fixture
    """Materialize again until ``instance`` has status ``want``: a silence counts only once the materializer has
    read the time it spans (materializer_progress: its input caught up after it), not while none runs."""
    t0 = time.monotonic()
    while True:
        materialize(kafka, db, idle=0.5)
        row = _fleet(db, instance)
        if row["status"] == want or time.monotonic() - t0 > within:
            assert row["status"] == want, row
            return row
        time.sleep(0.5)


def test_manager_destroyed_event_status_timeline_completeness(kafka, tmp_path, db, env_for):
    env = env_for(FLIGHTREC_SPOOL=str(tmp_path / "spool"))
    b = Boot()  # its agent is gone: started a stage, a few heartbeats, then nothing (never sealed)
    b.facts()
    b.add(Lifecycle, stage="benchmark", state="started")
    for _ in range(3):
        b.add(Heartbeat, stage="benchmark", interval_s=1.0)
    publish(kafka.bootstrap, b.events)
    materialize(kafka, db, idle=0.5)
    # lost 3 intervals after Kafka received its last event (its own timestamps, a fixed epoch long past, do not
    # decide: that would be the instance's clock)
    _read_until(kafka, db, b.instance, "lost", 30)
    before = run_query(db, "SELECT * FROM boots WHERE instance_id = ? ORDER BY ALL", [b.instance])
    inst_before = run_query(
        db,
        "SELECT events, sealed, complete, incomplete_reason, boot_id FROM instances WHERE instance_id = ?",
        [b.instance],
    )
    assert run_query(db, "SELECT beats FROM heartbeats WHERE instance_id = ?", [b.instance]).to_pylist() == [
        {"beats": 3}
    ]

    out = flightrec(
        "manager",
        "event",
        "--instance",
        b.instance,
        "--kind",
        "destroyed",
        "--detail",
        "benchmark below MIN_RATE",
        "--attr",
        "price=0.35",
        "--source",
        "manager@test",
        env=env,
    )
    assert "destroyed" in out.stdout
    materialize(kafka, db, idle=0.5)
    row = _fleet(db, b.instance)
    assert row["status"] == "destroyed"
    assert row["status_detail"].startswith("destroyed by manager@test at ")
    assert row["status_detail"].endswith(": benchmark below MIN_RATE")
    # the boot's completeness is untouched: the manager's event has its own source, boot and seq
    assert run_query(db, "SELECT * FROM boots WHERE instance_id = ? ORDER BY ALL", [b.instance]).equals(before)
    assert run_query(
        db,
        "SELECT events, sealed, complete, incomplete_reason, boot_id FROM instances WHERE instance_id = ?",
        [b.instance],
    ).equals(inst_before)
    m = run_query(db, "SELECT * FROM manager_events WHERE instance_id = ?", [b.instance]).to_pylist()
    assert len(m) == 1 and m[0]["source_id"] == "manager@test" and m[0]["boot_id"] != b.boot
    assert dict(m[0]["attributes"]) == {"price": "0.35"}
    assert run_query(
        db, "SELECT count(*) AS n FROM events_seen WHERE event_id = ?", [m[0]["event_id"]]
    ).to_pylist() == [{"n": 0}]

    for args in ((), ("--from-topics",)):
        text = flightrec("timeline", b.instance, "--db", str(db), *args, env=env).stdout
        line = [x for x in text.splitlines() if " manager " in x]
        assert len(line) == 1 and "destroyed by manager@test" in line[0] and "benchmark below MIN_RATE" in line[0]
        assert line[0].startswith("!!")
        assert "no heartbeat since" in text

    t0 = time.monotonic()
    gate = flightrec("wait-sealed", b.instance, "--db", str(db), "--timeout", "60", env=env, check=False)
    assert gate.returncode != 0 and time.monotonic() - t0 < 30
    assert "destroyed" in gate.stderr and "not sealed" in gate.stderr


def _statuses_boots() -> dict[str, Boot]:
    failed = motivating_boot()  # benchmark failed (gpu_arch_unsupported), sealed
    slow = Boot()
    slow.facts()
    slow.add(Lifecycle, stage="benchmark", state="started")
    slow.benchmark(5.0, 10.0, "fail", "5.0 proofs/hour < MIN_RATE 10.0")
    slow.exit("benchmark", 1)
    slow.add(Lifecycle, stage="benchmark", state="failed", detail="below MIN_RATE")
    slow.seal()
    healthy = Boot(t0=now_us() - 2_000_000)
    healthy.facts()
    healthy.stage_ok("params")
    healthy.benchmark(55.0, 10.0, "pass")
    healthy.add(Lifecycle, stage="supervisor", state="started")
    healthy.add(Heartbeat, stage="supervisor", interval_s=3600.0)
    running = Boot(t0=now_us() - 2_000_000)
    running.facts()
    running.add(Lifecycle, stage="params", state="started")
    running.add(Heartbeat, stage="params", interval_s=3600.0)
    finished = Boot()
    finished.facts()
    finished.stage_ok("params", ["ok"])
    finished.benchmark(55.0, 10.0, "pass")
    finished.seal()
    return {"failed": failed, "below_min_rate": slow, "healthy": healthy, "running": running, "finished": finished}


def test_every_status_and_replay_gives_identical_tables(kafka, tmp_path, db, env_for):
    boots = _statuses_boots()
    gone = Boot()
    gone.facts()
    gone.add(Lifecycle, stage="benchmark", state="started")
    gone.add(Heartbeat, stage="benchmark", interval_s=1.0)
    gone.add(Heartbeat, stage="benchmark", interval_s=1.0)
    publish(kafka.bootstrap, [e for b in [*boots.values(), gone] for e in b.events])
    # tiny transactions: the heartbeat summary merges (this test's events only: the replay below is compared on them)
    materialize(kafka, db, idle=0.5, batch_messages=2)
    flightrec(
        "manager",
        "event",
        "--instance",
        gone.instance,
        "--kind",
        "note",
        "--detail",
        "slow to answer",
        "--source",
        "manager@t",
        env=env_for(FLIGHTREC_SPOOL=str(tmp_path / "spool")),
    )
    materialize(kafka, db, idle=0.5, batch_messages=2)
    for want, b in boots.items():
        assert _fleet(db, b.instance)["status"] == want, (want, _fleet(db, b.instance))
    assert _fleet(db, boots["failed"].instance)["failure_class"] == "gpu_arch_unsupported"
    assert _fleet(db, boots["failed"].instance)["status_detail"] == "benchmark failed: gpu_arch_unsupported"
    _read_until(kafka, db, gone.instance, "lost", 30)  # 3 intervals after Kafka received its last event (read by a
    # materializer after them); a note is no destroy
    hb = run_query(db, "SELECT beats, interval_s, stage FROM heartbeats WHERE instance_id = ?", [gone.instance])
    assert hb.to_pylist() == [{"beats": 2, "interval_s": 1.0, "stage": "benchmark"}]
    # `flightrec sql` speaks the same status
    out = flightrec(
        "sql",
        "--db",
        str(db),
        f"SELECT status FROM fleet WHERE instance_id = '{boots['healthy'].instance}'",
        env=env_for(),
    ).stdout
    assert "healthy" in out

    replayed = tmp_path / "replayed.duckdb"  # the whole topics (the session's every test), in big transactions
    flightrec("replay", "--db", str(replayed), env=env_for())
    ours = [b.instance for b in [*boots.values(), gone]]
    for name in MATERIALIZED_TABLES:
        if (
            name == "dead_letters"
        ):  # no instance: the shared topics' garbage (tests/consumers/test_replay_timeline_gate.py)
            continue
        a = run_query(db, f"SELECT * FROM {name} WHERE list_contains(?, instance_id) ORDER BY ALL", [ours])
        r = run_query(replayed, f"SELECT * FROM {name} WHERE list_contains(?, instance_id) ORDER BY ALL", [ours])
        if name in ("heartbeats", "manager_events", "instances", "boots"):
            assert a.num_rows > 0, name
        assert a.equals(r), f"{name} differs between live and replay"
