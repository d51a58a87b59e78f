"""Exactly once: `flightrec materialize` killed with SIGKILL twice during a large backlog loses and repeats nothing."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from flightrec.db.query import run_query
from materializer_helpers import Boot, flightrec, publish, serving

from flightrec.errors import QueryError

pytestmark = pytest.mark.integration

INSTANCES = 12
BATCHES = 250
LINES = 200  # 12 * 250 * 200 = 600,000 lines


def _backlog() -> list[Boot]:
    boots = []
    for k in range(INSTANCES):
        b = Boot()
        b.facts()
        for n in range(BATCHES):
            b.lines(
                "supervisor",
                "stdout" if n % 3 else "/var/log/daemon.log",
                [f"instance {k} batch {n} line {i} " + "x" * 40 for i in range(LINES)],
                first_line=n * LINES + 1,
            )
        b.seal()
        boots.append(b)
    return boots


def _live_count(db: Path) -> int | None:
    try:
        return run_query(db, "SELECT count(*) AS n FROM log_lines").to_pylist()[0]["n"]
    except QueryError:
        return None


def _start(db: Path, env: dict[str, str]) -> subprocess.Popen:
    exe = Path(sys.executable).with_name("flightrec")
    return subprocess.Popen(
        [str(exe), "materialize", "--db", str(db), "--until-idle", "3"],
        env={**env, "PYTHONSAFEPATH": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def _kill_after(db: Path, env: dict[str, str], more_than: int, total: int) -> int:
    """Start a materializer, SIGKILL it once it has committed more than ``more_than`` lines; return the count seen."""
    proc = _start(db, env)
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                out, err = proc.communicate()
                raise AssertionError(f"the materializer ended before it was killed: {proc.returncode}\n{err.decode()}")
            n = _live_count(db) if serving(db) else None
            if n is not None and n > more_than:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait(30)
                assert n < total, "the backlog was consumed before the kill; make it larger"
                return n
            time.sleep(0.05)
        raise AssertionError("the materializer made no progress in 180 s")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
        proc.stdout.close()
        proc.stderr.close()


def test_sigkill_twice_during_backlog_then_every_line_exactly_once(fresh_kafka, tmp_path):
    boots = _backlog()
    total = INSTANCES * BATCHES * LINES
    publish(fresh_kafka.bootstrap, [e for b in boots for e in b.events])
    db = tmp_path / "live.duckdb"
    env = fresh_kafka.env(FLIGHTREC_LOG_LEVEL="WARNING")

    first = _kill_after(db, env, 0, total)
    assert (db.parent / (db.name + ".snapshots") / "current").exists()  # SIGKILL left the pointer; the next start copes
    second = _kill_after(db, env, first, total)
    assert first < second < total

    flightrec("materialize", "--db", str(db), "--until-idle", "3", env=env)
    rows = run_query(
        db,
        """SELECT count(*) AS n, count(DISTINCT (event_id, line_no)) AS distinct_lines,
                                   count(DISTINCT event_id) AS batches FROM log_lines""",
    ).to_pylist()[0]
    assert rows == {"n": total, "distinct_lines": total, "batches": INSTANCES * BATCHES}
    inst = run_query(
        db, "SELECT count(*) AS n FROM instances WHERE complete AND events = ?", [BATCHES + 2]
    ).to_pylist()[0]["n"]
    assert inst == INSTANCES
    # Offsets stored with the rows: a further run finds nothing new to write.
    out = flightrec("materialize", "--db", str(db), "--until-idle", "1", env=env)
    assert "lines_written=0" in out.stderr
    assert run_query(db, "SELECT count(*) AS n FROM log_lines").to_pylist()[0]["n"] == total
