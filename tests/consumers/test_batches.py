"""Record batches read byte for byte (consumers/batches.py), without a broker: every codec Kafka allows, header names
of any bytes, a fetch cut inside a batch; what aiokafka parses comes out as it would, the rest as dead letters."""

from __future__ import annotations

import pytest
from aiokafka import TopicPartition
from flightrec.consumers.batches import BatchHeader, parse_batch, parse_partition, raw_records, split_batches
from flightrec.db.fold import RawMessage, fold
from flightrec.schemas import encode
from materializer_helpers import Boot
from rawkafka import CODECS, RawRecord, record_batch

TP = TopicPartition("flightrec.lifecycle", 3)


def _boot_records(n: int = 4) -> list[RawRecord]:
    b = Boot()
    for k in range(n):
        b.stage_ok(f"s{k}")
    return [RawRecord(e.instance_id.encode(), encode(e), ((b"h", b"v"),)) for e in b.events if e.topic == TP.topic]


def _readable_here(codec: str) -> bool:
    """Whether aiokafka has the codec's library here (snappy, lz4, zstd: cramjam, not in the test venv)."""
    from aiokafka import codec as codecs

    return {"none": True, "gzip": True}.get(codec) or getattr(codecs, f"has_{codec}")()


@pytest.mark.parametrize("codec", sorted(CODECS))
def test_each_codec_is_read_or_kept_whole(codec: str) -> None:
    records = _boot_records()
    raw = record_batch(records, codec, base_timestamp=1_700_000_000_000)
    got, nxt = parse_batch(TP, raw, 0)
    assert nxt == len(records)
    assert [m.offset for m in got] == list(range(len(records)))
    if _readable_here(codec):
        assert [(m.key, m.value) for m in got] == [(r.key, r.value) for r in records]
        assert all(getattr(m, "unreadable", None) is None for m in got)
        return
    # the client has no library for the codec: one dead letter per record, the batch's bytes in the first
    assert all(isinstance(m, RawMessage) and m.unreadable for m in got)
    assert got[0].value == raw and all(m.value is None for m in got[1:])
    assert f"({len(records)} records, {codec})" in got[0].unreadable
    delta = fold(got)
    assert delta.dead.num_rows == len(records) and delta.events.num_rows == 0
    assert delta.offsets == {(TP.topic, TP.partition): len(records)}


def test_a_header_name_not_utf8_makes_every_record_of_its_batch_a_dead_letter_with_its_own_bytes() -> None:
    records = _boot_records()
    records[2] = RawRecord(records[2].key, records[2].value, ((b"\xff\xfe", None),))
    raw = record_batch(records)
    got, nxt = parse_batch(TP, raw, 1)  # from offset 1: the record before the caller's position is not given again
    assert nxt == len(records)
    assert [m.offset for m in got] == list(range(1, len(records)))
    assert [(m.key, m.value) for m in got] == [(r.key, r.value) for r in records[1:]]
    assert all("UnicodeDecodeError" in m.unreadable for m in got)
    assert "b'\\xff\\xfe'" in got[1].unreadable
    delta = fold(got)
    dead = delta.dead.to_pylist()
    assert len(dead) == len(records) - 1 and delta.events.num_rows == 0
    assert {d["instance_id"] for d in dead} == {records[0].key.decode()}  # what each record claims, when it decodes
    assert [d["value"] for d in dead] == [r.value for r in records[1:]]


def test_header_names_and_values_of_any_utf8_and_null_are_read() -> None:
    records = [RawRecord(None, None, (("名前".encode(), b"\x00\xff"), (b"", None))), RawRecord(b"k", b"", ())]
    got, _ = parse_batch(TP, record_batch(records), 0)
    assert [(m.key, m.value, tuple(m.headers)) for m in got] == [
        (None, None, (("名前", b"\x00\xff"), ("", None))),
        (b"k", b"", ()),
    ]


def test_a_fetch_cut_inside_a_batch_gives_the_whole_batches_before_it() -> None:
    first = _boot_records(2)
    one, two = record_batch(first), record_batch(_boot_records(3))
    data = one + two[: len(two) // 2]
    assert list(split_batches(data)) == [one]
    got, nxt, bad = parse_partition(TP, data, 0)
    assert (len(got), nxt, bad) == (len(first), len(first), 0)


def test_the_records_of_a_batch_split_by_hand_agree_with_aiokafka() -> None:
    records = _boot_records(3)
    raw = record_batch(records, "gzip")
    assert [(r.offset, r.key, r.value, r.headers) for r in raw_records(raw)] == [
        (i, r.key, r.value, r.headers) for i, r in enumerate(records)
    ]
    head = BatchHeader.parse(raw)
    assert (head.base_offset, head.count, head.last_offset, head.codec) == (0, len(records), len(records) - 1, "gzip")


def test_a_gzip_body_that_inflates_past_the_bound_is_kept_whole_not_inflated() -> None:
    import gzip
    import struct

    from flightrec.consumers.batches import BATCH_HEADER, MAX_INFLATED, unreadable

    head = bytearray(record_batch(_boot_records(1), "gzip")[:BATCH_HEADER])
    body = gzip.compress(b"\0" * (MAX_INFLATED + 1), compresslevel=1)
    struct.pack_into(">i", head, 8, len(head) + len(body) - 12)  # the batch length
    raw = bytes(head) + body
    with pytest.raises(ValueError, match="inflating past"):
        raw_records(raw)
    kept = unreadable(TP, raw, "UnicodeDecodeError: test", 0)
    assert kept[0].value == raw and "the batch's bytes are in the dead letter at offset 0" in kept[0].unreadable
