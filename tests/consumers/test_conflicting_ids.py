"""An event id seen again with other content is a dead letter with the reason, not a silent redelivery."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from flightrec.db.filestore import FileStore
from flightrec.db.fold import RawMessage, fold
from flightrec.schemas import Lifecycle, encode
from materializer_helpers import Boot


def _msgs(events: list, first_offset: int = 0) -> list[RawMessage]:
    return [RawMessage(e.topic, 0, first_offset + i, e.instance_id.encode(), encode(e)) for i, e in enumerate(events)]


@pytest.fixture
def store(tmp_path: Path):
    s = FileStore(tmp_path / "fr.duckdb", "g")
    yield s
    s.close()


def _forged(boot: Boot) -> tuple[Lifecycle, Lifecycle]:
    real = boot.add(Lifecycle, stage="benchmark", state="started")
    boot.add(Lifecycle, stage="benchmark", state="succeeded")
    # the same event id with another seq and state (a forger, or a buggy producer reusing ids)
    return real, dataclasses.replace(real, seq=real.seq + 7, state="failed", detail="exit code 1")


def test_a_reused_id_in_a_later_batch_is_a_dead_letter(store: FileStore) -> None:
    boot = Boot()
    real, forged = _forged(boot)
    store.commit(fold(_msgs(boot.events)))
    stats = store.commit(fold(_msgs([forged], first_offset=10)))
    assert stats.dead_letters == 1 and stats.duplicates_dropped == 0 and stats.events_written == 0
    (reason,) = store.con.execute("SELECT reason FROM dead_letters").fetchone()
    assert "reused" in reason and real.event_id in reason and "seq 0" in reason and "seq 7" in reason, reason
    (value,) = store.con.execute("SELECT value FROM dead_letters").fetchone()
    assert bytes(value) == encode(forged)  # the rejected message is kept whole
    states = store.con.execute("SELECT state FROM lifecycle_events ORDER BY seq").fetchall()
    assert states == [("started",), ("succeeded",)]


def test_a_reused_id_in_the_same_batch_is_a_dead_letter(store: FileStore) -> None:
    boot = Boot()
    _real, forged = _forged(boot)
    stats = store.commit(fold(_msgs(boot.events + [forged])))
    assert stats.dead_letters == 1 and stats.duplicates_dropped == 0
    assert store.con.execute("SELECT count(*) FROM dead_letters WHERE reason LIKE '%reused%'").fetchone()[0] == 1


def test_a_true_redelivery_is_still_a_duplicate(store: FileStore) -> None:
    boot = Boot()
    boot.add(Lifecycle, stage="benchmark", state="started")
    store.commit(fold(_msgs(boot.events)))
    again = store.commit(fold(_msgs(boot.events, first_offset=5) + _msgs(boot.events, first_offset=6)))
    assert again.duplicates_dropped == 2 and again.dead_letters == 0
    assert store.con.execute("SELECT count(*) FROM dead_letters").fetchone()[0] == 0


def test_the_instance_page_says_an_id_was_reused(tmp_path: Path, open_page) -> None:
    db = tmp_path / "fr.duckdb"
    s = FileStore(db, "g")
    boot = Boot()
    _real, forged = _forged(boot)
    s.commit(fold(_msgs(boot.events)))
    s.commit(fold(_msgs([forged], first_offset=10)))
    s.close()
    at = open_page(db, "instance", instance=boot.instance)
    shown = " ".join(str(w.value) for w in at.warning)
    assert "reused" in shown and "dead letter" in shown, shown


def test_a_dropped_marker_sent_again_with_another_reason_is_a_duplicate(store: FileStore) -> None:
    """(Found by review.) A Dropped marker's reason names the limit its sender had learned: two resends of one refused
    record can differ in it and still be one event."""
    from flightrec.schemas import Dropped

    boot = Boot()
    first = boot.add(
        Dropped,
        original_event_id="x",
        original_type="LogBatch",
        original_topic="flightrec.logs",
        original_bytes=2_000_000,
        stage="benchmark",
        reason="too large: over 1048588 bytes",
    )
    again = dataclasses.replace(first, reason="too large: over 524288 bytes")
    store.commit(fold(_msgs([first])))
    stats = store.commit(fold(_msgs([again], first_offset=5)))
    assert stats.dead_letters == 0 and stats.duplicates_dropped == 1
    assert fold(_msgs([first, again])).dead.num_rows == 0


def test_a_manager_event_id_seen_again_is_judged_the_same_in_one_batch_and_across_batches(store: FileStore) -> None:
    """(Found by review.) Manager events are not in events_seen: a repeat of their id is a duplicate either way."""
    from flightrec.schemas import ManagerEvent

    me = ManagerEvent(
        event_id="m-1",
        instance_id="i-1",
        boot_id="mgr",
        seq=0,
        ts_us=1_750_000_000_000_000,
        source_id="manager@x",
        kind="rented",
        detail="",
    )
    other = dataclasses.replace(me, kind="destroyed")
    one_batch = fold(_msgs([me, other]))
    assert one_batch.dead.num_rows == 0 and one_batch.duplicates == 1
    store.commit(fold(_msgs([me])))
    stats = store.commit(fold(_msgs([other], first_offset=5)))
    assert stats.dead_letters == 0
    assert store.con.execute("SELECT kind FROM manager_events").fetchall() == [("rented",)]
