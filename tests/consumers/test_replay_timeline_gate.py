"""Replay equals live table by table; timeline from the database and from the topics; the wait-sealed gate."""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from flightrec.db.query import run_query
from flightrec.db.rowwriter import MATERIALIZED_TABLES
from flightrec.schemas import Heartbeat, ManagerEvent
from materializer_helpers import Boot, flightrec, materialize, motivating_boot, publish

pytestmark = pytest.mark.integration


def _table(db: Path, name: str, where: str = "", params: list | None = None):
    return run_query(db, f"SELECT * FROM {name} {where} ORDER BY ALL", params or None)


def test_replay_equals_live_table_by_table(fresh_kafka, tmp_path):
    # a broker of its own: it reads the topics from the beginning, and what earlier tests left in the session's broker
    # includes hostile copies of one event in several partitions, whose kept receive time depends on the order the
    # partitions are read (docs/security.md, Limits)
    kafka = fresh_kafka

    def env_for() -> dict[str, str]:
        return kafka.env(FLIGHTREC_LOG_LEVEL="WARNING")

    boots = [motivating_boot(), Boot(), Boot()]
    boots[1].facts()
    boots[1].stage_ok("tunnel", ["up"])
    boots[1].add(Heartbeat, stage="tunnel", interval_s=30.0)
    boots[1].benchmark(55.0, 10.0, "pass")
    boots[1].seal()
    boots[2].facts()
    boots[2].lines("params", "stderr", ["sha256 checksum mismatch for params.bin"])
    destroyed = ManagerEvent(
        event_id=str(uuid.uuid4()),
        instance_id=boots[2].instance,
        boot_id="manager-boot",
        seq=0,
        ts_us=boots[2].t0 + 10**6,
        source_id="manager@test",
        kind="destroyed",
    )
    publish(
        kafka.bootstrap,
        [e for b in boots for e in b.events] + [destroyed],
        raw=[("flightrec.logs", b"junk", b"\x00junk")],
    )
    live = tmp_path / "live.duckdb"
    # Live in tiny transactions (many batch boundaries), replay in the default big ones.
    materialize(kafka, live, idle=0.5, batch_messages=3, from_mark=False)  # the replay below reads everything
    replayed = tmp_path / "replayed.duckdb"
    flightrec("replay", "--db", str(replayed), env=env_for())
    # Dead letters: compare the replay up to the offsets the live run had read.
    read = run_query(live, 'SELECT topic, "partition", next_offset FROM consumer_offsets').to_pylist()
    upto = (
        " OR ".join(
            f'(topic = \'{r["topic"]}\' AND "partition" = {r["partition"]} AND "offset" < {r["next_offset"]})'
            for r in read
        )
        or "false"
    )
    for name in MATERIALIZED_TABLES:
        where = f"WHERE {upto}" if name == "dead_letters" else ""
        a, b = _table(live, name, where), _table(replayed, name, where)
        assert a.num_rows > 0, name
        if not a.equals(b):
            ra, rb = a.to_pylist(), b.to_pylist()
            raise AssertionError(
                f"{name} differs between live and replay: only live {[r for r in ra if r not in rb][:3]}"
                f", only replay {[r for r in rb if r not in ra][:3]}"
            )
    again = flightrec("replay", "--db", str(replayed), env=env_for(), check=False)
    assert again.returncode == 1 and "exists" in again.stderr

    # A replay of one instance equals the live rows of that instance.
    one = tmp_path / "one.duckdb"
    target = boots[0].instance
    flightrec("replay", "--db", str(one), "--instance", target, env=env_for())
    assert run_query(one, "SELECT DISTINCT instance_id FROM events_seen").to_pylist() == [{"instance_id": target}]
    for name in ("instances", "failures", "log_lines", "process_exits", "lifecycle_events", "boots"):
        where = "WHERE instance_id = ?"
        assert _table(live, name, where, [target]).equals(_table(one, name, where, [target])), name
    # --since after every event of this test's fixed epoch keeps nothing of them.
    late = tmp_path / "late.duckdb"
    flightrec("replay", "--db", str(late), "--since", "2100-01-01T00:00:00Z", env=env_for())
    assert run_query(late, "SELECT count(*) AS n FROM events_seen").to_pylist() == [{"n": 0}]


def test_timeline_from_db_and_from_topics_when_the_db_is_gone(kafka, db, env_for):
    b = motivating_boot()
    publish(kafka.bootstrap, b.events)
    materialize(kafka, db, idle=0.5)
    from_db = flightrec("timeline", b.instance, "--db", str(db), env=env_for()).stdout
    db.unlink()
    gone = flightrec("timeline", b.instance, "--db", str(db), env=env_for())
    assert "reading the topics" in gone.stderr
    for out in (from_db, gone.stdout):
        lines = out.splitlines()
        assert any("tunnel" in line and "started" in line for line in lines)
        failure = [line for line in lines if "FAILURE" in line]
        assert len(failure) == 1 and failure[0].startswith("!!") and "gpu_arch_unsupported" in failure[0]
        kernel = [i for i, line in enumerate(lines) if "no kernel image" in line and " log " in line]
        exit_line = [i for i, line in enumerate(lines) if " exit " in line and "exit code 1" in line]
        assert kernel and exit_line and kernel[0] < exit_line[0]  # interleaved in time
        assert f"sealed: {len(b.events)} events" in out
    assert from_db == gone.stdout  # the same life, whichever the source
    missing = flightrec("timeline", "no-such-instance", "--db", str(db), env=env_for(), check=False)
    assert missing.returncode == 1


def test_wait_sealed_gate(kafka, db, env_for):
    env = env_for()
    b = Boot()
    b.facts()
    b.stage_ok("register", ["ok"])
    b.seal()
    held_back = b.events[2]
    publish(kafka.bootstrap, [e for e in b.events if e is not held_back])
    materialize(kafka, db, idle=0.5)
    out = flightrec("wait-sealed", b.instance, "--db", str(db), "--timeout", "1", env=env, check=False)
    assert out.returncode != 0 and "missing seq 2" in out.stderr

    # Completed while a materializer runs: the gate opens (live read through the socket).
    exe = Path(sys.executable).with_name("flightrec")
    proc = subprocess.Popen(
        [str(exe), "materialize", "--db", str(db)],
        env={**env, "PYTHONSAFEPATH": "1"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        time.sleep(0.5)
        gate = subprocess.Popen(
            [str(exe), "wait-sealed", b.instance, "--db", str(db), "--timeout", "90"],
            env={**env, "PYTHONSAFEPATH": "1"},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        publish(kafka.bootstrap, [held_back])
        out_text, err_text = gate.communicate(timeout=120)
        assert gate.returncode == 0, err_text
        assert "complete" in out_text
    finally:
        proc.terminate()
        proc.wait(60)

    unknown = flightrec("wait-sealed", "never-seen", "--db", str(db), "--timeout", "0.5", env=env, check=False)
    assert unknown.returncode != 0 and "no events" in unknown.stderr
    unsealed = Boot()
    unsealed.facts()
    publish(kafka.bootstrap, unsealed.events)
    materialize(kafka, db, idle=0.5)
    out = flightrec("wait-sealed", unsealed.instance, "--db", str(db), "--timeout", "0.5", env=env, check=False)
    assert out.returncode != 0 and "not sealed" in out.stderr
