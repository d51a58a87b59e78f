"""A commit cut by SIGKILL whose log lines DuckDB's recovery kept without the rest of its transaction is not counted
twice."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import duckdb
import pyarrow as pa
from flightrec.db.filestore import FileStore
from flightrec.db.fold import RawMessage, fold
from flightrec.db.lastlines import LAST_LINES
from flightrec.schemas import Lifecycle, encode
from materializer_helpers import Boot

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


# the failed stage's last lines as log_lines gives them, each line whole
_LAST = f"""
SELECT list({{'seq': seq, 'line_no': line_no, 'source': source, 'text': text}} ORDER BY seq, line_no) FROM (
    SELECT * FROM log_lines WHERE instance_id = ? AND stage = 'benchmark' ORDER BY seq DESC, line_no DESC
    LIMIT {LAST_LINES})"""


def _failed_benchmark(late_batches: int) -> Boot:
    """A benchmark stage that fails after 30 lines, then ``late_batches`` of 40 daemon lines written after its exit."""
    boot = Boot()
    boot.add(Lifecycle, stage="benchmark", state="started")
    boot.lines("benchmark", "stdout", [f"early {i}" for i in range(30)])
    boot.exit("benchmark", 1, stderr=["exit 1"])
    for n in range(late_batches):
        boot.lines("benchmark", "/var/log/daemon.log", [f"late {n}.{i}" for i in range(40)], first_line=n * 40 + 1)
    return boot


def _last_lines_as_log_lines_has_them(db: Path, boot: Boot, lines: int) -> None:
    con = duckdb.connect(str(db), read_only=True)
    try:
        kept = con.execute("SELECT last_lines FROM failures WHERE instance_id = ?", [boot.instance]).fetchone()
        scan = con.execute(_LAST, [boot.instance]).fetchone()
        assert con.execute("SELECT count(*), count(DISTINCT (event_id, line_no)) FROM log_lines").fetchone() == (
            lines,
            lines,
        )
    finally:
        con.close()
    assert kept is not None and scan is not None and len(kept[0]) == LAST_LINES
    assert kept[0] == scan[0]


def test_a_failed_stage_s_later_lines_cut_with_their_commit_reach_its_last_lines_once(tmp_path):
    # The failure is stored with its last lines; the commit that brings the daemon's later lines is cut, its lines
    # left alone in log_lines; after the restart they are merged into the row once, as if never cut.
    boot = _failed_benchmark(late_batches=2)
    msgs = _messages(boot)
    db = tmp_path / "live.duckdb"
    first, rest = fold(msgs[:-2]), fold(msgs[-2:])
    store = FileStore(db, "g")
    store.commit(first)
    store.close()
    _crash_leaving(db, rest.logs.slice(0, 40), tmp_path)
    store = FileStore(db, "g")
    try:
        store.commit(rest)
    finally:
        store.close()
    _last_lines_as_log_lines_has_them(db, boot, 30 + 2 * 40)


def test_a_failure_whose_commit_was_cut_reads_its_last_lines_without_the_leftovers(tmp_path):
    # The commit that makes the failure is cut with its lines left: the restart drops them, the failure made again
    # reads its last lines from log_lines, each line once.
    boot = _failed_benchmark(late_batches=1)
    msgs = _messages(boot)
    db = tmp_path / "live.duckdb"
    all_of_it = fold(msgs)
    FileStore(db, "g").close()
    _crash_leaving(db, all_of_it.logs, tmp_path)
    store = FileStore(db, "g")
    try:
        assert store.offsets() == {}
        store.commit(all_of_it)
    finally:
        store.close()
    _last_lines_as_log_lines_has_them(db, boot, 30 + 40)


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
