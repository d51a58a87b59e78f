"""Record batches the Kafka client cannot parse: read again byte for byte, and kept as dead letters.

aiokafka parses a fetched batch record by record as the consumer drains it, and some bytes that any writer may
put on a topic (and that the broker accepts) make its parser raise: a header name that is not UTF-8 (decoded
before the record's offset is looked at, so no seek inside the batch gets past it), a batch compressed with a codec
whose library is not installed (snappy, lz4 and zstd without ``cramjam``). The exception leaves ``getmany`` with
no word of the partition, the batch stays where it is (every read raises again), and the records already drained
for other partitions in that call are lost to the caller while their positions moved on.

:class:`BatchReader` reads through such a failure. When ``getmany`` raises anything but a connection-type Kafka
error, it fetches every given partition's bytes at the caller's own next offset with a Fetch request of its own
(its own client: the consumer's is not public), splits them into batches, and parses each with aiokafka's own
parser, one batch at a time: a batch that parses gives its records as ``getmany`` would have; one that does not
gives one :class:`~flightrec.db.fold.RawMessage` per record with ``unreadable`` saying why (the fold makes each a
dead letter): its key and value where the records can still be split, else the batch's whole bytes in the first.
Then the consumer is positioned after what was given, for every partition: nothing is skipped and nothing read
twice, and the next ``getmany`` goes on past the unreadable batch.
"""

from __future__ import annotations

import logging
import struct
import zlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from aiokafka import AIOKafkaClient, AIOKafkaConsumer, TopicPartition
from aiokafka.errors import (
    ConsumerStoppedError,
    CorruptRecordException,
    IllegalStateError,
    KafkaError,
    UnsupportedCodecError,
)
from aiokafka.protocol.fetch import FetchRequest
from aiokafka.record.memory_records import MemoryRecords
from aiokafka.structs import ConsumerRecord
from flightrec.db.fold import Message, RawMessage

log = logging.getLogger(__name__)

CODEC_NAMES = {0: "uncompressed", 1: "gzip", 2: "snappy", 3: "lz4", 4: "zstd"}
BATCH_HEADER = 61  # bytes of a v2 batch before its records
PARTITION_FETCH_BYTES = 2 << 20  # as the materializer's consumer (max_partition_fetch_bytes)
FETCH_BYTES = 16 << 20
OFFSET_OUT_OF_RANGE = 1  # Kafka's error code
PARSE_ERRORS: tuple[type[BaseException], ...] = (UnsupportedCodecError, CorruptRecordException)


def is_parse_failure(exc: BaseException) -> bool:
    """Whether an exception out of ``getmany`` may be a batch the client cannot parse (not the broker away)."""
    if isinstance(exc, PARSE_ERRORS):
        return True
    return isinstance(exc, Exception) and not isinstance(exc, (KafkaError, ConsumerStoppedError, OSError))


# -- bytes ----------------------------------------------------------------------------------------------------------


def split_batches(data: bytes) -> Iterator[bytes]:
    """The whole batches in a fetched partition's bytes (a fetch may end inside one: that part is left out)."""
    i, n = 0, len(data)
    while n - i >= 12:
        length = struct.unpack_from(">i", data, i + 8)[0]
        end = i + 12 + length
        if length < 0 or end > n:
            return
        yield bytes(data[i:end])
        i = end


@dataclass(frozen=True)
class BatchHeader:
    """The fields of a batch's header that say which offsets it holds (magic 2; older magics: one offset)."""

    base_offset: int
    magic: int
    attributes: int = 0
    last_offset_delta: int = 0
    max_timestamp: int = -1
    count: int = 1

    @property
    def last_offset(self) -> int:
        return self.base_offset + max(0, self.last_offset_delta)

    @property
    def codec(self) -> str:
        return CODEC_NAMES.get(self.attributes & 0x07, f"codec {self.attributes & 0x07}")

    @staticmethod
    def parse(raw: bytes) -> BatchHeader:
        base, _length, _epoch, magic = struct.unpack_from(">qiib", raw, 0)
        if magic != 2 or len(raw) < BATCH_HEADER:
            return BatchHeader(base, magic)
        attributes, last_delta, _base_ts, max_ts = struct.unpack_from(">hiqq", raw, 21)
        count = struct.unpack_from(">i", raw, 57)[0]
        return BatchHeader(base, magic, attributes, last_delta, max_ts, count)


def _varint(buf: bytes, i: int) -> tuple[int, int]:
    shift = result = 0
    while True:
        b = buf[i]
        i += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return (result >> 1) ^ -(result & 1), i
        shift += 7
        if shift > 63:
            raise ValueError("varint too long")


def _sized(buf: bytes, i: int) -> tuple[bytes | None, int]:
    n, i = _varint(buf, i)
    if n < 0:
        return None, i
    if i + n > len(buf):
        raise ValueError("a length past the end of the records")
    return buf[i : i + n], i + n


@dataclass(frozen=True)
class RawRecord:
    """One record of a batch as bytes: nothing decoded."""

    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[bytes, bytes | None], ...]


