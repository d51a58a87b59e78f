"""A backup of a database a materializer holds and writes: made by the materializer between two commits,
consistent (rows and offsets of one commit), and restored it resumes from Kafka with nothing lost or twice."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from flightrec.db.query import run_query
from materializer_helpers import Boot, materialize, motivating_boot, publish

pytestmark = pytest.mark.integration
EXE = str(Path(sys.executable).with_name("flightrec"))


def _counts(db: Path, instances: list[str]) -> dict:
    return run_query(
        db,
        "SELECT (SELECT count(*) FROM events_seen WHERE list_contains(?, instance_id)) AS events, "
        "(SELECT count(*) FROM log_lines WHERE list_contains(?, instance_id)) AS lines",
        [instances, instances],
    ).to_pylist()[0]


def test_a_live_backup_round_trips_and_the_restore_resumes_from_kafka(kafka, tmp_path: Path, db: Path, env_for):
    env = env_for()
    first = [motivating_boot() for _ in range(3)]
    kafka.seed_at_mark(db)
    publish(kafka.bootstrap, [e for b in first for e in b.events])
    mat = subprocess.Popen(
        [EXE, "materialize", "--db", str(db)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    ids = [b.instance for b in first]
    try:
        deadline = time.monotonic() + 90
        want = sum(len(b.events) for b in first)
        while _counts(db, ids)["events"] < want:
            assert time.monotonic() < deadline and mat.poll() is None, "not materialized"
            time.sleep(0.3)
        before = _counts(db, ids)
        backup = tmp_path / "nightly.duckdb"
        r = subprocess.run(
            [EXE, "backup", "--db", str(db), "--to", str(backup)], env=env, capture_output=True, text=True, timeout=180
        )
        assert r.returncode == 0 and "by the running materializer" in r.stdout, r.stdout + r.stderr
        assert mat.poll() is None  # the materializer goes on, still the file's one writer (its lock kept)
        held = subprocess.run(
            [sys.executable, "-c", f"import duckdb; duckdb.connect({str(db)!r}, read_only=True)"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert held.returncode != 0 and "lock" in held.stderr.lower(), held.stderr
        # the disk is lost: the backup restored elsewhere; meanwhile more events came
        later = [Boot() for _ in range(2)]
        for b in later:
            b.stage_ok("params", ["params ok"])
            b.seal()
        publish(kafka.bootstrap, [e for b in later for e in b.events])
    finally:
        mat.terminate()
        mat.wait(60)
    restored = tmp_path / "new" / "fleet.duckdb"
    restored.parent.mkdir()
    r = subprocess.run(
        [EXE, "restore", "--from", str(backup), "--db", str(restored)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    assert _counts(restored, ids) == before  # the backup holds what was committed
    materialize(kafka, restored, from_mark=False)  # resumes at the backup's offsets
    assert _counts(restored, ids) == before  # nothing twice
    news = [b.instance for b in later]
    assert _counts(restored, news) == {"events": sum(len(b.events) for b in later), "lines": len(later)}  # nothing lost
    dup = run_query(restored, "SELECT count(*) - count(DISTINCT event_id) AS n FROM events_seen").to_pylist()[0]["n"]
    assert dup == 0
