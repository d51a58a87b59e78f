"""failures.last_lines: a failed stage's last lines, all its sources in order, kept in its row (the evidence)."""

from __future__ import annotations

import logging
from pathlib import Path

import duckdb
import pytest
from flightrec.db.filestore import FileStore
from flightrec.db.fold import RawMessage, fold
from flightrec.db.lastlines import LAST_LINES
from flightrec.db.query import run_query
from flightrec.db.views import VIEWS
from flightrec.schemas import Lifecycle, encode
from materializer_helpers import Boot

# what an operator would otherwise ask log_lines for: the stage's last LAST_LINES lines, in order
FROM_LOG_LINES = f"""
SELECT list({{'seq': seq, 'line_no': line_no, 'source': source, 'text': text}} ORDER BY seq, line_no) FROM (
    SELECT * FROM log_lines WHERE instance_id = ? AND boot_id = ? AND stage = ?
    ORDER BY seq DESC, line_no DESC LIMIT {LAST_LINES})"""


def commit(store: FileStore, events: list, first: int = 0) -> None:
    store.commit(
        fold([RawMessage(e.topic, 0, first + n, e.instance_id.encode(), encode(e)) for n, e in enumerate(events)])
    )


def written(db: Path, *batches: list) -> None:
    """Each batch of events committed in turn by one FileStore, closed after."""
    store = FileStore(db, group="t")
    first = 0
    try:
        for events in batches:
            commit(store, events, first)
            first += len(events)
    finally:
        store.close()


def failing_benchmark(b: Boot) -> None:
    b.facts()
    b.stage_ok("tunnel", ["tunnel up"])
    b.add(Lifecycle, stage="benchmark", state="started")
    b.lines("benchmark", "stdout", [f"proof {i} done" for i in range(40)])
    b.lines("benchmark", "/var/log/daemon.log", [f"daemon {i}" for i in range(30)])
    b.lines("benchmark", "stderr", ["warning: slow"])
    b.exit("benchmark", 1, stderr=["benchmark exited with error"])
    b.add(Lifecycle, stage="benchmark", state="failed")


def stored_on(con: duckdb.DuckDBPyConnection, b: Boot, stage: str = "benchmark") -> tuple[list[str], list[str]]:
    """The failure's last lines' texts, and those log_lines gives (each line's seq, line_no and source compared too)."""
    row = con.execute(
        "SELECT last_lines FROM failures WHERE instance_id = ? AND stage = ?", [b.instance, stage]
    ).fetchone()
    scan = con.execute(FROM_LOG_LINES, [b.instance, b.boot, stage]).fetchone()
    assert row is not None and scan is not None
    assert row[0] == (scan[0] or [])
    return [line["text"] for line in row[0]], [line["text"] for line in scan[0] or []]


def stored(db: Path, b: Boot, stage: str = "benchmark") -> tuple[list[str], list[str]]:
    con = duckdb.connect(str(db), read_only=True)
    try:
        return stored_on(con, b, stage)
    finally:
        con.close()


def test_the_failure_row_holds_the_stage_s_last_lines_of_every_source_in_order(tmp_path: Path) -> None:
    b = Boot()
    failing_benchmark(b)
    db = tmp_path / "f.duckdb"
    written(db, b.events)
    kept, scan = stored(db, b)
    assert kept == scan
    assert len(kept) == LAST_LINES and kept[-1] == "warning: slow" and kept[-2] == "daemon 29"
    assert kept[0] == "proof 21 done" and "tunnel up" not in kept  # another stage's lines are not its evidence
    rows = run_query(db, "SELECT [line.text FOR line IN last_lines] AS t FROM failure_context", prelude=VIEWS)
    assert rows.to_pylist() == [{"t": kept}]


def test_the_daemon_s_line_written_after_the_exit_reaches_the_failure_row(tmp_path: Path) -> None:
    """The seed's decisive line comes from the daemon's log seconds after the exit: a later commit."""
    b = Boot()
    failing_benchmark(b)
    db = tmp_path / "f.duckdb"
    before = list(b.events)
    late = b.lines("benchmark", "/var/log/daemon.log", ["CUDA error: no kernel image is available"], first_line=31)
    written(db, before, [late])
    kept, scan = stored(db, b)
    assert kept == scan and kept[-1] == "CUDA error: no kernel image is available"


