"""The consume loop: Kafka -> fold -> one writer thread committing to DuckDB and publishing snapshots for readers.

Guarantees: partitions are assigned by hand and positioned at the offsets stored
in DuckDB (the start of each partition when none are stored), so a restart after
SIGKILL resumes exactly after the last commit; at most one batch is being
written while the next is folded, and a batch holds at most ``batch_bytes`` of
messages, so memory stays bounded whatever the backlog. No read runs here: on a file, the
writer thread publishes a snapshot for readers (flightrec.db.snapshot) between commits, at most
every ``PUBLISH_S`` while it keeps up and every ``PUBLISH_BEHIND_S`` while it works through a
backlog (a publish copies the blocks and log the commits since changed; under a backlog readers are behind anyway).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import logging
import re
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from datetime import UTC, datetime
from typing import ParamSpec, TypeAlias, TypeVar

import duckdb
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaError
from aiokafka.structs import ConsumerRecord
from flightrec.consumers.alerts import AlertConfig, Alerter
from flightrec.consumers.archive import Archive, archived_batches, replay_plan
from flightrec.consumers.batches import BatchReader
from flightrec.consumers.diskfull import DiskFullGuard, marker_path
from flightrec.consumers.metrics import Metrics
from flightrec.consumers.options import DEFAULT_GROUP, Options  # noqa: F401 - DEFAULT_GROUP: the materializer's names
from flightrec.consumers.progress import Progress
from flightrec.consumers.progress import record as record_progress
from flightrec.consumers.rulewatch import RulesWatch
from flightrec.consumers.storefigures import StoreFigures
from flightrec.consumers.upkeep import Upkeep
from flightrec.db.classify import load_rules
from flightrec.db.filestore import FileStore
from flightrec.db.fold import LOG_APPEND_TIME, Delta, RawMessage, fold
from flightrec.db.lakestore import LakeStore
from flightrec.db.location import FileLocation
from flightrec.db.markers import lake_replay_ends, replaying_path
from flightrec.db.reclassify import reclassify_step
from flightrec.db.snapshot import Publisher
from flightrec.db.stats import Stats
from flightrec.db.store import Store, open_store
from flightrec.db.trust import Trust, load_state
from flightrec.schemas.logcolumns import LogColumns

from flightrec.access import refusal_line, refusal_of
from flightrec.cluster import (
    LOG_APPEND_TIME as APPEND_TIME_CONFIG,
)
from flightrec.cluster import (
    TIMESTAMP_TYPE,
    create_time_warning,
    describe_topic_configs,
    topic_partitions,
)
from flightrec.errors import ConfigError, CredentialError, MaterializeError
from flightrec.settings import TOPIC_LOGS

P = ParamSpec("P")
T = TypeVar("T")
Record: TypeAlias = ConsumerRecord[bytes, bytes]  # a Kafka record as read: key and value are bytes (no deserializer)
log = logging.getLogger(__name__)
METRICS_INTERVAL = 1.0  # seconds between updates of the lag and the database's figures on /metrics

# How long the broker may hold a fetch that finds no data. A fetch is sent for the partitions with nothing buffered:
# when those are the idle ones (the other topics'), the busy ones drained meanwhile wait for it to come back, so
# Kafka's 500 ms stalled a backlog for up to half a second at a time.
FETCH_MAX_WAIT_MS = 100
START_RETRY_S = 30.0  # how long a starting materializer asks again for the partitions (a broker just died)
PUBLISH_S = 0.5  # a file's snapshot for readers is made current at most this often while the writer keeps up
PUBLISH_BEHIND_S = 2.0  # and this often while it works through a backlog (full batches)


async def _quietly(what: str, step: Awaitable[object]) -> None:
    """Await a client's close; a Kafka or network error is logged (the run is over), never raised. So is the
    CancelledError of a task the client cancelled itself (aiokafka's fetcher awaits the fetches it cancels when a
    broker is away): only a cancellation of this task goes on."""
    try:
        await step
    except (KafkaError, OSError) as exc:
        log.warning("%s: %s", what, exc)
    except asyncio.CancelledError:
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            raise
        log.warning("%s: a request of the client's own was cancelled", what)


class Pending:
    """The messages read and not yet folded: the next batch, bounded by bytes, count and age."""

    def __init__(self, opts: Options, max_bytes: int, max_lines: int) -> None:
        self.opts = opts
        self.max_bytes = max_bytes
        self.max_lines = max_lines  # log lines: a message of short lines folds to many more bytes than it has
        self.records: list[Record] = []
        self.bytes = 0
        self.lines = 0
        self.since = 0.0
        self._count = LogColumns().lines

    def add(self, records: list[Record], now: float) -> None:
        if not self.records:
            self.since = now
        self.records.extend(records)
        self.bytes += sum(len(r.value or b"") for r in records)
        count = self._count
        self.lines += sum(count(r.value) for r in records if r.value and r.topic == TOPIC_LOGS)

    def full(self, now: float) -> bool:
        """Whether the batch should be committed now."""
        return bool(self.records) and (
            self.bytes >= self.max_bytes
            or self.lines >= self.max_lines
            or len(self.records) >= self.opts.batch_messages
            or now - self.since >= self.opts.commit_interval
        )

    def due(self, now: float, quiet: bool, quiet_bytes: int) -> bool:
        """Whether to commit now: a full batch, or one of at least ``quiet_bytes`` once a read found nothing more."""
        return self.full(now) or (quiet and bool(self.records) and self.bytes >= quiet_bytes)

    def take(self) -> list[Record]:
        records, self.records, self.bytes, self.lines = self.records, [], 0, 0
        return records


class _ClockWatch:
    """Says once per topic when its records carry no broker time (CreateTime): then liveness cannot be judged by
    when the pipeline received the events and falls back to the instances' own clocks (docs/materializer.md)."""

    def __init__(self) -> None:
        self.said: set[str] = set()

    def see(self, data: dict[TopicPartition, list[Record]]) -> None:
        for tp, records in data.items():
            if tp.topic in self.said:
                continue
            stale = next((r for r in records if getattr(r, "timestamp_type", None) != LOG_APPEND_TIME), None)
            if stale is not None:
                self.said.add(tp.topic)
                log.warning(
                    "records of %s (partition %d, offset %d and others) carry the sender's clock (CreateTime), "
                    "not the broker's: for their events `lost` and the clock offset follow the instances' own "
                    "clocks. New topics are made with %s=LogAppendTime; records appended before a topic was "
                    "switched keep CreateTime",
                    tp.topic,
                    tp.partition,
                    stale.offset,
                    TIMESTAMP_TYPE,
                )


