"""Issue 23, hostile clocks, without a broker: the fold keeps Kafka's receive time, and liveness, the clock offset,
the latest boot and the destroy rule follow it, never the instance's own clock; an older file gains the columns."""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

import duckdb
import pytest
from flightrec.db.filestore import FileStore
from flightrec.db.fold import CREATE_TIME, LOG_APPEND_TIME, RawMessage, fold, received_us
from flightrec.db.query import run_query
from flightrec.db.views import VIEWS
from flightrec.schemas import Heartbeat, Lifecycle, ManagerEvent, encode
from flightrec.schemas.sendtime import sent_header
from materializer_helpers import Boot

from flightrec.errors import QueryError

S = 1_000_000
HOUR = 3600 * S


def _now() -> int:
    return time.time_ns() // 1000


def _msgs(
    events: list[Any],
    recv_us: list[int | None] | int | None,
    kind: int = LOG_APPEND_TIME,
    first_offset: int = 0,
    sent_us: list[int] | None = None,
) -> list[RawMessage]:
    """Records as a consumer reads them: each with Kafka's timestamp (ms) of ``kind``, or none, and the sender's
    send-time header (``sent_us``; by default each event's own time: sent as it happened, by the same clock)."""
    times = recv_us if isinstance(recv_us, list) else [recv_us] * len(events)
    sent = sent_us if sent_us is not None else [e.ts_us for e in events]
    return [
        RawMessage(
            e.topic,
            0,
            first_offset + n,
            e.instance_id.encode(),
            encode(e),
            None if t is None else t // 1000,
            None if t is None else kind,
            (sent_header(s),),
        )
        for n, (e, t, s) in enumerate(zip(events, times, sent, strict=True))
    ]


def _commit(db: Path, *batches: list[RawMessage]) -> None:
    store = FileStore(db, group="clocks")
    try:
        for batch in batches:
            store.commit(fold(batch))
    finally:
        store.close()


def _status(db: Path, instance: str) -> dict[str, Any]:
    rows = run_query(db, "SELECT * FROM fleet WHERE instance_id = ?", [instance], prelude=VIEWS).to_pylist()
    assert rows, instance
    return rows[0]


def _running(t0: int, beats: int = 3, interval: float = 1.0) -> Boot:
    """A boot whose stage runs and heartbeats, its events stamped from ``t0`` on (the instance's clock)."""
    b = Boot(t0=t0)
    b.facts()
    b.add(Lifecycle, stage="benchmark", state="started")
    for _ in range(beats):
        b.add(Heartbeat, stage="benchmark", interval_s=interval)
    return b


