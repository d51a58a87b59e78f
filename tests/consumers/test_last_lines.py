"""failures.last_lines: a failed stage's last lines, all its sources in order, kept in its row (the evidence)."""

from __future__ import annotations

from pathlib import Path

import duckdb
from materializer_helpers import Boot

from flightrec.db.derive import LAST_LINES
from flightrec.db.filestore import FileStore
from flightrec.db.fold import RawMessage, fold
from flightrec.db.query import run_query
from flightrec.db.views import VIEWS
from flightrec.schemas import Lifecycle, encode

# what an operator would otherwise ask log_lines for: the stage's last LAST_LINES lines, in order
FROM_LOG_LINES = f"""
SELECT list(text ORDER BY seq, line_no) FROM (
    SELECT text, seq, line_no FROM log_lines WHERE instance_id = ? AND boot_id = ? AND stage = ?
    ORDER BY seq DESC, line_no DESC LIMIT {LAST_LINES})"""


def commit(store: FileStore, events: list, first: int = 0) -> None:
    store.commit(
        fold([RawMessage(e.topic, 0, first + n, e.instance_id.encode(), encode(e)) for n, e in enumerate(events)])
    )


def failing_benchmark(b: Boot) -> None:
    b.facts()
    b.stage_ok("tunnel", ["tunnel up"])
    b.add(Lifecycle, stage="benchmark", state="started")
    b.lines("benchmark", "stdout", [f"proof {i} done" for i in range(40)])
    b.lines("benchmark", "/var/log/daemon.log", [f"daemon {i}" for i in range(30)])
    b.lines("benchmark", "stderr", ["warning: slow"])
    b.exit("benchmark", 1, stderr=["benchmark exited with error"])
    b.add(Lifecycle, stage="benchmark", state="failed")


def stored(db: Path, b: Boot) -> tuple[list[str], list[str]]:
    con = duckdb.connect(str(db), read_only=True)
    try:
        row = con.execute("SELECT last_lines FROM failures WHERE instance_id = ?", [b.instance]).fetchone()
        scan = con.execute(FROM_LOG_LINES, [b.instance, b.boot, "benchmark"]).fetchone()
    finally:
        con.close()
    assert row is not None and scan is not None
    return row[0], scan[0]


def test_the_failure_row_holds_the_stage_s_last_lines_of_every_source_in_order(tmp_path: Path) -> None:
    b = Boot()
    failing_benchmark(b)
    db = tmp_path / "f.duckdb"
    store = FileStore(db, group="t")
    try:
        commit(store, b.events)
    finally:
        store.close()
    kept, scan = stored(db, b)
    assert kept == scan
    assert len(kept) == LAST_LINES and kept[-1] == "warning: slow" and kept[-2] == "daemon 29"
    assert kept[0] == "proof 21 done" and "tunnel up" not in kept  # another stage's lines are not its evidence
    rows = run_query(db, "SELECT last_lines FROM failure_context", prelude=VIEWS).to_pylist()
    assert rows == [{"last_lines": kept}]


def test_the_daemon_s_line_written_after_the_exit_reaches_the_failure_row(tmp_path: Path) -> None:
    """The seed's decisive line comes from the daemon's log seconds after the exit: a later commit."""
    b = Boot()
    failing_benchmark(b)
    db = tmp_path / "f.duckdb"
    store = FileStore(db, group="t")
    try:
        commit(store, b.events)
        before = len(b.events)
        late = b.lines("benchmark", "/var/log/daemon.log", ["CUDA error: no kernel image is available"], first_line=31)
        commit(store, [late], first=before)
    finally:
        store.close()
    kept, scan = stored(db, b)
    assert kept == scan and kept[-1] == "CUDA error: no kernel image is available"


def test_a_database_made_before_last_lines_gets_them_at_the_first_open(tmp_path: Path) -> None:
    b = Boot()
    failing_benchmark(b)
    db = tmp_path / "old.duckdb"
    store = FileStore(db, group="t")
    try:
        commit(store, b.events)
    finally:
        store.close()
    con = duckdb.connect(str(db))
    con.execute("ALTER TABLE failures DROP COLUMN last_lines")  # as version 4 made it
    con.execute("DELETE FROM schema_version WHERE version = 5")
    con.close()
    FileStore(db, group="t").close()
    kept, scan = stored(db, b)
    assert kept == scan and len(kept) == LAST_LINES


def test_a_lake_with_failures_from_before_last_lines_asks_for_a_replay_and_a_new_one_opens(lake) -> None:
    import pytest

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
        assert len(kept) == 1 and kept[0][0][-1] == "warning: slow"
        store.con.execute("DELETE FROM main.schema_version WHERE version = 5")  # as version 4 left it
    finally:
        store.close()
    with pytest.raises(MaterializeError, match="failures rows built again.*last_lines.*replay"):
        LakeStore(loc, "g", shards=[0], owner="a")