async def _nothing() -> None:
    return None


def _let_go(snapshots: Publisher) -> None:
    """The readers' snapshots of a store that is not open: readers read the file from now on."""
    snapshots.close()
    snapshots.release()


def parse_time(text: str, now: float | None = None) -> int:
    """Microseconds since the epoch from ISO-8601, epoch seconds, or an age like 90s / 30m / 2h / 7d."""
    text = text.strip()
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([smhd])", text)
    if m:
        seconds = float(m.group(1)) * {"s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)]
        return int(((time.time() if now is None else now) - seconds) * 1_000_000)
    if re.fullmatch(r"\d+(?:\.\d+)?", text):
        return int(float(text) * 1_000_000)
    try:
        dt = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError as exc:
        raise ConfigError(f"--since {text!r}: use ISO-8601 (2025-01-31T12:00Z), epoch seconds, or an age (2h)") from exc
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return int(dt.timestamp() * 1_000_000)


def event_filter(instance: str | None, since_us: int | None) -> Callable[[str, int | None], bool] | None:
    """The fold's keep() for a filtered replay, or None when nothing is filtered."""
    if instance is None and since_us is None:
        return None

    def keep(instance_id: str, ts_us: int | None) -> bool:
        if instance is not None and instance_id != instance:
            return False
        return since_us is None or ts_us is None or ts_us >= since_us

    return keep


class Materializer:
    """Consumes the topics into one database. ``async with Materializer(...) as m: await m.run()``."""

    # A partial batch of at least this many message bytes is committed when a read finds nothing more (the topics
    # are quiet), not only at the end of the batch window: the window bounds a batch under a steady stream. A lake
    # member commits a small one at the window only (group.py).
    quiet_commit_bytes = 1
    # Message bytes a transaction holds at most unless Options.batch_bytes says: a backlog is read in batches of this.
    # A file's commit costs little beyond its rows, so a larger batch gains it nothing and costs memory.
    default_batch_bytes = 16 << 20
    # and at most this many log lines: empty lines take ~14 bytes a message and ~125 folded (a batch of 16 MiB of them
    # folded to 1.25M lines, 156 MiB of Arrow); 16 MiB of the benchmark's 60-byte lines are ~350,000
    default_batch_lines = 500_000

    def __init__(self, kafka_kwargs: Mapping[str, object], options: Options) -> None:
        self.kafka_kwargs = kafka_kwargs
        # the rules in use: the operator's file (watched) in front of the base table; a file that does not parse
        # stops the start here
        self._rules = RulesWatch(options.rules or load_rules(), options.rules_file)
        self.batch_bytes = options.batch_bytes or self.default_batch_bytes
        self.opts = options
        self.stats = Stats()  # the run's commits, summed, and the errors it survived
        self._keep = event_filter(options.instance, options.since_us)
        self._writer = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="flightrec-writer")
        self._store: Store | None = None  # a FileStore here, a LakeStore in a group (group.py)
        self._published_at = 0.0  # when the readers' snapshot was last made current (loop time)
        self._snapshots: Publisher | None = None  # a file's, while its store is closed to be opened again
        self._last_report = 0.0  # when the stats were last logged (loop time)
        self._consumer: AIOKafkaConsumer | None = None
        self._reader: BatchReader | None = None  # reads through batches the client cannot parse
        self._next: dict[TopicPartition, int | None] = {}  # partitions read -> next offset to fold (None: any)
        self._admin: AIOKafkaAdminClient | None = None  # partitions of the topics (public metadata API)
        self._parts: list[TopicPartition] = []
        self._stop = asyncio.Event()
        self._alerts: Alerter | None = None
        self._inflight: asyncio.Future[None] | None = None  # the commit being written
        self._pending = self._new_pending()  # read, not yet folded (run() starts it afresh)
        self._clocks = _ClockWatch()
        self._trust = Trust(options.trust)  # the writers' tags judged (db/trust.py); its state grows per fold
        self._metrics: Metrics | None = None  # Prometheus /metrics (--metrics-port)
        self._committed: dict[tuple[str, int], int] = {}  # next offset the database holds, per partition
        self._errors_counted = 0  # stats.errors_total already added to the metrics
        self._figures = StoreFigures()  # the store's size, retention, a full disk, the archive (/metrics)
        self._guard = DiskFullGuard(options.location.describe())  # the store's own, made when it opens
        self._upkeep: Upkeep | None = None  # retention, compaction, figures between a file's commits
        self._reported = Stats().summary()  # the counters as last logged (a run that did nothing logs nothing)
        self._progress = Progress()  # how far the input is read: silences are judged up to there
        self._store_opened = False  # the store was opened once: opened again, its own file is no refusal
        self.replay_finished = False  # a replay reached the end offsets it set out for (its marker is taken away)

    def _new_pending(self) -> Pending:
        """An empty batch, bounded by this store's limits."""
        return Pending(self.opts, self.batch_bytes, self.default_batch_lines)

    async def _in_writer(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        return await asyncio.wrap_future(self._writer.submit(fn, *args, **kwargs))

    async def __aenter__(self) -> Materializer:
        opts = self.opts
        try:
            if opts.metrics_port is not None:  # first: a port in use stops the run before a database file is made
                self._metrics = Metrics(
                    opts.metrics_port,
                    opts.metrics_address,
                    db_path=str(opts.location.path) if not opts.location.shared else None,  # type: ignore[union-attr]  # a file's Location has its path
                    max_age=opts.alert_max_age,
                    classes=(r.failure_class for r in self._rules.table.rules),
                )
                self._figures.register(self._metrics.registry)
                self._metrics.start()
            await self._open_store_side()
            self._upkeep = self._start_upkeep()
            self._consumer = AIOKafkaConsumer(
                **self.kafka_kwargs,
                enable_auto_commit=False,
                auto_offset_reset="earliest",
                max_partition_fetch_bytes=2 << 20,
                fetch_max_bytes=16 << 20,
                fetch_max_wait_ms=FETCH_MAX_WAIT_MS,
                request_timeout_ms=20000,
                **self._consumer_options(),
            )
            self._reader = BatchReader(self._consumer, self.kafka_kwargs)
            self._admin = AIOKafkaAdminClient(**self.kafka_kwargs, request_timeout_ms=20000)
            try:
                await self._consumer.start()
                await self._admin.start()
            except (KafkaError, OSError) as exc:
                from flightrec.cluster import connection_cause

                cause = await connection_cause(self.kafka_kwargs)
                raise MaterializeError(
                    f"cannot read Kafka: {cause}"
                    if cause
                    else f"no Kafka broker answered at {self.kafka_kwargs.get('bootstrap_servers')}: "
                    f"{exc}; start one (`flightrec broker start`) or set FLIGHTREC_BOOTSTRAP"
                ) from exc
            await self._check_timestamp_types()
            if opts.replay:
                await self._replay_archive()  # what the topics no longer hold, from FLIGHTREC_ARCHIVE
            await self._assign_at_start()
        except BaseException:
            await self._close()
            raise
        return self

    async def _open_store_side(self) -> None:
        """The store and what hangs on its connection: the writers' trust state, the alerts' outbox."""
        opts = self.opts
        self._store = await self._in_writer(self._open_store)
        await self._in_writer(load_state, self._trust, self._store.con)
        if opts.webhook and not opts.replay:
            self._alerts = Alerter(
                AlertConfig(
                    opts.webhook,
                    opts.alert_on,
                    opts.dashboard_url,
                    backoff=opts.alert_backoff,
                    drain=opts.alert_drain,
                    timeout=opts.alert_timeout,
                    status_interval=opts.status_interval,
                    max_age=opts.alert_max_age,
                    kinds_quiet_us=opts.kind_windows.quiet_us,
                )
            )
            await self._in_writer(self._alerts.start, self._store.con)

    async def _close_store_side(self, detach: bool = False) -> None:
        """The alerts and the store let go, in that order (the file is then free). ``detach``: to be opened again
        (a compaction, a full disk): a file's readers keep its snapshots meanwhile (``_snapshots``)."""
        if self._alerts is not None:
            alerts, self._alerts = self._alerts, None
            await self._in_writer(alerts.close, self._store.con if self._store is not None else None)
        if self._store is not None:
            store, self._store = self._store, None
            if detach and isinstance(store, FileStore):
                self._snapshots = await self._in_writer(store.detach)
            else:
                await self._in_writer(store.close)
        if not detach and self._snapshots is not None:  # a reopen that never succeeded (a full disk)
            snapshots, self._snapshots = self._snapshots, None
            await self._in_writer(_let_go, snapshots)

    async def _reopen_store(self, between: Callable[[], T] | None = None) -> T | None:
        """Close the store and what hangs on it, run ``between`` in the writer thread (a compaction), open them
        again; the store is opened again whatever ``between`` did (its error is raised after). Readers read the
        last snapshot meanwhile; the store opened again takes its publisher over."""
        await self._close_store_side(detach=True)
        try:
            return await self._in_writer(between) if between is not None else None
        finally:  # on a full disk the opening waits for room, as a commit does
            await self._guard.commit(self._open_store_side, _nothing, self._stop, "store to open again", settle=False)

    async def _replay_archive(self) -> None:
        """A replay reads the archive first (consumers/archive.py), each batch committed with the offsets it ends at,
        so that the topics are then read from where the archive ended; ArchiveGap when records are in neither.
        Without an archive, says what the topics no longer hold."""
        assert self._consumer is not None
        parts = await self._partitions()
        starts = {(tp.topic, tp.partition): o for tp, o in (await self._consumer.beginning_offsets(parts)).items()}
        if not self.opts.archive:
            lost = sorted(f"{t}[{p}] 0..{o - 1}" for (t, p), o in starts.items() if o > 0)
            if lost:
                log.warning(
                    "the topics no longer hold offsets %s (retention): the database starts after them; set "
                    "FLIGHTREC_ARCHIVE to replay them from an archive (docs/retention.md)",
                    ", ".join(lost[:6]) + (f" and {len(lost) - 6} more" if len(lost) > 6 else ""),
                )
            return
        archive = Archive(self.opts.archive)
        plan = await asyncio.to_thread(replay_plan, archive, self.opts.topics, starts)
        batches = archived_batches(archive, plan, self.batch_bytes)
        while (batch := await asyncio.to_thread(next, batches, None)) is not None:
            await self._commit_archived(*batch)
            if self._stop.is_set():
                raise MaterializeError("replay stopped while it read the archive; start it again into a new database")
        if plan:
            log.info("replayed the archive %s (%d partitions); now the topics from where it ended", archive.uri,
                     len(plan))  # fmt: skip

    async def _commit_archived(self, records: list[RawMessage], ends: dict[tuple[str, int], int]) -> None:
        """One batch of archived records, with the offsets the archive's segments end at (purged records included)."""
        delta = fold(records, keep=self._keep, trust=self._trust)
        await self._commit(dataclasses.replace(delta, offsets={**delta.offsets, **ends}))

    def _start_upkeep(self) -> Upkeep | None:
        """A file's retention, compaction and figures between commits (consumers/upkeep.py); the full-disk guard."""
        loc = self.opts.location
        if not isinstance(loc, FileLocation):
            self._guard = DiskFullGuard(loc.describe(), space_of=self.opts.data_path, figures=self._figures)
            return None
        marker_path(loc.path).unlink(missing_ok=True)  # left by a run that ended during its wait; this one met none
        self._guard = DiskFullGuard(
            loc.describe(),
            marker=marker_path(loc.path),
            space_of=loc.path.parent,
            webhook_url=None if self.opts.replay else self.opts.webhook,
            figures=self._figures,
        )
        if self.opts.replay:
            return None
        return Upkeep(
            self.opts.keep,
            loc.path,
            self._figures,
            run=self._in_writer,
            con=lambda: self._writer_con(),
            wrote=self._writer_wrote,
            reopen=self._reopen_store,
            commit_interval=self.opts.commit_interval,
            compact_free_share=self.opts.compact_free_share,
            archive=self.opts.archive,
            topics=self.opts.topics,
        )

    def _writer_store(self) -> Store:
        if self._store is None:  # a reopen that failed (a full disk): the next commit opens it first
            raise MaterializeError(f"the store {self.opts.location.describe()} is not open")
        return self._store

    async def _store_commit(self, delta: Delta) -> Stats:
        """One commit through the store, opened first where a reopen failed (a full disk: the guard tries again)."""
        if self._store is None:
            await self._open_store_side()
        return await self._in_writer(self._writer_store().commit, {0: delta})  # a file holds every partition

    def _writer_con(self) -> duckdb.DuckDBPyConnection:
        return self._writer_store().con

    def _writer_wrote(self) -> None:
        """Retention deleted rows (not a commit): readers see it at the next publish."""
        if isinstance(self._store, FileStore):
            self._store.wrote()

    async def _assign_at_start(self) -> None:
        """The first assignment, tried again while it fails for up to START_RETRY_S: on a cluster, the broker asked
        for the topics' partitions may be one that just died (still named by the others until it is fenced, or for
        good while the controllers have no quorum); another answers. Then a clear MaterializeError."""
        deadline = time.monotonic() + START_RETRY_S
        while True:
            try:
                await self._assign(initial=True)
                return
            except (TimeoutError, KafkaError, OSError) as exc:
                self._refused(exc, "read")
                if time.monotonic() > deadline:
                    raise MaterializeError(
                        f"cannot list the topics' partitions at {self.kafka_kwargs.get('bootstrap_servers')} for "
                        f"{START_RETRY_S:.0f}s ({type(exc).__name__}: {exc}); start again when the brokers answer"
                    ) from exc
                log.warning("listing the topics' partitions failed (%s); retrying", exc)
                await asyncio.sleep(0.5)

    def _refused(self, exc: BaseException, doing: str) -> None:
        """Raise CredentialError (one line: whose credential, what it may not do) when ``exc`` is a refusal."""
        refusal = refusal_of(exc)
        if refusal is not None:
            raise CredentialError(refusal_line(refusal, self.kafka_kwargs, doing)) from exc

    async def _check_timestamp_types(self) -> None:
        """Warn when a topic stamps the sender's clock (CreateTime): liveness then falls back to the instances'."""
        assert self._admin is not None
        try:
            configs = await describe_topic_configs(self._admin, self.opts.topics)
        except (TimeoutError, KafkaError, OSError) as exc:
            log.info(
                "cannot describe the topics' configs (%s): whether they stamp the broker's clock is judged by "
                "the records as they come",
                exc,
            )
            return
        types = {t: c.get(TIMESTAMP_TYPE, "CreateTime") for t, c in configs.items()}  # Kafka's default: CreateTime
        warning = create_time_warning(types, str(self.kafka_kwargs.get("bootstrap_servers", "BOOTSTRAP")))
        if warning:
            log.warning("%s", warning)
            self._clocks.said.update(t for t, kind in types.items() if kind != APPEND_TIME_CONFIG)

    def _open_store(self) -> Store:
        """The store this run writes (in the writer thread), with the snapshots of the one before, if any."""
        opts = self.opts
        store = open_store(
            opts.location,
            opts.group,
            rules=self._rules.table,
            replay=opts.replay,
            memory_limit=opts.memory_limit,
            lock_wait=opts.lock_wait,
            views=opts.views,
            publish=opts.serve,
            snapshots=self._snapshots,
            again=self._store_opened,
        )
        self._snapshots = None  # taken over
        self._store_opened = True
        return store

    def _consumer_options(self) -> dict[str, object]:
        """Consumer arguments beyond the common ones: no group here (partitions assigned by hand)."""
        return {"group_id": None}

    async def __aexit__(self, *exc: object) -> None:
        await self._close()

    async def _close(self) -> None:
        if self._admin is not None:
            await _quietly("closing the admin client", self._admin.close())
            self._admin = None
        if self._reader is not None:
            await _quietly("closing the batch reader's client", self._reader.close())
            self._reader = None
        if self._consumer is not None:  # a group's member commits what it holds as its partitions are revoked
            await _quietly("stopping the consumer", self._consumer.stop())
            self._consumer = None
        await self._close_store_side()
        self._writer.shutdown(wait=True)
        if self._metrics is not None:
            self._metrics.close()
            self._metrics = None

    def stop(self) -> None:
        """Ask the run loop to commit what it holds and return (signal handlers call this)."""
        self._stop.set()

    async def _partitions(self) -> list[TopicPartition]:
        assert self._admin is not None
        return [TopicPartition(t, p) for t, p in await topic_partitions(self._admin, self.opts.topics)]

    async def _assign(self, initial: bool = False) -> bool:
        """(Re)assign every partition of the topics; positions come from DuckDB. True if it changed."""
        c = self._consumer
        assert c is not None
        if self._store is None:  # closed for a compaction, or waiting for room to open: looked at next time
            return False
        parts = await self._partitions()
        if parts == self._parts:
            return False
        current = {tp: self._next.get(tp) or await c.position(tp) for tp in self._parts} if self._parts else {}
        stored = await self._in_writer(self._store.offsets)
        self._committed.update({k: v for k, v in stored.items() if v is not None})
        c.assign(parts)
        offsets = {tp: current.get(tp, stored.get((tp.topic, tp.partition))) for tp in parts}
        await self._seek(parts, offsets)
        self._next = offsets
        self._parts = parts
        if not initial:
            log.info("now reading %d partitions", len(parts))
        elif not self.opts.replay:
            await self._say_what_kafka_let_go(offsets)
        return True

    async def _say_what_kafka_let_go(self, offsets: Mapping[TopicPartition, int | None]) -> None:
        """Say it plainly when the topics no longer hold records after the database's offsets (their retention let
        them go while no materializer ran, or a restored backup is older than what the topics keep): the reading
        goes on from what Kafka holds, and those records are not in the database."""
        c = self._consumer
        known = {tp: o for tp, o in offsets.items() if o is not None}
        if c is None or not known:
            return
        try:
            starts = await c.beginning_offsets(list(known))
        except (KafkaError, OSError) as exc:
            log.debug("no beginning offsets (%s)", exc)
            return
        lost = sorted(
            f"{tp.topic}[{tp.partition}] {o}..{starts[tp] - 1}" for tp, o in known.items() if starts.get(tp, 0) > o
        )
        if lost:
            log.error(
                "the topics no longer hold offsets %s that the database %s never read (their retention let them go "
                "while no materializer ran, or a restored backup is older than what they keep): those records are "
                "not in it; rebuild it from the archive with `flightrec replay --db NEW --archive URI` "
                "(docs/retention.md)",
                ", ".join(lost[:6]) + (f" and {len(lost) - 6} more" if len(lost) > 6 else ""),
                self.opts.location.describe(),
            )

    async def _seek(self, parts: Iterable[TopicPartition], offsets: dict[TopicPartition, int | None]) -> None:
        """Position each partition at its offset, or at its beginning where the offset is None."""
        c = self._consumer
        assert c is not None
        fresh = []
        for tp in parts:
            offset = offsets.get(tp)
            if offset is None:
                fresh.append(tp)
            else:
                c.seek(tp, offset)
        if fresh:
            await c.seek_to_beginning(*fresh)

    async def _caught_up(self, targets: dict[TopicPartition, int] | None = None) -> bool:
        c = self._consumer
        assert c is not None
        ends = targets if targets is not None else await c.end_offsets(self._parts)
        for tp in self._parts:
            if await c.position(tp) < ends.get(tp, 0):
                return False
        return True

    async def _commit(self, delta: Delta, behind: bool = False) -> None:
        started = time.monotonic()
        stats = await self._guard.commit(
            lambda: self._store_commit(delta),
            self._reopen_store,
            self._stop,
            held=f"batch of {delta.messages} messages",
        )
        self.stats += stats
        self._committed.update(delta.offsets)
        if self._metrics is not None:
            self._metrics.observe_commit(delta, stats, time.monotonic() - started)
        await self._sync_alerts()
        await self._publish(behind)

    async def _publish(self, behind: bool) -> None:
        """Make the readers' snapshot current when commits wait for it and it is due (a file only; in the writer
        thread, between commits: ``_flush`` waits for the commit this runs in)."""
        store = self._store
        if not isinstance(store, FileStore) or not store.unpublished():
            return
        now = time.monotonic()
        if now - self._published_at < (PUBLISH_BEHIND_S if behind else PUBLISH_S):
            return
        self._published_at = now
        await self._in_writer(store.publish)

    async def _update_metrics(self) -> None:
        """End offsets (one request): the input's progress and the lag per partition; then the database's figures.
        The broker away skips the lag and the progress."""
        if self._consumer is None or self._store is None:
            return
        if self._metrics is None and not isinstance(self._store, FileStore):
            return  # a lake's member: no metrics, no progress recorded (a lake judges silences up to now)
        try:
            asked_us = time.time_ns() // 1000
            answer = await self._consumer.end_offsets(self._parts)
            ends = {(tp.topic, tp.partition): end for tp, end in answer.items()}
            self._progress.asked(asked_us, ends)
            if self._metrics is not None:
                self._metrics.set_lag(ends, self._committed)
        except (KafkaError, OSError) as exc:
            log.debug("no end offsets (%s)", exc)
        await self._note_progress()
        if self._metrics is None:
            return
        self._metrics.count_errors(self.stats.errors_total - self._errors_counted)
        self._errors_counted = self.stats.errors_total
        try:
            await self._in_writer(self._metrics.read_database, self._store.con)
        except duckdb.Error as exc:
            log.warning("metrics: could not read the database's figures: %s", exc)

    async def _note_progress(self, force: bool = False) -> None:
        """Record how far the input is read (consumers/progress.py), on a database file, at most every few s."""
        self._progress.advance(self._committed)
        moment = self._progress.due(time.monotonic(), force)
        if moment is None or not isinstance(self._store, FileStore):
            return
        try:
            await self._in_writer(record_progress, self._store.con, self._store.run_id, moment)
            self._store.wrote()  # readers see it at the next publish
            self._progress.written(moment, time.monotonic())
            if self._metrics is not None:
                self._metrics.caught_up(moment)
        except duckdb.Error as exc:  # said once until it works again (a full disk would say it every second)
            if self._progress.recorded_at >= 0:
                log.warning("could not record how far the input is read (said once until it works): %s", exc)
            self._progress.recorded_at = -1.0

    async def _sync_alerts(self) -> None:
        if self._alerts is not None and self._store is not None:
            try:
                await self._in_writer(self._alerts.sync, self._store.con)
            except Exception as exc:  # noqa: BLE001 - alerts never stop materialization
                log.warning("alerts: could not update the outbox: %s", exc)

    async def _flush(self, pending: Pending) -> None:
        """Fold what is pending and start committing it, once the previous commit is done (one at a time)."""
        if not pending.records:
            return
        behind = pending.full(time.monotonic())  # a full batch: a backlog is being worked through
        delta = fold(pending.take(), keep=self._keep, trust=self._trust)
        if self._inflight is not None:
            await self._inflight
        self._inflight = asyncio.ensure_future(self._commit(delta, behind))

    async def _reap(self) -> None:
        """Collect a finished commit (raising what it raised)."""
        if self._inflight is not None and self._inflight.done():
            inflight, self._inflight = self._inflight, None
            await inflight

    async def _read(self) -> dict[TopicPartition, list[Record]]:
        """The next messages, each offset of a partition read once; none when the broker went away (counted, waited
        for: what is held is kept). A batch the client cannot parse comes as dead-letter messages (batches.py)."""
        assert self._reader is not None
        try:
            data = await self._reader.getmany(self._next, timeout_ms=100, max_records=self.opts.batch_messages)
        except KafkaError as exc:
            self._refused(exc, "read")  # a credential that may not read: no retry changes that
            self.stats += Stats(errors_total=1)
            log.warning("reading the topics failed (%s); retrying", exc)
            await asyncio.sleep(1.0)
            return {}
        out = self._admit(data)  # ConsumerRecords, and RawMessages of unreadable batches (Message)
        self._clocks.see(out)
        return out

    def _admit(self, data: Mapping[TopicPartition, list[Record]]) -> dict[TopicPartition, list[Record]]:
        """Only records of partitions read here, each offset once: older ones (fetched before a seek) are dropped."""
        out: dict[TopicPartition, list[Record]] = {}
        for tp, records in data.items():
            if tp not in self._next or not records:
                continue
            expect = self._next[tp]
            if expect is not None and records[0].offset < expect:
                records = [r for r in records if r.offset >= expect]
            if records:
                self._next[tp] = records[-1].offset + 1
                out[tp] = records
        return out

    async def _idle_refresh(self) -> bool:
        """While idle: alert outcomes and retries, new partitions. True when the broker answered."""
        await self._sync_alerts()  # outcomes of posts made while idle; retries of queued ones
        try:
            await self._assign()
            return True
        except (KafkaError, OSError) as exc:
            log.warning("refreshing partitions failed: %s", exc)
            return False

    async def _idle_done(self, now: float, kafka_ok: float) -> bool | None:
        """Whether an idle run is caught up (True: stop); None when the broker did not answer.

        Raises MaterializeError once the broker has not answered for long (what was read is committed)."""
        assert self.opts.until_idle is not None
        try:
            return await self._caught_up()
        except (KafkaError, OSError) as exc:
            log.warning("cannot check the end offsets: %s", exc)
            if now - kafka_ok > max(self.opts.until_idle, 30.0):
                raise MaterializeError(
                    f"the broker at {self.kafka_kwargs.get('bootstrap_servers')} has not answered for "
                    f"{now - kafka_ok:.0f}s; committed what was read, start again when it is back"
                ) from exc
            return None

    def _report(self) -> None:
        """Log the run's counters, only when they changed since the last line (an idle run says nothing)."""
        summary = self.stats.summary()
        if summary != self._reported:
            self._reported = summary
            log.info("%s", summary)

    async def _between_reads(self, now: float, behind: bool) -> None:
        """The publish for readers once due (a commit that came too soon after the last one waits no longer than
        PUBLISH_S, or PUBLISH_BEHIND_S through a backlog), the periodic report."""
        if self._inflight is None:
            await self._publish(behind)
        if now - self._last_report >= 10.0:
            self._last_report = now
            self._report()

    async def run(self) -> Stats:
        """Consume until stopped, idle (``until_idle``) or, for a replay, the end offsets at start."""
        loop = asyncio.get_running_loop()
        targets = await self._replay_targets()
        pending = self._pending = self._new_pending()
        last_data = last_refresh = last_metrics = kafka_ok = self._last_report = loop.time()
        await self._update_metrics()
        try:
            while not self._stop.is_set():
                data = await self._read()
                now = loop.time()
                if now - last_metrics >= METRICS_INTERVAL:
                    last_metrics = now
                    await self._update_metrics()
                for records in data.values():
                    pending.add(records, now)
                if data:
                    last_data = kafka_ok = now
                if pending.due(now, quiet=not data, quiet_bytes=self.quiet_commit_bytes):
                    await self._flush(pending)
                await self._reap()
                await self._between_reads(now, behind=pending.full(now))
                if self._inflight is None:
                    self._inflight = self._rules_job(now)  # in the gap after a commit, before upkeep's
                if self._upkeep is not None and self._inflight is None and self._store is not None:
                    self._inflight = self._upkeep.start(now, pending)  # in the gap after a commit
                if targets is not None:
                    if await self._caught_up(targets):
                        self.replay_finished = True
                        break
                    continue
                if data:
                    continue
                if now - last_refresh >= 5.0:
                    last_refresh = now
                    if await self._idle_refresh():
                        kafka_ok = now
                if self.opts.until_idle is not None and now - last_data >= self.opts.until_idle:
                    done = await self._idle_done(now, kafka_ok)
                    if done:
                        break
                    if done is False:
                        kafka_ok = now
        finally:
            await self._finish(pending)
        await self._note_progress(force=True)
        if self.replay_finished:
            await self._replay_whole()
        return self.stats

    async def _replay_whole(self) -> None:
        """A replay reached its end offsets: its marker is taken away (db/markers.py)."""
        if isinstance(self.opts.location, FileLocation):
            replaying_path(self.opts.location.path).unlink(missing_ok=True)
        elif isinstance(self._store, LakeStore):
            store = self._store
            await self._in_writer(
                store.transaction, "mark the lake whole", lambda: lake_replay_ends(store.con, store.run_id)
            )

    def _rules_job(self, now: float) -> asyncio.Future[None] | None:
        """A changed operator's rules file taken up (consumers/rulewatch.py), and a step of classing the stored
        failures again, started (the caller holds it as the one thing in flight), or None. Not in a replay: it
        classes every failure as it builds it. A lake's member: group.py, shard by shard."""
        store = self._store
        if not isinstance(store, FileStore) or self.opts.replay:
            return None
        if self._rules.look(now):
            store.rules = self._rules.table  # nothing in flight: the next commit classes by it
        if not self._rules.reclassifying:
            return None
        return asyncio.ensure_future(self._reclassify_step(store))

    async def _reclassify_step(self, store: FileStore) -> None:
        """One step of classing the stored failures again by the rules in use, in the writer thread; a step that
        fails is logged and the reclassification given up until the rules change again (a replay does it too)."""
        watch = self._rules
        try:
            step = await self._in_writer(reclassify_step, store.con, watch.table, watch.cursor)
        except (duckdb.Error, MaterializeError) as exc:
            watch.reclassifying = False
            log.warning("classing the stored failures again by rules %s failed: %s", watch.table.version, exc)
            return
        watch.cursor, watch.reclassified = step.cursor, watch.reclassified + step.rows
        if step.rows:
            store.wrote()  # readers see it at the next publish
        if step.done:
            watch.reclassifying = False
            if watch.reclassified:
                log.info("%d failures classed again by rules %s", watch.reclassified, watch.table.version)

    async def _replay_targets(self) -> dict[TopicPartition, int] | None:
        """A replay's end: the end offsets when it started (it is then caught up to that moment); None for a run."""
        c = self._consumer
        assert c is not None
        if not self.opts.replay:
            return None
        started_us = time.time_ns() // 1000
        targets: dict[TopicPartition, int] = await c.end_offsets(self._parts)
        self._progress.asked(started_us, {(tp.topic, tp.partition): end for tp, end in targets.items()})
        return targets

    async def _finish(self, pending: Pending) -> None:
        """Commit what is pending and wait for the commit (or upkeep job) in flight."""
        await self._flush(pending)
        if self._inflight is not None:
            inflight, self._inflight = self._inflight, None
            await inflight