def test_the_fold_keeps_the_brokers_time_and_only_that():
    hb = _running(1_750_000_000_000_000, beats=1).events[-1]
    now = _now() // 1000 * 1000
    assert received_us(RawMessage("t", 0, 0, None, b"", now // 1000, LOG_APPEND_TIME)) == now
    # CreateTime is the sender's clock (the instance's): no better than ts_us, so no receive time
    assert received_us(RawMessage("t", 0, 0, None, b"", now // 1000, CREATE_TIME)) is None
    assert received_us(RawMessage("t", 0, 0, None, b"")) is None
    assert received_us(RawMessage("t", 0, 0, None, b"", -1, LOG_APPEND_TIME)) is None  # outside the sane window
    assert received_us(RawMessage("t", 0, 0, None, b"", 2**62, LOG_APPEND_TIME)) is None
    d = fold(_msgs([hb], now) + _msgs([hb], now + S, CREATE_TIME, first_offset=1))
    assert d.events.column("recv_us").to_pylist() == [now] and d.heartbeats.column("recv_us").to_pylist() == [now]
    assert d.duplicates == 1  # the first copy (by offset) wins: a replay keeps the same one
    assert fold(_msgs([hb], 2**62 * 1000)).dead.num_rows == 0  # an absurd broker time never loses the event


def test_a_clock_an_hour_behind_heartbeating_is_running_and_one_ahead_and_silent_is_lost(tmp_path):
    db = tmp_path / "f.duckdb"
    now = _now()
    behind = _running(now - HOUR, interval=60.0)  # beats now, stamps an hour ago (a minute's interval: a loaded
    # machine's seconds between the commit and the read are no silence)
    ahead = _running(now + HOUR)  # stamps an hour ahead, heard from last a minute ago
    quiet_ok = _running(now - 60 * S, interval=3600.0)  # a right clock: silent a minute at a 1 h interval
    _commit(db, _msgs(behind.events, now), _msgs(ahead.events, now - 60 * S), _msgs(quiet_ok.events, now - 60 * S))
    b, a, q = _status(db, behind.instance), _status(db, ahead.instance), _status(db, quiet_ok.instance)
    assert b["status"] == "running" and b["liveness_clock"] == "receiver", b
    assert a["status"] == "lost" and a["status_detail"].startswith("lost contact 6"), a
    assert q["status"] == "running" and not q["clock_skewed"]
    assert b["clock_offset_s"] == pytest.approx(-3600, abs=1) and b["clock_skewed"]
    assert a["clock_offset_s"] == pytest.approx(3660, abs=1) and a["clock_skewed"]
    assert abs(q["clock_offset_s"]) < 1
    assert a["last_heard_us"] == (now - 60 * S) // 1000 * 1000  # the broker's time of the last event, ms precision
    boots = run_query(
        db,
        "SELECT instance_id, first_recv_us, last_recv_us, clock_offset_us FROM boots WHERE instance_id = ?",
        [behind.instance],
    ).to_pylist()
    assert boots[0]["last_recv_us"] == now // 1000 * 1000 and boots[0]["clock_offset_us"] < -HOUR + 2 * S
    inst = run_query(
        db, "SELECT last_recv_us, clock_offset_us FROM instances WHERE instance_id = ?", [ahead.instance]
    ).to_pylist()[0]
    assert inst["last_recv_us"] == (now - 60 * S) // 1000 * 1000 and inst["clock_offset_us"] > HOUR


def test_without_receive_times_liveness_falls_back_to_the_instances_clock_and_says_so(tmp_path):
    db = tmp_path / "f.duckdb"
    now = _now()
    behind = _running(now - HOUR, interval=60.0)
    _commit(db, _msgs(behind.events, now, CREATE_TIME))  # an operator's CreateTime topic
    row = _status(db, behind.instance)
    assert row["liveness_clock"] == "instance" and row["clock_offset_s"] is None and not row["clock_skewed"]
    assert row["status"] == "lost" and row["status_detail"].endswith("by its own clock)"), row
    # the topic switched to LogAppendTime: from its next records on, the receiver's clock judges
    more = Boot(instance=behind.instance, boot=behind.boot, t0=now - HOUR)
    more.events = list(behind.events)
    more.add(Heartbeat, stage="benchmark", interval_s=60.0)
    _commit(db, _msgs(more.events[-1:], now, first_offset=100))
    row = _status(db, behind.instance)
    assert row["liveness_clock"] == "receiver" and row["status"] == "running" and row["clock_offset_s"] < -3000


@pytest.mark.slow
def test_the_offset_is_the_median_of_the_latest_events_robust_to_late_ones_and_following_a_fixed_clock(tmp_path):
    db = tmp_path / "f.duckdb"
    now = _now()
    b = _running(now, beats=60, interval=3600.0)
    n = len(b.events)
    # the clock ran 10 s ahead; 5 of the latest 32 events were sent 10 min late (they waited in the spool while
    # Kafka was away: their send time says so) and 5 more were taken 10 min late by Kafka (a retry; their send
    # time does not)
    recv = [e.ts_us - 10 * S for e in b.events]
    sent = [e.ts_us for e in b.events]
    for i in range(n - 20, n - 15):
        recv[i] = b.events[i].ts_us + 600 * S
        sent[i] = recv[i] + 10 * S
    for i in range(n - 10, n - 5):
        recv[i] = b.events[i].ts_us + 600 * S
    _commit(db, _msgs(b.events, recv, sent_us=sent))
    assert _status(db, b.instance)["clock_offset_s"] == pytest.approx(10, abs=0.01)
    # NTP set the clock right mid-boot: 40 more events 0 s off; the offset follows within the 32 latest
    fixed = Boot(instance=b.instance, boot=b.boot, t0=now + 100 * S)
    fixed.events = list(b.events)
    for _ in range(40):
        fixed.add(Heartbeat, stage="benchmark", interval_s=3600.0)
    new = fixed.events[n:]
    _commit(db, _msgs(new, [e.ts_us for e in new], first_offset=n))
    assert _status(db, b.instance)["clock_offset_s"] == pytest.approx(0, abs=0.01)
    # the same events in other batches give the same rows (replay equals live)
    other = tmp_path / "other.duckdb"
    msgs = _msgs(b.events, recv, sent_us=sent) + _msgs(new, [e.ts_us for e in new], first_offset=n)
    _commit(other, *[msgs[i : i + 7] for i in range(0, len(msgs), 7)][::-1])
    for table in ("boots", "instances", "heartbeats", "events_seen"):
        assert run_query(db, f"SELECT * FROM {table} ORDER BY ALL").equals(
            run_query(other, f"SELECT * FROM {table} ORDER BY ALL")
        ), table


def test_the_latest_boot_and_the_destroy_rule_follow_the_receive_time(tmp_path):
    """The boot received last is the latest; a destroy counts when it came after the boot began by either clock."""
    db = tmp_path / "f.duckdb"
    now = _now()
    inst = f"i-{uuid.uuid4().hex[:8]}"
    first = _running(now + HOUR)  # booted with a clock an hour ahead ...
    first.instance = inst
    first.events = []
    first.add(Lifecycle, stage="benchmark", state="started")
    second = Boot(instance=inst, t0=now - 5 * S)  # ... rebooted with the clock set right
    second.add(Lifecycle, stage="supervisor", state="started")
    second.add(Heartbeat, stage="supervisor", interval_s=3600.0)
    _commit(db, _msgs(first.events, now - 600 * S), _msgs(second.events, now - 5 * S, first_offset=10))
    assert run_query(db, "SELECT boot_id FROM instances WHERE instance_id = ?", [inst]).to_pylist() == [
        {"boot_id": second.boot}
    ]
    assert _status(db, inst)["status"] == "running"
    # the manager destroys it (its clock right, the instance's an hour ahead): destroyed, not lost
    ahead = _running(now + HOUR, interval=3600.0)
    gone = ManagerEvent(
        event_id=str(uuid.uuid4()),
        instance_id=ahead.instance,
        boot_id="mgr",
        seq=0,
        ts_us=now,
        source_id="manager@test",
        kind="destroyed",
    )
    _commit(db, _msgs(ahead.events, now - 30 * S, first_offset=20), _msgs([gone], now, first_offset=40))
    assert _status(db, ahead.instance)["status"] == "destroyed"
    # its network cut, its events reach Kafka from its spool only after the manager destroyed it: still destroyed
    cut = _running(now - 600 * S, interval=3600.0)
    gone = ManagerEvent(
        event_id=str(uuid.uuid4()),
        instance_id=cut.instance,
        boot_id="mgr",
        seq=1,
        ts_us=now - 60 * S,
        source_id="manager@test",
        kind="destroyed",
    )
    _commit(db, _msgs([gone], now - 60 * S, first_offset=50), _msgs(cut.events, now, first_offset=60))
    assert _status(db, cut.instance)["status"] == "destroyed"


def test_a_database_made_before_receive_times_gains_them_at_the_first_open(tmp_path):
    db = tmp_path / "old.duckdb"
    now = _now()
    b = _running(now - HOUR)
    _commit(db, _msgs(b.events, None))
    con = duckdb.connect(str(db))
    for table, column in (
        ("events_seen", "recv_us"),
        ("manager_events", "recv_us"),
        ("heartbeats", "last_recv_us"),
        ("boots", "first_recv_us"),
        ("boots", "last_recv_us"),
        ("boots", "clock_offset_us"),
        ("instances", "last_recv_us"),
        ("instances", "clock_offset_us"),
    ):
        con.execute(f"ALTER TABLE {table} DROP COLUMN {column}")  # as the release before them made the file
    before = con.execute("SELECT * FROM boots").fetchall()
    con.close()
    with pytest.raises(QueryError, match="older flightrec"):  # a reader before any writer: says what to do
        _status(db, b.instance)
    FileStore(db, group="clocks").close()  # a writer opens it: the columns are added, the rows kept
    row = _status(db, b.instance)
    assert row["liveness_clock"] == "instance" and row["status"] == "lost"  # no receive time known: as before
    con = duckdb.connect(str(db), read_only=True)
    assert (
        con.execute("SELECT * EXCLUDE (first_recv_us, last_recv_us, clock_offset_us) FROM boots").fetchall() == before
    )
    con.close()
    more = Boot(instance=b.instance, boot=b.boot, t0=now - HOUR)
    more.events = list(b.events)
    more.add(Heartbeat, stage="benchmark", interval_s=1.0)
    recv = _now()  # received now (on a loaded machine, seconds after the test began), sent an hour behind
    _commit(db, _msgs(more.events[-1:], recv, first_offset=50, sent_us=[recv - HOUR]))
    row = _status(db, b.instance)
    assert row["liveness_clock"] == "receiver" and row["status"] == "running"
    assert row["clock_offset_s"] == pytest.approx(-3600, abs=1)


def test_the_timelines_silences_are_measured_on_the_receivers_clock():
    from flightrec.consumers.timeline import liveness_entries
    from flightrec.db.liveness import heartbeat_gaps

    # beats 30 s apart by Kafka's clock; the instance's clock jumped an hour ahead between the first two
    beats = [
        {"boot_id": "b", "seq": i, "ts_us": t, "stage": "s", "recv_us": r}
        for i, (t, r) in enumerate([(0, 0), (HOUR, 30 * S), (HOUR + 30 * S, 60 * S)])
    ]
    assert heartbeat_gaps(beats, {"b": 30.0}) == []  # a jump of its clock is no silence
    # dead since Kafka last heard of it 140 s ago: an open gap, though its own clock is an hour ahead of now
    gaps = heartbeat_gaps(beats, {"b": 30.0}, now_us=200 * S, last_recv_us={"b": 60 * S})
    assert [(g.since_us, g.until_us, g.heard_us) for g in gaps] == [(HOUR + 30 * S, None, 60 * S)]
    assert heartbeat_gaps(beats, {"b": 30.0}, now_us=100 * S, last_recv_us={"b": 60 * S}) == []
    (entry,) = liveness_entries([], gaps, now=200 * S)
    assert "lost contact 2 min ago" in entry.text  # 140 s
    # a real silence between beats is measured by Kafka's clock too
    beats.append({"boot_id": "b", "seq": 3, "ts_us": HOUR + 60 * S, "stage": "s", "recv_us": 400 * S})
    (gap,) = heartbeat_gaps(beats, {"b": 30.0})
    assert gap.length_us == 340 * S and "for 5 min" in liveness_entries([], [gap])[0].text
