"""One name for the proving benchmark's figures: throughput (kinds sample and result) in tables, views, timeline."""

from __future__ import annotations

from pathlib import Path

from flightrec.analytics import queries
from flightrec.consumers.timeline import entries_from_records, from_db, render
from flightrec.db.filestore import FileStore
from flightrec.db.fold import RawMessage, fold
from flightrec.db.query import run_query
from flightrec.db.views import VIEW_NAMES, VIEWS
from flightrec.schemas import Lifecycle, encode
from materializer_helpers import Boot


def _db(tmp_path: Path) -> tuple[Boot, Path]:
    b = Boot()
    b.facts()
    b.add(Lifecycle, stage="benchmark", state="started")
    b.benchmark(120.0, 100.0, "pass")
    b.seal()
    db = tmp_path / "flightrec.duckdb"
    store = FileStore(db, group="test")
    try:
        store.commit(
            fold([RawMessage(e.topic, 0, i, e.instance_id.encode(), encode(e)) for i, e in enumerate(b.events)])
        )
    finally:
        store.close()
    return b, db


def test_throughput_view_holds_samples_and_results_and_the_old_name_still_reads(tmp_path: Path) -> None:
    b, db = _db(tmp_path)
    assert "throughput_view" in VIEW_NAMES
    rows = run_query(db, "SELECT kind FROM throughput_view ORDER BY ts_us", prelude=VIEWS).to_pylist()
    assert [r["kind"] for r in rows] == ["sample", "result"]
    old = run_query(db, "SELECT * FROM throughput_samples ORDER BY ts_us", prelude=VIEWS)
    assert old.equals(run_query(db, "SELECT * FROM throughput_view ORDER BY ts_us", prelude=VIEWS))


def test_timeline_shows_throughput_as_throughput(tmp_path: Path) -> None:
    b, db = _db(tmp_path)
    for entries, _ in (from_db(db, b.instance), entries_from_records([(e.name, e.to_record()) for e in b.events])):
        kinds = [e.kind for e in entries if e.stage == "benchmark" and e.kind not in ("event", "log")]
        assert kinds == ["throughput", "throughput"]
        assert "metric" not in render(entries)


def test_the_instance_row_of_the_fleet_view_is_named_for_what_it_is(tmp_path: Path) -> None:
    b, db = _db(tmp_path)
    row = queries.fleet_row(db, b.instance).to_pylist()
    assert row[0]["instance_id"] == b.instance and "status" in row[0]
    assert not hasattr(queries, "instance_facts")  # every caller moved; the misleading name is gone
