"""The clock offset is judged from messages sent in real time: the sender's send-time header against Kafka's append
time, never an event's own time after it waited in a spool (the demo's h100-01, flushed a minute after its network
came back, was accused of a wrong clock). Record headers are hostile input: nothing in them stops anything."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from flightrec.db.filestore import FileStore
from flightrec.db.fold import LOG_APPEND_TIME, RawMessage, fold
from flightrec.db.query import run_query
from flightrec.db.views import VIEWS
from flightrec.schemas import Heartbeat, Lifecycle, encode
from flightrec.schemas.sendtime import SENT_HEADER, sent_header, sent_us_of
from hypothesis import given
from hypothesis import strategies as st
from materializer_helpers import Boot

S = 1_000_000
NOW = 1_790_000_000_000_000


def _boot(t0: int, beats: int = 8) -> Boot:
    b = Boot(t0=t0)
    b.facts()
    b.add(Lifecycle, stage="supervisor", state="started")
    for _ in range(beats):
        b.add(Heartbeat, stage="supervisor", interval_s=3600.0)
    return b


def _msgs(events: list[Any], recv_us: int, headers: list[tuple[Any, ...]]) -> list[RawMessage]:
    return [
        RawMessage(e.topic, 0, n, e.instance_id.encode(), encode(e), recv_us // 1000, LOG_APPEND_TIME, h)
        for n, (e, h) in enumerate(zip(events, headers, strict=True))
    ]


def _status(db: Path, instance: str) -> dict[str, Any]:
    rows = run_query(db, "SELECT * FROM fleet WHERE instance_id = ?", [instance], prelude=VIEWS).to_pylist()
    assert rows, instance
    return rows[0]


def _commit(db: Path, msgs: list[RawMessage]) -> None:
    store = FileStore(db, group="send-time")
    try:
        store.commit(fold(msgs))
    finally:
        store.close()


def test_events_spooled_ten_minutes_and_flushed_by_a_right_clock_are_no_clock_skew(tmp_path: Path) -> None:
    """The network was cut: the events happened 10 min before Kafka got them, the flush sent them just now."""
    db = tmp_path / "f.duckdb"
    recv = time.time_ns() // 1000
    b = _boot(recv - 600 * S)
    _commit(db, _msgs(b.events, recv, [(sent_header(recv - 20_000),)] * len(b.events)))
    row = _status(db, b.instance)
    assert row["clock_offset_s"] == pytest.approx(0, abs=0.1) and not row["clock_skewed"], row


def test_a_clock_two_minutes_ahead_is_still_named(tmp_path: Path) -> None:
    db = tmp_path / "f.duckdb"
    recv = time.time_ns() // 1000
    b = _boot(recv + 120 * S)
    _commit(db, _msgs(b.events, recv, [(sent_header(recv + 120 * S),)] * len(b.events)))
    row = _status(db, b.instance)
    assert row["clock_offset_s"] == pytest.approx(120, abs=0.1) and row["clock_skewed"], row


def test_without_a_send_time_no_clock_is_judged(tmp_path: Path) -> None:
    """An older agent sends no header: its events' own times say nothing about its clock (they may have waited)."""
    db = tmp_path / "f.duckdb"
    recv = time.time_ns() // 1000
    b = _boot(recv - 600 * S)
    _commit(db, _msgs(b.events, recv, [()] * len(b.events)))
    row = _status(db, b.instance)
    assert row["clock_offset_s"] is None and not row["clock_skewed"], row


HOSTILE: list[Any] = [
    None,
    (),
    5,
    "flightrec-sent-us",
    [("flightrec-sent-us",)],
    [("flightrec-sent-us", b"\xff\xfe\x00")],  # not UTF-8
    [("flightrec-sent-us", b"")],
    [("flightrec-sent-us", b"-1790000000000000")],
    [("flightrec-sent-us", b" 1790000000000000")],
    [("flightrec-sent-us", "1790000000000000")],  # text, not bytes
    [("flightrec-sent-us", None)],
    [("flightrec-sent-us", "１７９".encode())],  # digits, but not ASCII
    [("flightrec-sent-us", b"9" * 10_000)],  # a huge number
    [("flightrec-sent-us", b"9999999999999999")],  # 2286: outside the sane window
    [("flightrec-sent-us", b"1790000000000000"), ("flightrec-sent-us", b"1790000000000001")],  # which one?
    [(b"\xff", b"1"), (None, None), object()],
]


@pytest.mark.parametrize("headers", HOSTILE, ids=range(len(HOSTILE)))
def test_a_hostile_header_is_no_send_time_and_stops_nothing(headers: Any) -> None:
    assert sent_us_of(headers) is None
    b = _boot(NOW, beats=1)
    msgs = [
        RawMessage(e.topic, 0, n, e.instance_id.encode(), encode(e), NOW // 1000, LOG_APPEND_TIME, headers)
        for n, e in enumerate(b.events)
    ]
    d = fold(msgs)
    assert d.dead.num_rows == 0 and d.events.num_rows == len(b.events)
    assert d.events.column("sent_us").to_pylist() == [None] * len(b.events)


def test_the_send_time_is_read_from_bytes_or_text_names() -> None:
    assert sent_us_of([(SENT_HEADER, b"1790000000000000")]) == 1_790_000_000_000_000
    assert sent_us_of([(SENT_HEADER.encode(), b"1790000000000000"), ("other", b"x")]) == 1_790_000_000_000_000


class _Raises:
    def __iter__(self) -> Any:
        raise RuntimeError("hostile iterable")


@given(st.lists(st.tuples(st.one_of(st.text(), st.binary()), st.one_of(st.binary(), st.none(), st.text()))))
def test_any_headers_give_a_send_time_or_none_and_never_raise(headers: list[tuple[Any, Any]]) -> None:
    got = sent_us_of(headers)
    assert got is None or isinstance(got, int)
    assert sent_us_of(_Raises()) is None


def test_the_headers_fit_the_room_the_sender_keeps_for_them() -> None:
    """The send time and the longest writer's tag together fit HEADER_ROOM (a part cut to the limit stays under)."""
    from aiokafka.record.default_records import DefaultRecordBatchBuilder
    from flightrec.producer.deliver import HEADER_ROOM
    from flightrec.schemas.auth import HEADER

    tag = (HEADER, b"x" * 200)  # '<key id> <64 hex>': a key id of 'instance/µs/random' is far below 135 bytes
    with_headers = DefaultRecordBatchBuilder.estimate_size_in_bytes(b"k", b"v", [sent_header(NOW), tag])
    assert with_headers - DefaultRecordBatchBuilder.estimate_size_in_bytes(b"k", b"v", []) < HEADER_ROOM
