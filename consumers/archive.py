"""The archive: the topics' raw records kept in Parquet files on any disk or object store, so that a database lost
with its disk can be rebuilt after Kafka let the records go (``flightrec archive``, ``flightrec replay``).

A record is kept as Kafka holds it: topic, partition, offset, timestamp and its type (the broker's append time
liveness and retention judge by), key, value (the Avro bytes) and headers (the writer's tag); a record of a batch the
Kafka client cannot parse as the materializer reads it (consumers/batches.py: its bytes, and why in ``unreadable``);
so a replay from the archive is the same replay as from the topics, its dead letters included. Layout, under the
archive's root (a folder, or a URL such as ``s3://bucket/prefix`` that pyarrow's file systems take)::

    <topic>/<partition>/<first>-<last>-<newest>.parquet

A *segment* covers every offset from ``first`` to ``last`` of its partition (a record purged since is simply
absent); ``newest`` is its newest record's timestamp (ms), by which the archive's own retention
(``FLIGHTREC_ARCHIVE_KEEP_DAYS``) drops whole segments, oldest first. The segments of a partition follow one another
without a hole, unless Kafka had already let records go before the archiver read them (said in the archiver's log,
and by a replay). The archive's position, the next offset of each partition, is read from the names: nothing else
is kept. A segment appears whole or not at all (a local one is written beside and renamed; an object store shows an
upload once it completed), so a killed archiver leaves nothing half written and starts again from the names.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaError
from flightrec.consumers.batches import BatchReader
from flightrec.db.fold import RawMessage
from pyarrow import fs as pafs

from flightrec.cluster import topic_partitions
from flightrec.errors import ConfigError, MaterializeError

log = logging.getLogger(__name__)
SCHEMA = pa.schema(
    [
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("timestamp", pa.int64()),  # ms since the epoch, as Kafka gives it
        ("timestamp_type", pa.int8()),  # 0 CreateTime (the sender's clock), 1 LogAppendTime (the broker's)
        ("key", pa.binary()),
        ("value", pa.binary()),
        ("headers", pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))),
        # why the record's batch could not be parsed (consumers/batches.py: a dead letter at any replay); else null
        ("unreadable", pa.string()),
    ]
)
NAME = re.compile(r"(\d{20})-(\d{20})-(\d{13})\.parquet")
ROLL_S = 600.0  # a partition's records are written out at least this often (Kafka must keep them longer)
ROLL_BYTES = 64 << 20  # or once this many value bytes are held for it
HELD_BYTES = 256 << 20  # all partitions together: past it, the largest is written out
READ_BYTES = 16 << 20  # a replay folds the archive in batches of about this many value bytes


@dataclass(frozen=True, order=True)
class Segment:
    """One file of the archive: offsets ``first``..``last`` of a partition; ``newest``: its newest timestamp (ms)."""

    topic: str
    partition: int
    first: int
    last: int
    newest: int
    path: str = field(compare=False)

    @property
    def name(self) -> str:
        return f"{self.first:020d}-{self.last:020d}-{self.newest:013d}.parquet"


def open_archive(uri: str) -> tuple[pafs.FileSystem, str]:
    """The file system and the root path of an archive (a folder, or a URL pyarrow takes: s3://, gs://, hdfs://)."""
    if not uri:
        raise ConfigError("no archive given: set FLIGHTREC_ARCHIVE (a folder or e.g. s3://bucket/prefix)")
    if "://" not in uri:
        return pafs.LocalFileSystem(), str(Path(uri).expanduser().resolve())
    try:
        filesystem, path = pafs.FileSystem.from_uri(uri)
    except (pa.ArrowException, ValueError) as exc:
        raise ConfigError(f"FLIGHTREC_ARCHIVE={uri!r}: {exc}") from exc
    return filesystem, path.rstrip("/")


class Archive:
    """The segments under one root: listing, reading, writing, deleting (any pyarrow file system)."""

    def __init__(self, uri: str) -> None:
        self.uri = uri
        self.fs, self.root = open_archive(uri)
        self.local = isinstance(self.fs, pafs.LocalFileSystem)

    def _dir(self, topic: str, partition: int) -> str:
        return f"{self.root}/{topic}/{partition}"

    def partitions(self) -> list[tuple[str, int]]:
        """Every (topic, partition) the archive holds a folder for."""
        out = []
        for t in self.fs.get_file_info(pafs.FileSelector(self.root, allow_not_found=True)):
            if t.type != pafs.FileType.Directory:
                continue
            for p in self.fs.get_file_info(pafs.FileSelector(t.path, allow_not_found=True)):
                if p.type == pafs.FileType.Directory and p.base_name.isdigit():
                    out.append((t.base_name, int(p.base_name)))
        return sorted(out)

    def segments(self, topic: str, partition: int) -> list[Segment]:
        """The partition's segments, in offset order."""
        found = []
        for info in self.fs.get_file_info(pafs.FileSelector(self._dir(topic, partition), allow_not_found=True)):
            m = NAME.fullmatch(info.base_name)
            if m and info.type == pafs.FileType.File:
                first, last, newest = (int(g) for g in m.groups())
                found.append(Segment(topic, partition, first, last, newest, info.path))
        return sorted(found)

    def position(self, topics: Iterable[str] | None = None) -> dict[tuple[str, int], int]:
        """The next offset the archive will hold, per partition it holds any of."""
        wanted = None if topics is None else set(topics)
        out = {}
        for topic, partition in self.partitions():
            if wanted is not None and topic not in wanted:
                continue
            segs = self.segments(topic, partition)
            if segs:
                out[(topic, partition)] = segs[-1].last + 1
        return out

    def write(self, topic: str, partition: int, first: int, last: int, table: pa.Table) -> Segment:
        """One segment, whole or not at all; returns it."""
        newest = int(pa.compute.max(table["timestamp"]).as_py() or 0) if table.num_rows else 0
        seg = Segment(topic, partition, first, last, max(0, newest), "")
        path = f"{self._dir(topic, partition)}/{seg.name}"
        self._put(path, table)
        return Segment(topic, partition, first, last, seg.newest, path)

    def _put(self, path: str, table: pa.Table) -> None:
        if not self.local:  # an object store shows an upload once it is complete
            self.fs.create_dir(path.rsplit("/", 1)[0], recursive=True)
            with self.fs.open_output_stream(path) as out:
                pq.write_table(table, out, compression="zstd")
            return
        folder = Path(path).parent
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / f".{Path(path).name}.{uuid.uuid4().hex[:8]}.tmp"
        try:
            with open(tmp, "wb") as f:
                pq.write_table(table, f, compression="zstd")
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def read(self, seg: Segment) -> pa.Table:
        with self.fs.open_input_file(seg.path) as f:
            return pq.read_table(f, schema=SCHEMA)

    def replace(self, seg: Segment, table: pa.Table) -> None:
        """Write ``seg`` again with ``table`` (a purge), under the same name."""
        self._put(seg.path, table.cast(SCHEMA))

    def delete(self, seg: Segment) -> None:
        self.fs.delete_file(seg.path)


def to_table(records: Iterable[Any]) -> pa.Table:
    """Kafka records (aiokafka's ConsumerRecord, or RawMessage) as the archive's rows."""
    rows: dict[str, list[Any]] = {name: [] for name in SCHEMA.names}
    for r in records:
        rows["topic"].append(r.topic)
        rows["partition"].append(r.partition)
        rows["offset"].append(r.offset)
        rows["timestamp"].append(getattr(r, "timestamp", None))
        rows["timestamp_type"].append(getattr(r, "timestamp_type", None))
        rows["key"].append(r.key)
        rows["value"].append(r.value)
        rows["headers"].append([{"key": k, "value": v} for k, v in (getattr(r, "headers", None) or ())])
        rows["unreadable"].append(getattr(r, "unreadable", None))
    return pa.table(rows, schema=SCHEMA)


def to_records(table: pa.Table) -> list[RawMessage]:
    """The archive's rows as records the fold reads."""
    cols = {name: table.column(name).to_pylist() for name in SCHEMA.names}
    return [
        RawMessage(
            topic=cols["topic"][i],
            partition=cols["partition"][i],
            offset=cols["offset"][i],
            key=cols["key"][i],
            value=cols["value"][i],
            timestamp=cols["timestamp"][i],
            timestamp_type=cols["timestamp_type"][i],
            headers=tuple((h["key"], h["value"]) for h in cols["headers"][i] or ()),
            unreadable=cols["unreadable"][i],
        )
        for i in range(table.num_rows)
    ]


# -- replay ----------------------------------------------------------------------------------------------------


class ArchiveGap(MaterializeError):
    """Records that neither the archive nor the topics hold: a replay cannot rebuild what came in them."""


def gaps(segments: list[Segment], kafka_start: int | None) -> list[tuple[int, int]]:
    """The offset ranges (inclusive) of a partition held neither by its segments nor by Kafka (which holds
    ``kafka_start`` on; None: unknown). What lies before the first segment is history the archive never had
    (it began later, or its retention let it go), not a gap. Pure."""
    holes = [(a.last + 1, b.first - 1) for a, b in zip(segments, segments[1:], strict=False) if b.first > a.last + 1]
    if segments and kafka_start is not None and kafka_start > segments[-1].last + 1:
        holes.append((segments[-1].last + 1, kafka_start - 1))
    return holes


def replay_plan(
    archive: Archive, topics: Iterable[str], kafka_start: Mapping[tuple[str, int], int]
) -> dict[tuple[str, int], list[Segment]]:
    """The segments a replay reads, per partition: those holding offsets Kafka no longer holds. ArchiveGap when
    records are in neither."""
    plan, holes = {}, []
    for topic, partition in archive.partitions():
        if topic not in set(topics):
            continue
        segs = archive.segments(topic, partition)
        start = kafka_start.get((topic, partition))
        holes += [(topic, partition, a, b) for a, b in gaps(segs, start)]
        plan[(topic, partition)] = segs
    if holes:
        named = ", ".join(f"{t}[{p}] offsets {a}..{b}" for t, p, a, b in holes[:5])
        raise ArchiveGap(
            f"the archive {archive.uri} and the topics both lack {named}"
            + (f" and {len(holes) - 5} more ranges" if len(holes) > 5 else "")
            + ": those records are gone; nothing was written"
        )
    return plan


def archived_batches(
    archive: Archive, plan: Mapping[tuple[str, int], list[Segment]], batch_bytes: int = READ_BYTES
) -> Iterator[tuple[list[RawMessage], dict[tuple[str, int], int]]]:
    """The archive's records in batches of about ``batch_bytes`` (partition after partition, in offset order), each
    with the next offset of every partition it ends (a segment's ``last`` + 1, purged records included)."""
    held: list[RawMessage] = []
    ends: dict[tuple[str, int], int] = {}
    size = 0
    for tp, segs in sorted(plan.items()):
        for seg in segs:
            records = to_records(archive.read(seg))
            held += records
            size += sum(len(r.value or b"") for r in records)
            ends[tp] = seg.last + 1
            if size >= batch_bytes:
                yield held, ends
                held, ends, size = [], {}, 0
    if held or ends:
        yield held, ends


# -- the archiver ----------------------------------------------------------------------------------------------


@dataclass
class _Held:
    first: int  # the offset this buffer starts at (the segment's first)
    since: float
    records: list[Any] = field(default_factory=list)
    bytes: int = 0


class Archiver:
    """Reads every partition of the topics from the archive's position and writes segments (``flightrec archive``).
    ``async with Archiver(...) as a: await a.run()``."""

    def __init__(
        self,
        kafka_kwargs: Mapping[str, object],
        uri: str,
        topics: tuple[str, ...],
        *,
        roll_s: float = ROLL_S,
        roll_bytes: int = ROLL_BYTES,
        keep_days: float | None = None,
        until_idle: float | None = None,
    ) -> None:
        self.kafka_kwargs = kafka_kwargs
        self.archive = Archive(uri)
        self.topics = topics
        self.roll_s, self.roll_bytes, self.keep_days, self.until_idle = roll_s, roll_bytes, keep_days, until_idle
        self.written = 0  # segments written by this run
        self.records = 0
        self._held: dict[TopicPartition, _Held] = {}
        self._next: dict[TopicPartition, int] = {}  # the next offset expected per partition
        self._stop = asyncio.Event()
        self._consumer: AIOKafkaConsumer | None = None
        self._reader: BatchReader | None = None  # reads past batches the client cannot parse (kept, with why)
        self._admin: AIOKafkaAdminClient | None = None

    async def __aenter__(self) -> Archiver:
        self._consumer = AIOKafkaConsumer(
            **self.kafka_kwargs, group_id=None, enable_auto_commit=False, auto_offset_reset="earliest"
        )
        self._reader = BatchReader(self._consumer, self.kafka_kwargs)
        self._admin = AIOKafkaAdminClient(**self.kafka_kwargs)
        try:
            await self._consumer.start()
            await self._admin.start()
        except (KafkaError, OSError) as exc:
            await self._close()
            raise MaterializeError(f"the archiver cannot read Kafka: {exc}") from exc
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._close()

    async def _close(self) -> None:
        if self._reader is not None:
            with contextlib.suppress(KafkaError, OSError):
                await self._reader.close()
            self._reader = None
        for client in (self._consumer, self._admin):
            if client is None:
                continue
            with contextlib.suppress(KafkaError, OSError):
                await (client.stop() if isinstance(client, AIOKafkaConsumer) else client.close())
        self._consumer = self._admin = None

    def stop(self) -> None:
        self._stop.set()

    async def _assign(self) -> None:
        """Every partition of the topics, each at the archive's position (its beginning where it holds none)."""
        c, admin = self._consumer, self._admin
        assert c is not None and admin is not None
        parts = [TopicPartition(t, p) for t, p in await topic_partitions(admin, self.topics)]
        if set(parts) == set(self._next):
            return
        position = await asyncio.to_thread(self.archive.position, self.topics)
        starts = await c.beginning_offsets(parts)
        c.assign(parts)
        for tp in parts:
            if tp in self._next:
                continue
            at = position.get((tp.topic, tp.partition))
            begin = starts.get(tp, 0)
            if at is None:
                at = begin
            elif begin > at:
                log.error(
                    "%s[%d]: Kafka no longer holds offsets %d..%d and the archive never had them: those records are "
                    "lost to a replay (the archiver was away longer than the topic's retention.ms)",
                    tp.topic,
                    tp.partition,
                    at,
                    begin - 1,
                )
                at = begin
            self._next[tp] = at
            c.seek(tp, at)

    async def run(self) -> int:
        """Archive until stopped (or idle for ``until_idle`` s once caught up); returns records archived."""
        reader = self._reader
        assert reader is not None
        await self._assign()
        loop = asyncio.get_running_loop()
        last_data = last_refresh = last_trim = loop.time()
        try:
            while not self._stop.is_set():
                try:
                    data = await reader.getmany(self._next, timeout_ms=200, max_records=10_000)
                except KafkaError as exc:  # the broker away: what is held stays held, reading goes on after
                    log.warning("reading the topics failed (%s); retrying", exc)
                    await asyncio.sleep(1.0)
                    continue
                now = loop.time()
                for tp, records in data.items():
                    self._hold(tp, records, now)
                if data:
                    last_data = now
                await self._roll(now, force=False)
                if now - last_refresh >= 30.0:
                    last_refresh = now
                    await self._assign()
                if self.keep_days is not None and now - last_trim >= 3600.0:
                    last_trim = now
                    await asyncio.to_thread(self.trim)
                if self.until_idle is not None and now - last_data >= self.until_idle and await self._caught_up():
                    break
        finally:
            await self._roll(loop.time(), force=True)
        return self.records

    async def _caught_up(self) -> bool:
        c = self._consumer
        assert c is not None
        ends = await c.end_offsets(list(self._next))
        return all(self._next[tp] >= end for tp, end in ends.items())

    def _hold(self, tp: TopicPartition, records: list[Any], now: float) -> None:
        expect = self._next.get(tp)
        records = [r for r in records if expect is None or r.offset >= expect]  # fetched before a seek
        if not records:
            return
        held = self._held.get(tp)
        if held is None:
            first = expect if expect is not None and expect <= records[0].offset else records[0].offset
            if expect is not None and records[0].offset > expect:
                log.error(
                    "%s[%d]: offsets %d..%d were gone from Kafka before the archiver read them",
                    tp.topic,
                    tp.partition,
                    expect,
                    records[0].offset - 1,
                )
                first = records[0].offset
            held = self._held[tp] = _Held(first, now)
        held.records += records
        held.bytes += sum(len(r.value or b"") for r in records)
        self._next[tp] = records[-1].offset + 1

    async def _roll(self, now: float, force: bool) -> None:
        """Write out the partitions due: old or large enough, the largest while too much is held, all when ``force``."""
        holding = self._held
        due = [tp for tp, h in holding.items() if force or h.bytes >= self.roll_bytes or now - h.since >= self.roll_s]
        total = sum(h.bytes for h in self._held.values())
        if not due and total >= HELD_BYTES:
            due = [max(self._held, key=lambda tp: self._held[tp].bytes)]
        for tp in due:
            held = self._held.pop(tp)
            last = held.records[-1].offset
            try:
                seg = await asyncio.to_thread(
                    self.archive.write, tp.topic, tp.partition, held.first, last, to_table(held.records)
                )
            except (OSError, pa.ArrowException) as exc:
                raise MaterializeError(
                    f"cannot write the archive {self.archive.uri} ({exc}): what was not written is read again from "
                    "Kafka at the next start, from the archive's position"
                ) from exc
            self.written += 1
            self.records += len(held.records)
            log.info("archived %s[%d] offsets %d..%d (%d records)", tp.topic, tp.partition, seg.first, seg.last,
                     len(held.records))  # fmt: skip

    def trim(self, now_ms: int | None = None) -> int:
        """Delete the segments whose newest record is older than ``keep_days``, oldest first (the segments left stay
        contiguous); returns how many."""
        if self.keep_days is None:
            return 0
        return trim(self.archive, self.keep_days, now_ms)


def trim(archive: Archive, keep_days: float, now_ms: int | None = None) -> int:
    """The archive's retention: each partition's oldest segments whose newest record is ``keep_days`` old."""
    cutoff = (time.time_ns() // 1_000_000 if now_ms is None else now_ms) - int(keep_days * 86_400_000)
    gone = 0
    for topic, partition in archive.partitions():
        for seg in archive.segments(topic, partition)[:-1]:  # the last stays: it holds the position
            if seg.newest >= cutoff:
                break
            archive.delete(seg)
            gone += 1
    if gone:
        log.info("archive retention: %d segments older than %g days deleted", gone, keep_days)
    return gone


# -- purge -----------------------------------------------------------------------------------------------------


def purge(archive: Archive, drop: Callable[[pa.Table], pa.Table]) -> int:
    """Rewrite every segment ``drop`` changes (it returns the segment's rows purged); returns segments rewritten."""
    changed = 0
    for topic, partition in archive.partitions():
        for seg in archive.segments(topic, partition):
            table = archive.read(seg)
            purged = drop(table)
            if purged.num_rows != table.num_rows or not purged.equals(table):
                archive.replace(seg, purged)
                changed += 1
    return changed