MAX_INFLATED = 64 << 20  # a gzip batch inflating past this is not split (its bytes kept whole): no bomb fills memory


def _body(raw: bytes, head: BatchHeader) -> bytes:
    body = raw[BATCH_HEADER:]
    codec = head.attributes & 0x07
    if codec == 0:
        return body
    if codec == 1:
        inflate = zlib.decompressobj(wbits=31)  # gzip
        out = inflate.decompress(body, MAX_INFLATED)
        if inflate.unconsumed_tail or not inflate.eof:
            raise ValueError(f"a gzip body inflating past {MAX_INFLATED} bytes, or cut short")
        return out
    raise ValueError(f"{head.codec} cannot be decompressed here")


def raw_records(raw: bytes) -> list[RawRecord]:
    """Every record of a v2 batch with its key, value and headers as bytes; ValueError when they cannot be split."""
    head = BatchHeader.parse(raw)
    if head.magic != 2:
        raise ValueError(f"record batch magic {head.magic}")
    body = _body(raw, head)
    out, i = [], 0
    for _ in range(head.count):
        length, i = _varint(body, i)
        end = i + length
        if length < 0 or end > len(body):
            raise ValueError("a record longer than its batch")
        j = i + 1  # the record's attributes
        _ts, j = _varint(body, j)
        delta, j = _varint(body, j)
        key, j = _sized(body, j)
        value, j = _sized(body, j)
        n, j = _varint(body, j)
        headers = []
        for _h in range(n):
            name, j = _sized(body, j)
            hv, j = _sized(body, j)
            headers.append((name or b"", hv))
        out.append(RawRecord(head.base_offset + delta, key, value, tuple(headers)))
        i = end
    return out


# -- batches as messages --------------------------------------------------------------------------------------------


def _headers_text(headers: tuple[tuple[bytes, bytes | None], ...]) -> str:
    text = repr([name for name, _ in headers])
    return text if len(text) <= 200 else text[:200] + "…"


def unreadable(tp: TopicPartition, raw: bytes, why: str, start: int) -> list[Message]:
    """One dead-letter message per record of a batch the client could not parse (offsets from ``start`` on)."""
    head = BatchHeader.parse(raw)
    ts_type = 1 if head.attributes & 0x08 else 0
    ts = head.max_timestamp if head.max_timestamp >= 0 else None
    where = (
        f"unreadable: record batch at offsets {head.base_offset}..{head.last_offset} of {tp.topic} partition "
        f"{tp.partition} ({head.count} records, {head.codec}): the Kafka client cannot parse it ({why})"
    )
    try:
        records = raw_records(raw)
    except (ValueError, IndexError, struct.error, OSError, EOFError) as exc:
        log.debug("the records of %s cannot be split: %s", where, exc)
        count = max(1, min(head.count, head.last_offset - head.base_offset + 1))
        offsets = [head.base_offset + k for k in range(count)]
        return [
            RawMessage(
                tp.topic,
                tp.partition,
                o,
                None,
                raw if o == head.base_offset else None,
                ts,
                ts_type,
                unreadable=f"{where}; record {o - head.base_offset + 1} of {count}, the batch's bytes are in the "
                f"dead letter at offset {head.base_offset}",
            )
            for o in offsets
            if o >= start
        ]
    return [
        RawMessage(
            tp.topic,
            tp.partition,
            r.offset,
            r.key,
            r.value,
            ts,
            ts_type,
            unreadable=f"{where}; header names {_headers_text(r.headers)}",
        )
        for r in records
        if r.offset >= start
    ]


def parse_batch(tp: TopicPartition, raw: bytes, start: int) -> tuple[list[Message], int]:
    """The records of one batch at offsets from ``start`` (as ``getmany`` gives them) and the offset after it; a batch
    aiokafka cannot parse gives its records as unreadable messages instead."""
    head = BatchHeader.parse(raw)
    try:
        batch = MemoryRecords(raw).next_batch()
        if batch is None:
            return [], start
        if not batch.validate_crc():
            raise CorruptRecordException(f"invalid CRC of the batch at offset {head.base_offset}")
        nxt = batch.next_offset
        if batch.is_control_batch:
            return [], max(start, nxt)
        records: list[Message] = []
        for r in batch:
            if r.offset < start:
                continue
            records.append(
                ConsumerRecord(
                    tp.topic,
                    tp.partition,
                    r.offset,
                    r.timestamp,
                    r.timestamp_type,
                    r.key,
                    r.value,
                    r.checksum,
                    len(r.key) if r.key is not None else -1,
                    len(r.value) if r.value is not None else -1,
                    tuple(r.headers),
                )
            )
        return records, max(start, nxt)
    except Exception as exc:  # noqa: BLE001 - whatever the parser raises, the batch is kept as dead letters
        why = f"{type(exc).__name__}: {exc}"
        log.warning(
            "%s partition %d: the record batch at offsets %d..%d cannot be parsed (%s); its records are kept as "
            "dead letters and reading goes on after it",
            tp.topic,
            tp.partition,
            head.base_offset,
            head.last_offset,
            why,
        )
        return unreadable(tp, raw, why, start), max(start, head.last_offset + 1)


