"""The timeline from topics and from the database fold events the same way (one dispatch: db/fold.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from flightrec.consumers.timeline import Entry, entries_from_records, from_db
from flightrec.db.failures import exit_failed
from flightrec.db.filestore import FileStore
from flightrec.db.fold import RawMessage, fold
from flightrec.schemas import Dropped, Heartbeat, Lifecycle, LogBatch, ManagerEvent, encode
from materializer_helpers import Boot, motivating_boot


def _timed_out_boot() -> Boot:
    """Exits a timeout ended: code 0 (the command obeyed SIGTERM), code 124 (timeout(1)), a signal; and one clean."""
    b = Boot()
    b.facts()
    for stage, kw in (
        ("obeyed", dict(code=0)),
        ("coreutils", dict(code=124)),
        ("killed", dict(code=None, signal=9)),
        ("clean", dict(code=0, timed_out=False)),
    ):
        b.add(Lifecycle, stage=stage, state="started")
        b.lines(stage, "stdout", [f"{stage} working"])
        b.exit(stage, **{"timed_out": True, **kw})
    b.seal()
    return b


def _records(b: Boot) -> list[tuple[str, dict]]:
    return [(e.name, e.to_record()) for e in b.events]


def _comparable(entries: list[Entry]) -> list[tuple]:
    # GAP entries depend on the wall clock ("lost contact ... ago"): compare everything else
    return [
        (e.ts_us, e.seq, e.line_no, e.kind, e.stage, e.text, e.highlight, e.source) for e in entries if e.kind != "GAP"
    ]


def test_timed_out_exit_is_highlighted_exactly_when_the_failures_table_counts_it() -> None:
    b = _timed_out_boot()
    entries, _ = entries_from_records(_records(b))
    exits = {e.stage: e for e in entries if e.kind == "exit"}
    failed = {e.stage for e in entries if e.kind == "FAILURE"}
    for ev in b.events:
        if ev.name.endswith("ProcessExit"):
            counted = exit_failed(ev.to_record())
            assert exits[ev.stage].highlight == counted, (
                f"{ev.stage}: highlight {exits[ev.stage].highlight}, failures table counts it: {counted}"
            )
            assert (ev.stage in failed) == counted, ev.stage
    assert failed == {"obeyed", "coreutils", "killed"}


def _richer_boots() -> list[Boot]:
    """Two boots of one instance: the incident, then one with heartbeats, a drop, late lines and a manager note."""
    first = motivating_boot()
    second = Boot(instance=first.instance, t0=first.t0 + 3_600_000_000)
    second.facts()
    second.add(Lifecycle, stage="supervisor", state="started")
    second.add(Heartbeat, stage="supervisor", interval_s=30.0, pid=7)
    second.add(
        Dropped,
        original_event_id="e-1",
        original_type="flightrec.v1.LogBatch",
        original_topic="flightrec.logs",
        original_bytes=2_000_000,
        stage="supervisor",
        reason="MessageSizeTooLargeError",
    )
    second.exit("supervisor", code=None, signal=11, stderr=["segfault"])
    second.add(
        LogBatch,
        stage="supervisor",
        source="stderr",
        pid=7,
        line_no=[1, 2],
        line_ts_us=[second.t0, second.t0 + 1],
        text=["left behind", "still talking"],
        truncated=[False, False],
        invalid_utf8=[False, False],
        late=[True, True],
    )
    second.add(ManagerEvent, source_id="manager@ctl", kind="destroyed", detail="segfaults")
    second.seal()
    return [first, second]


def _stored(tmp_path: Path, boots: list[Boot]) -> Path:
    db = tmp_path / "flightrec.duckdb"
    store = FileStore(db, group="test")
    try:
        events = [e for b in boots for e in b.events]
        store.commit(fold([RawMessage(e.topic, 0, i, e.instance_id.encode(), encode(e)) for i, e in enumerate(events)]))
    finally:
        store.close()
    return db


@pytest.mark.slow
def test_timeline_from_topics_equals_timeline_from_the_database(tmp_path: Path) -> None:
    for n, boots in enumerate(([_timed_out_boot()], _richer_boots())):
        db = _stored(tmp_path / str(n), boots)
        for max_lines in (2000, 3):
            from_topics, left_topics = entries_from_records(
                [r for b in boots for r in _records(b)], max_lines=max_lines
            )
            stored, left_db = from_db(db, boots[0].instance, max_lines)
            assert _comparable(from_topics) == _comparable(stored)
            assert left_topics == left_db
    kinds = {e.kind for e in from_topics}
    assert {"event", "exit", "throughput", "log", "FAILURE", "manager"} <= kinds
