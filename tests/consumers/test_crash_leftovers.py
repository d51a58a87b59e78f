"""A commit cut by SIGKILL whose log lines DuckDB's recovery kept without the rest of its transaction is not counted twice."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import duckdb
import pyarrow as pa
from materializer_helpers import Boot

from flightrec.db.fold import RawMessage, fold
from flightrec.db.filestore import FileStore
from flightrec.schemas import encode

LINES = 200

# What DuckDB 1.5.5 was seen to leave after a SIGKILL right after a large commit became visible (its
# log_lines rows are written to the file ahead of the commit, as row groups): the batch's log lines, and
# none of the rest of its transaction (its events_seen rows, its offsets, the run's bookkeeping).
_CRASH = """
import os, signal, sys
import duckdb, pyarrow.ipc as ipc
con = duckdb.connect(sys.argv[1])
lines = ipc.open_file(sys.argv[2]).read_all()
con.execute("INSERT INTO log_lines BY NAME SELECT * FROM lines")
os.kill(os.getpid(), signal.SIGKILL)
"""


def _messages(boot: Boot) -> list[RawMessage]:
    return [RawMessage(e.topic, 0, i, boot.instance.encode(), encode(e)) for i, e in enumerate(boot.events)]


def _crash_leaving(db: Path, lines: pa.Table, tmp_path: Path) -> None:
    path = tmp_path / "lines.arrow"
    with pa.ipc.new_file(path, lines.schema) as w:
        w.write_table(lines)
    proc = subprocess.run([sys.executable, "-c", _CRASH, str(db), str(path)], capture_output=True, text=True)
    assert proc.returncode == -9, proc.stderr
    assert Path(f"{db}.wal").exists(), "the crash left a WAL to replay, as a SIGKILLed writer does"


def test_log_lines_left_by_a_cut_commit_are_dropped_when_the_writer_starts_again(tmp_path):
    boot = Boot()
    boot.facts()
    for n in range(3):
        boot.lines("supervisor", "stdout", [f"batch {n} line {i}" for i in range(LINES)], first_line=n * LINES + 1)
    msgs = _messages(boot)
    db = tmp_path / "live.duckdb"

    first, rest = fold(msgs[:2]), fold(msgs[2:])  # facts + batch 0 committed; batches 1 and 2 not
    store = FileStore(db, "g")
    store.commit(first)
    store.close()
    _crash_leaving(db, rest.logs.slice(0, LINES), tmp_path)  # batch 1's lines survived the crash, alone

    store = FileStore(db, "g")  # a restart: resumes at the stored offsets, so batches 1 and 2 come again
    try:
        assert store.offsets()[("flightrec.logs", 0)] == 2
        stats = store.commit(rest)
        n, distinct = store.con.execute(
            "SELECT count(*), count(DISTINCT (event_id, line_no)) FROM log_lines"
        ).fetchone()
    finally:
        store.close()
    assert (n, distinct) == (3 * LINES, 3 * LINES)
    assert stats.lines_written == 2 * LINES


def test_lines_left_without_their_events_are_dropped_even_once_the_wal_is_gone(tmp_path):
    # An open after the crash that DuckDB checkpointed (WAL gone) and that was killed before its clean-up:
    # the rows are in the file, and the count of lines the runs wrote says some are not theirs.
    boot = Boot()
    for n in range(2):
        boot.lines("supervisor", "stdout", [f"batch {n} line {i}" for i in range(LINES)], first_line=n * LINES + 1)
    msgs = _messages(boot)
    db = tmp_path / "live.duckdb"
    store = FileStore(db, "g")
    store.commit(fold(msgs[:1]))
    store.close()
    rest = fold(msgs[1:])
    con = duckdb.connect(str(db))
    con.register("lines", rest.logs)
    con.execute("INSERT INTO log_lines BY NAME SELECT * FROM lines")
    con.close()  # a clean close: checkpointed, no WAL
    assert not Path(f"{db}.wal").exists()
    store = FileStore(db, "g")
    try:
        store.commit(rest)
        n = store.con.execute("SELECT count(*) FROM log_lines").fetchone()[0]
    finally:
        store.close()
    assert n == 2 * LINES


def test_a_clean_restart_keeps_every_row(tmp_path):
    boot = Boot()
    boot.lines("supervisor", "stdout", [f"line {i}" for i in range(LINES)])
    db = tmp_path / "live.duckdb"
    store = FileStore(db, "g")
    store.commit(fold(_messages(boot)))
    store.close()
    assert not Path(f"{db}.wal").exists()
    FileStore(db, "g").close()
    con = duckdb.connect(str(db), read_only=True)
    assert con.execute("SELECT count(*) FROM log_lines").fetchone()[0] == LINES
    con.close()
