"""A long read on the file path never keeps a materializer from starting; a holder that does not leave is named."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from materializer_helpers import Boot, flightrec, materialize, publish

pytestmark = pytest.mark.integration

# Far longer than 30 s on any machine (and interruptible, as DuckDB checks between vectors).
HEAVY = "SELECT count(*) AS n FROM range(1000000000000) t(i) WHERE hash(i) % 1000003 = 7"


def _holds(pid: int, db: Path) -> bool:
    """Whether process ``pid`` has the database file open."""
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}") == str(db):
                return True
        except OSError:
            continue
    return False


def _wait_until(cond, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


def test_a_long_file_read_gives_way_to_a_starting_materializer(kafka, db, env_for):
    b = Boot()
    b.stage_ok("tunnel", ["up"])
    publish(kafka.bootstrap, b.events)
    materialize(kafka, db, idle=0.5)
    env = env_for()
    exe = Path(sys.executable).with_name("flightrec")
    reader = subprocess.Popen(
        [str(exe), "sql", "--db", str(db), HEAVY],
        env={**env, "PYTHONSAFEPATH": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        _wait_until(lambda: _holds(reader.pid, db), 60, "the reader never opened the file")
        time.sleep(1.0)
        assert reader.poll() is None  # still reading
        started = time.monotonic()
        m = flightrec(
            "materialize", "--db", str(db), "--no-serve", "--until-idle", "1", env=env, check=False, timeout=120
        )
        took = time.monotonic() - started
        assert m.returncode == 0, m.stderr
        # Before, the store waited its 30 s for the lock and then exited 1 ("Conflicting lock").
        assert took < 25, f"materialize took {took:.1f}s to start and finish"
        print(f"materialize --until-idle 1 with a long reader on the file: {took:.1f}s")
    finally:
        reader.kill()
        _, err = reader.communicate(timeout=60)
    assert "Traceback" not in err, err


def test_a_holder_that_does_not_leave_is_named(kafka, db, env_for):
    materialize(kafka, db, idle=0.5)
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import duckdb, sys, time; c = duckdb.connect(sys.argv[1], read_only=True); "
            "print('holding', flush=True); time.sleep(300)",
            str(db),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "holding"
        m = flightrec(
            "materialize",
            "--db",
            str(db),
            "--until-idle",
            "1",
            "--lock-wait",
            "2",
            env=env_for(),
            check=False,
            timeout=120,
        )
        assert m.returncode == 1
        assert f"pid {holder.pid}" in m.stderr and "duckdb.connect" in m.stderr, m.stderr
        assert "Traceback" not in m.stderr
    finally:
        holder.kill()
        holder.wait(30)


def test_a_reader_that_gave_way_asks_again_live(db):
    # The reader (a real `flightrec sql` process) holds the file; a writer opening it in this
    # process gets it without waiting out its lock_wait, and the reader's query then reaches the
    # live server (which here interrupts it after 1 s, so the test need not wait for the answer).
    from flightrec.db.filestore import FileStore
    from flightrec.db.serve import QueryServer

    FileStore(db, "g").close()
    exe = Path(sys.executable).with_name("flightrec")
    reader = subprocess.Popen(
        [str(exe), "sql", "--db", str(db), HEAVY],
        env={**os.environ, "PYTHONSAFEPATH": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        _wait_until(lambda: _holds(reader.pid, db), 60, "the reader never opened the file")
        started = time.monotonic()
        store = FileStore(db, "g", lock_wait=60)
        took = time.monotonic() - started
        try:
            assert took < 20, f"the writer waited {took:.1f}s for the reader to leave"
            print(f"the writer got the file {took:.2f}s after asking")
            assert not _holds(reader.pid, db)
            server = QueryServer(store.con.cursor(), db, query_timeout=1.0)
            with server:
                _, err = reader.communicate(timeout=120)
            assert server.counters["errors_total"] == 1  # the reader's query came, live
        finally:
            store.close()
    finally:
        if reader.poll() is None:
            reader.kill()
            reader.communicate(timeout=60)
    assert reader.returncode == 1 and "Traceback" not in err, err
    assert "nterrupt" in err, err