def test_a_database_made_before_last_lines_gets_them_at_the_first_open(tmp_path: Path) -> None:
    b = Boot()
    failing_benchmark(b)
    db = tmp_path / "old.duckdb"
    written(db, b.events)
    con = duckdb.connect(str(db))
    con.execute("ALTER TABLE failures DROP COLUMN last_lines")  # as version 4 made it
    con.execute("DELETE FROM schema_version WHERE version >= 5")  # and any later one: as version 4 left it
    con.close()
    FileStore(db, group="t").close()
    kept, scan = stored(db, b)
    assert kept == scan and len(kept) == LAST_LINES


def test_a_lake_with_failures_from_before_last_lines_asks_for_a_replay_and_a_new_one_opens(lake) -> None:

    from flightrec.db import lake as lakes
    from flightrec.db.lakestore import LakeStore

    from flightrec.errors import MaterializeError

    db, data_path = lake
    loc = lakes.lake_location(db, data_path, writing=True)
    store = LakeStore(loc, "g", shards=[0], owner="a")  # a new lake: nothing to build again, it opens
    b = Boot()
    failing_benchmark(b)
    try:
        store.claim([0])
        store.commit({0: fold([RawMessage(e.topic, 0, n, None, encode(e)) for n, e in enumerate(b.events)])})
        kept = store.con.execute("SELECT last_lines FROM failures").fetchall()
        assert len(kept) == 1 and kept[0][0][-1]["text"] == "warning: slow"
        store.con.execute("DELETE FROM main.schema_version WHERE version >= 5")  # as version 4 left it
    finally:
        store.close()
    with pytest.raises(MaterializeError, match="failures rows built again.*last_lines.*replay"):
        LakeStore(loc, "g", shards=[0], owner="a")


def test_odd_lines_reach_the_failure_row_as_stored(tmp_path: Path) -> None:
    odd = ["nul \x00 inside", "escaped \\xff byte", "é" * 3000, "", "'; DROP TABLE failures; --", "tab\tand\rcr"]
    b = Boot()
    b.add(Lifecycle, stage="benchmark", state="started")
    b.lines("benchmark", "stderr", odd)
    b.exit("benchmark", 1)
    db = tmp_path / "f.duckdb"
    written(db, b.events)
    kept, scan = stored(db, b)
    assert kept == scan == odd


def test_lines_of_a_failed_stage_over_many_commits_in_any_order_keep_the_last_ones(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """After the failure, the stage's lines come in later commits: out of order (a spooled batch after newer ones),
    redelivered, and an event id reused with other lines (a dead letter); each commit merges its new lines with the
    stored ones, and the row always equals what log_lines holds."""
    import random

    b = Boot()
    b.add(Lifecycle, stage="benchmark", state="started")
    b.lines("benchmark", "stdout", [f"early {i}" for i in range(30)])
    b.exit("benchmark", 1, stderr=["exit 1"])
    later = [
        b.lines("benchmark", ["stdout", "stderr", "/var/log/daemon.log"][k % 3], [f"later {k}.{i}" for i in range(7)])
        for k in range(12)
    ]
    random.Random(7).shuffle(later)
    reused = type(later[0])(**{**later[0].to_record(), "text": [f"forged {i}" for i in range(7)]})
    db = tmp_path / "f.duckdb"

    def scans() -> int:
        return sum("read from log_lines" in r.getMessage() for r in caplog.records)

    store = FileStore(db, group="t")
    offset = 0
    caplog.set_level(logging.DEBUG, logger="flightrec.db.lastlines")
    try:
        commit(store, b.events[:4])  # the failure, with the lines before it: its last lines read from log_lines
        offset = 4
        assert scans() == 1
        caplog.clear()
        for batch in [later[:3], later[3:4] + later[:1], [reused], later[4:9], later[9:]]:
            commit(store, batch, first=offset)
            offset += len(batch)
            kept, scan = stored_on(store.con, b)
            assert kept == scan
        assert scans() == 0  # every later commit merged: no scan of log_lines
    finally:
        store.close()
    kept, _ = stored(db, b)
    assert len(kept) == LAST_LINES and not any(t.startswith("forged") for t in kept)
    con = duckdb.connect(str(db), read_only=True)
    try:
        assert con.execute("SELECT count(*) FROM dead_letters").fetchone() == (1,)
    finally:
        con.close()