def parse_partition(tp: TopicPartition, data: bytes, start: int) -> tuple[list[Message], int, int]:
    """Every batch of a fetched partition's bytes from ``start``: (messages, the offset after them, unreadable
    messages among them)."""
    out: list[Message] = []
    bad = 0
    nxt = start
    for raw in split_batches(data):
        records, nxt = parse_batch(tp, raw, nxt)
        bad += sum(1 for r in records if isinstance(r, RawMessage) and r.unreadable is not None)
        out.extend(records)
    return out, nxt, bad


# -- reading --------------------------------------------------------------------------------------------------------


class BatchReader:
    """``getmany`` through batches the client cannot parse (the module's docstring). One per consumer."""

    def __init__(self, consumer: AIOKafkaConsumer, kafka_kwargs: Mapping[str, Any]) -> None:
        self.consumer = consumer
        self.kafka_kwargs = kafka_kwargs
        self._fetcher: AIOKafkaClient | None = None
        self.unreadable = 0  # messages of unparseable batches given so far

    async def getmany(
        self, positions: Mapping[TopicPartition, int | None], timeout_ms: int, max_records: int | None
    ) -> dict[TopicPartition, list[Message]]:
        """The consumer's next records; after a parse failure, each of ``positions`` (the caller's next offset per
        partition, None: from its beginning) read again here, unparseable batches as unreadable messages."""
        try:
            return dict(await self.consumer.getmany(timeout_ms=timeout_ms, max_records=max_records))
        except Exception as exc:
            if not is_parse_failure(exc):
                raise
            return await self.salvage(positions, exc)

    async def salvage(
        self, positions: Mapping[TopicPartition, int | None], exc: BaseException
    ) -> dict[TopicPartition, list[Message]]:
        """Read every assigned partition from the caller's next offset (a partition the caller does not track: from
        the consumer's position; its records are the caller's to drop) byte for byte; position the consumer after
        what is given. Raises ``exc`` when nothing was there to read (the failure was not a batch)."""
        c = self.consumer
        starts: dict[TopicPartition, int] = {}
        fresh = []
        for tp in c.assignment():
            if tp not in positions:
                starts[tp] = await c.position(tp)
            elif (known := positions[tp]) is None:
                fresh.append(tp)
            else:
                starts[tp] = known
        if fresh:
            starts.update(await c.beginning_offsets(fresh))
        if not starts:
            raise KafkaError(f"reading failed ({type(exc).__name__}: {exc}) with no partition assigned") from exc
        fetched = await self._fetch(starts)
        out: dict[TopicPartition, list[Message]] = {}
        bad = 0
        for tp, start in starts.items():
            data = fetched.get(tp)
            records, nxt, n_bad = parse_partition(tp, data, start) if data else ([], start, 0)
            bad += n_bad
            if records:
                out[tp] = records
            try:
                c.seek(tp, nxt)
            except IllegalStateError:  # no longer assigned (a group's rebalance): its records are not the caller's
                out.pop(tp, None)
        if not out:  # nothing to read again here (a leader unknown just now, a partition moved): the caller retries
            raise KafkaError(
                f"reading failed ({type(exc).__name__}: {exc}) and the partitions read again byte for byte gave "
                "nothing to take; retrying"
            ) from exc
        self.unreadable += bad
        return out

    async def _fetch(self, starts: Mapping[TopicPartition, int]) -> dict[TopicPartition, bytes]:
        """Each partition's bytes from its start offset (Fetch requests to the partitions' leaders)."""
        if self._fetcher is None:
            self._fetcher = AIOKafkaClient(**self.kafka_kwargs)
            await self._fetcher.bootstrap()
        client = self._fetcher
        await client.force_metadata_update()
        by_node: dict[int, list[TopicPartition]] = {}
        for tp in starts:
            leader = client.cluster.leader_for_partition(tp)
            if leader is not None and leader >= 0:
                by_node.setdefault(leader, []).append(tp)
        out: dict[TopicPartition, bytes] = {}
        for node, tps in by_node.items():
            topics: dict[str, list[tuple[int, int, int]]] = {}
            for tp in tps:
                topics.setdefault(tp.topic, []).append((tp.partition, starts[tp], PARTITION_FETCH_BYTES))
            request = FetchRequest(0, 0, FETCH_BYTES, 0, list(topics.items()))
            response = await client.send(node, request)
            for topic, partitions in response.topics:
                for partition, error_code, _highwater, *rest in partitions:
                    if error_code == 0:
                        out[TopicPartition(topic, partition)] = bytes(rest[-1] or b"")
                    else:
                        log.warning("fetching %s partition %d again: error code %d", topic, partition, error_code)
        return out

    async def close(self) -> None:
        if self._fetcher is not None:
            client, self._fetcher = self._fetcher, None
            await client.close()
