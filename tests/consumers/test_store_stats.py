"""The store's one counter type: each commit says what it wrote; the run's totals are their sum."""

from __future__ import annotations

import duckdb
from flightrec.db.filestore import FileStore
from flightrec.db.fold import RawMessage, fold
from flightrec.db.stats import Stats
from flightrec.schemas import encode
from materializer_helpers import Boot


def _messages(events, start=0):
    return [RawMessage(e.topic, 0, start + i, e.instance_id.encode(), encode(e)) for i, e in enumerate(events)]


def test_each_commit_counts_its_batch_and_the_run_row_holds_the_sum(tmp_path):
    b = Boot()
    b.facts()
    b.stage_ok("tunnel", ["up", "ready"])
    b.exit("prove", 3, stderr=["boom"])
    first = _messages(b.events)
    again = _messages(b.events[:2], start=len(first)) + [
        RawMessage(b.events[0].topic, 0, len(first) + 2, b"k", b"not an event")
    ]
    store = FileStore(tmp_path / "fr.duckdb", "g")
    try:
        s1 = store.commit(fold(first))
        s2 = store.commit(fold(again))
        assert isinstance(s1, Stats) and isinstance(s2, Stats)
        assert s1.events_received == len(first) and s1.events_written == len(first)
        assert s1.lines_written == 2 and s1.duplicates_dropped == 0 and s1.commits == 1
        assert s1.failures_written == 1
        assert s2.events_received == 3 and s2.events_written == 0 and s2.duplicates_dropped == 2
        assert s2.dead_letters == 1 and s2.lines_written == 0
        assert store.totals == s1 + s2
    finally:
        store.close()
    con = duckdb.connect(str(tmp_path / "fr.duckdb"), read_only=True)
    row = con.execute("SELECT commits, messages, lines, duplicates, dead_letters FROM materializer_runs").fetchone()
    con.close()
    t = s1 + s2
    assert row == (t.commits, t.events_received, t.lines_written, t.duplicates_dropped, t.dead_letters)
    assert (s1 + Stats(errors_total=1)).summary().startswith(f"events_received={len(first)} ")
