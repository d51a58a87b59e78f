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


def _family(pid: int) -> list[int]:
    """``pid`` and its descendants (`flightrec sql` reads in a child of its own)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                todo += [int(c) for c in Path(f"/proc/{p}/task/{task}/children").read_text().split()]
        except OSError:
            continue
    return out


def _holds(pid: int, db: Path) -> bool:
    """Whether process ``pid`` or one of its children has the database file open."""
    for p in _family(pid):
        try:
            fds = os.listdir(f"/proc/{p}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(f"/proc/{p}/fd/{fd}") == str(db):
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


def test_a_reader_that_gave_way_reads_the_snapshot(db):
    # The reader (a real `flightrec sql` process) holds the file; a writer opening it in this process gets it
    # without waiting out its lock_wait, and the reader's query then runs on the writer's first snapshot, where its
    # own time limit stops it (so the test need not wait for the answer).
    from flightrec.db.filestore import FileStore

    FileStore(db, "g", publish=False).close()
    exe = Path(sys.executable).with_name("flightrec")
    reader = subprocess.Popen(
        [str(exe), "sql", "--db", str(db), "--timeout", "10", HEAVY],
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
            assert took < 8, f"the writer waited {took:.1f}s for the reader to leave"
            print(f"the writer got the file {took:.2f}s after asking")
            assert not _holds(reader.pid, db)
            copy = db.with_name(db.name + ".snapshots")
            _wait_until(
                lambda: any(str(p).startswith(str(copy)) for p in _open_files(reader.pid)),
                60,
                "the reader never opened the snapshot",
            )
            _, err = reader.communicate(timeout=120)
        finally:
            store.close()
    finally:
        if reader.poll() is None:
            reader.kill()
            reader.communicate(timeout=60)
    assert reader.returncode == 1 and "Traceback" not in err, err
    assert err.strip().endswith(
        "stopped by the time limit of 10 s; narrow the query or give it longer (`flightrec sql --timeout 600`)"
    ), err


def _open_files(pid: int) -> list[str]:
    out = []
    for p in _family(pid):
        try:
            for fd in os.listdir(f"/proc/{p}/fd"):
                try:
                    out.append(os.readlink(f"/proc/{p}/fd/{fd}"))
                except OSError:
                    continue
        except OSError:
            continue
    return out
