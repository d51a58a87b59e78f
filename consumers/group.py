"""Materializers in a Kafka consumer group writing one DuckLake: ownership, claims, fencing, maintenance.

The group's coordinator hands out partitions with the range assignor: the four topics are keyed by instance id
with equal partition counts, so each member gets the same partition numbers of every topic (a *shard*, see
lakestore.py) and so every event of an instance. Offsets are never committed to Kafka: they live in the lake
and commit in the same transaction as the rows. On assignment the member claims its shards in the lake (epoch +
1) and seeks each partition to the offset stored there; on revocation it first commits what it holds. Records
fetched for a partition before its seek took effect, or after it was revoked, are dropped by offset, never
folded twice. A member whose claim was taken (Fenced) writes nothing for those shards and drops them.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import logging
from collections import defaultdict
from collections.abc import Awaitable, Callable, Mapping

import duckdb
from aiokafka import ConsumerRebalanceListener, TopicPartition
from aiokafka.coordinator.assignors.range import RangePartitionAssignor
from flightrec.consumers.materializer import Materializer, Options, Pending, Record
from flightrec.db import lake as lakes
from flightrec.db.fold import Delta, fold
from flightrec.db.lakestore import LakeStore
from flightrec.db.location import LakeLocation
from flightrec.db.reclassify import START
from flightrec.db.stats import Stats

from flightrec.errors import Fenced, MaterializeError

log = logging.getLogger(__name__)
RUN_RECORD_S = 30.0  # how often a member updates its row of materializer_runs


class _Listener(ConsumerRebalanceListener):
    """Forwards the group's rebalance callbacks to the materializer (aiokafka awaits them)."""

    def __init__(self, owner: GroupMaterializer) -> None:
        self.owner = owner

    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        await self.owner._in_callback("let partitions go", self.owner._revoked(set(revoked)))

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        await self.owner._in_callback("take partitions", self.owner._assigned(set(assigned)))


class GroupMaterializer(Materializer):
    """One member of a consumer group writing a DuckLake (``Options.db`` is the lake's ``ducklake:`` string).

    With ``replay`` it is no group member: it takes every partition, claims every shard of a lake that must hold
    no events yet, and stops at the end offsets seen at start, like a replay into a file.
    """

    # a commit costs the catalog CPU whatever its size (docs/lake.md; BENCHMARKS.md, The lake): a member commits once
    # per window however its input trickles, so one catalog's load per member stays bounded; what is read of a backlog
    # is committed as soon as the topics go quiet (a short backlog does not wait for the window)
    quiet_commit_bytes = 4 << 20
    # A lake's commit has a fixed price (catalog round trips per shard: claims, offsets, derived rows): a backlog
    # read in larger batches pays it less often, for a member's memory (benchmarks/bench_lake.py; the throughput
    # against the file's and the peak RSS at each batch size: BENCHMARKS.md, The lake).
    default_batch_bytes = 48 << 20
    default_batch_lines = 1_500_000  # ~48 MiB of 60-byte lines; fewer when they are short (materializer.py)

    def __init__(self, kafka_kwargs: Mapping[str, object], options: Options) -> None:
        if options.webhook:
            raise MaterializeError(
                "webhook alerts are not sent from a lake (their outbox is a table only one "
                "writer may own): run the materializer on a file for alerts, or drop --webhook"
            )
        options = dataclasses.replace(options, serve=False)  # readers read the lake itself, not a snapshot
        super().__init__(kafka_kwargs, options)
        self.loc = options.location
        if not isinstance(self.loc, LakeLocation):
            raise MaterializeError(
                f"{self.loc.describe()} is a database file, not a lake: a group writes a lake "
                "(--db 'ducklake:postgres:dbname=… host=… port=… user=…')"
            )
        self._lock = asyncio.Lock()  # one flush/drain at a time (the loop and the rebalance callbacks)
        self._assigned_once = False
        self._last_maintenance = 0.0
        self._last_record = 0.0
        self._failed: BaseException | None = None  # what a rebalance callback raised: the member stops with it
        # classing the stored failures again by the rules in use (consumers/rulewatch.py), shard by shard: the owned
        # shards done (or given up) for this table, and where each one begun got to (its cursor, rows built again)
        self._reclassified: set[int] = set()
        self._reclassifying: dict[int, tuple[tuple[str, str, str], int]] = {}

    # -- opening ----------------------------------------------------------------------------------------

    @property
    def _lake(self) -> LakeStore:
        """The open store, a LakeStore (the claims, shards and maintenance only a lake has)."""
        assert isinstance(self._store, LakeStore), "the store is opened in __aenter__"
        return self._store

    def _consumer_options(self) -> dict[str, object]:
        if self.opts.replay:
            return {"group_id": None}
        ms = int(self.opts.session_timeout * 1000)
        return {
            "group_id": self.opts.group,
            "partition_assignment_strategy": (RangePartitionAssignor,),
            "session_timeout_ms": ms,
            "heartbeat_interval_ms": max(500, ms // 4),
        }

    def _in_writer_later(self, fn: Callable[[], object]) -> None:
        """Queue ``fn`` in the writer thread without waiting for it (what is queued after it waits, as ever); a
        failure is logged (what must not fail is done again where it is needed: the views by a commit)."""

        def said(done: concurrent.futures.Future) -> None:
            exc = done.exception()
            if exc is not None:
                log.warning("%s: %s", getattr(fn, "__name__", fn), exc)

        self._writer.submit(fn).add_done_callback(said)

    async def _shard_count(self) -> tuple[list[TopicPartition], int]:
        parts = await self._partitions()
        counts = {t: sum(1 for tp in parts if tp.topic == t) for t in self.opts.topics}
        if len(set(counts.values())) != 1 or not parts:
            raise MaterializeError(
                f"the topics have different partition counts ({counts}); a lake's group needs "
                "equal counts (partition p of every topic holds the same instances): "
                "add partitions to match (kafka-topics --alter --partitions N)"
            )
        return parts, next(iter(counts.values()))

    async def _assign(self, initial: bool = False) -> bool:
        c = self._consumer
        assert c is not None and self._store is not None
        if not initial:
            return False  # the group's coordinator follows new partitions by itself
        parts, shards = await self._shard_count()
        await self._in_writer(self._lake.add_shards, range(shards), views=False)  # made once shards are claimed
        if not self.opts.replay:
            c.subscribe(list(self.opts.topics), listener=_Listener(self))
            return True
        stored = await self._in_writer(self._lake.claim, range(shards))
        self._in_writer_later(self._lake.make_views)
        c.assign(parts)
        for tp in parts:
            self._next[tp] = stored.get((tp.topic, tp.partition))
        await self._seek(parts, {tp: self._next[tp] for tp in parts})
        self._parts = parts
        self._assigned_once = True
        return True

    def stop(self) -> None:
        """Ask the run loop to commit what it holds and return; a commit waiting for the lake's catalog gives up."""
        super().stop()
        if self._store is not None:
            self._lake.stop_waiting.set()

    # -- the group's callbacks ---------------------------------------------------------------------------

    async def _in_callback(self, what: str, step: Awaitable[None]) -> None:
        """Run a rebalance step. aiokafka logs and swallows what a listener raises, and reading on would skip
        what the step was to commit (a drain) or read partitions never claimed; so a failure is kept, nothing more
        is committed, and the member stops: run() raises it. A restart goes on from the offsets in the lake."""
        try:
            await step
        except Exception as exc:  # noqa: BLE001 - kept and raised by run()
            if self._failed is None:
                self._failed = exc
            log.error("could not %s in the rebalance (%s); stopping, nothing more is committed", what, exc)
            self._next.clear()
            self.stop()

    async def _assigned(self, assigned: set[TopicPartition]) -> None:
        """Claim the shards of ``assigned`` in the lake and seek each partition to its stored offset."""
        c = self._consumer
        assert c is not None and self._store is not None
        shards = sorted({tp.partition for tp in assigned})
        stored = await self._in_writer(self._lake.claim, shards) if shards else {}
        self._in_writer_later(self._lake.make_views)  # the views while this member reads (a commit waits for them)
        for tp in assigned:
            self._next[tp] = stored.get((tp.topic, tp.partition))
        await self._seek(assigned, {tp: self._next[tp] for tp in assigned})
        self._assigned_once = True
        log.info("member %s owns shards %s", self._lake.owner, shards)

    async def _revoked(self, revoked: set[TopicPartition]) -> None:
        """Commit what is held (this member still owns the shards until the group moves on), then let them go."""
        await self._drain()
        for tp in revoked:
            self._next.pop(tp, None)
        shards = {tp.partition for tp in revoked} - {tp.partition for tp in self._next}
        if shards and self._store is not None:
            await self._in_writer(self._lake.release, shards)

    # -- reading and committing --------------------------------------------------------------------------

    async def _flush(self, pending: Pending) -> None:
        async with self._lock:
            await self._flush_locked(pending)

    async def _flush_locked(self, pending: Pending) -> None:
        if not pending.records:
            return
        if self._failed is not None:  # a rebalance step failed: what is held is read again after a restart
            pending.take()
            return
        by_shard: dict[int, list[Record]] = defaultdict(list)
        for r in pending.take():
            by_shard[r.partition].append(r)
        deltas = {s: fold(records, keep=self._keep, trust=self._trust) for s, records in by_shard.items()}
        if self._inflight is not None:
            await self._inflight
        self._inflight = asyncio.ensure_future(self._commit_shards(deltas))

    async def _commit_shards(self, deltas: dict[int, Delta]) -> None:
        """Commit the shards' Deltas in one transaction; a fenced shard is dropped and the rest committed."""
        assert self._store is not None
        while deltas:
            try:
                self.stats += await self._guard.commit(
                    lambda: self._in_writer(self._lake.commit, deltas),  # noqa: B023 - awaited here, in this pass
                    self._reopen_lake,
                    self._stop,
                    held=f"batch of {sum(d.messages for d in deltas.values())} messages",
                )
                return
            except Fenced as exc:
                lost = await self._drop_fenced(exc)
                deltas = {s: d for s, d in deltas.items() if s not in lost}

    async def _drop_fenced(self, exc: Fenced) -> set[int]:
        """Shards another member claimed since: counted, logged, no longer read or written here; returns them."""
        self.stats += Stats(fenced=1)
        log.warning("%s", exc)
        lost = set(exc.shards)
        for tp in [tp for tp in self._next if tp.partition in lost]:
            del self._next[tp]
        await self._in_writer(self._lake.release, lost)
        return lost

    # -- the operator's rules file ------------------------------------------------------------------------

    def _rules_job(self, now: float) -> asyncio.Future[None] | None:
        """A changed operator's rules file taken up for the next commits, and a step of classing the stored failures
        of an owned shard again (the shards one after another, each from its start; a shard claimed later too),
        started as the one thing in flight, or None. Only with the operator's file set, and not in a replay."""
        watch = self._rules
        if self._store is None or self.opts.replay or watch.path is None:
            return None
        if watch.look(now):
            self._lake.rules = watch.table  # nothing in flight: the next commit classes by it
            self._reclassified, self._reclassifying = set(), {}
        owned = set(self._lake.epochs)
        self._reclassified &= owned  # a shard let go is classed again if it comes back (another may have written it)
        todo = sorted(owned - self._reclassified)
        return asyncio.ensure_future(self._reclassify_shard(todo[0])) if todo else None

    async def _reclassify_shard(self, shard: int) -> None:
        """One step of classing the failures of ``shard`` again, in the writer thread; a shard claimed away is dropped
        as a fenced commit's, one whose step fails is logged and given up until the rules change again."""
        version = self._rules.table.version
        cursor, rows = self._reclassifying.get(shard, (START, 0))
        try:
            step = await self._in_writer(self._lake.reclassify, shard, cursor)
        except Fenced as exc:
            await self._drop_fenced(exc)
            self._reclassifying.pop(shard, None)
            return
        except (duckdb.Error, MaterializeError) as exc:
            self._reclassified.add(shard)
            self._reclassifying.pop(shard, None)
            log.warning("classing the stored failures of shard %d again by rules %s failed: %s", shard, version, exc)
            return
        if not step.done:
            self._reclassifying[shard] = (step.cursor, rows + step.rows)
            return
        self._reclassifying.pop(shard, None)
        self._reclassified.add(shard)
        if rows + step.rows:
            log.info("%d failures of shard %d classed again by rules %s", rows + step.rows, shard, version)

    async def _replay_archive(self) -> None:
        """The archive read into a lake that holds no events yet: every shard claimed first (the commits check it)."""
        if self.opts.archive:
            _, shards = await self._shard_count()
            await self._in_writer(self._lake.add_shards, range(shards), views=False)
            await self._in_writer(self._lake.claim, range(shards))
        await super()._replay_archive()

    async def _commit_archived(self, records: list[Record], ends: dict[tuple[str, int], int]) -> None:
        by_shard: dict[int, list[Record]] = defaultdict(list)
        for r in records:
            by_shard[r.partition].append(r)
        deltas = {s: fold(rs, keep=self._keep, trust=self._trust) for s, rs in by_shard.items()}
        for (topic, partition), end in ends.items():
            delta = deltas.get(partition) or fold([])
            deltas[partition] = dataclasses.replace(delta, offsets={**delta.offsets, (topic, partition): end})
        await self._commit_shards(deltas)

    async def _reopen_lake(self) -> None:
        await self._in_writer(self._lake.reopen)

    async def _drain(self) -> None:
        """Commit everything read so far and wait for it."""
        async with self._lock:
            await self._flush_locked(self._pending)
            if self._inflight is not None:
                inflight, self._inflight = self._inflight, None
                await inflight

    async def _reap(self) -> None:
        await super()._reap()
        loop = asyncio.get_running_loop()
        now = loop.time()
        if self._store is None:
            return
        if now - self._last_record >= RUN_RECORD_S:
            self._last_record = now
            self._in_writer_later(self._lake.record_run)  # bookkeeping: reading goes on meanwhile
        interval = lakes.MAINTENANCE_INTERVAL.total_seconds()
        if self._last_maintenance == 0.0:
            self._last_maintenance = now  # the first pass one interval after start
        elif now - self._last_maintenance >= interval and self._owns_shard_zero():
            self._last_maintenance = now
            async with self._lock:
                if self._inflight is not None:
                    inflight, self._inflight = self._inflight, None
                    await inflight
                await self._in_writer(self._lake_upkeep)

    def _lake_upkeep(self) -> None:
        """Retention's steps (FLIGHTREC_KEEP_*), then maintenance, which takes what they deleted out of the files."""
        if self.opts.keep.enforced:
            self._lake.retain(self.opts.keep)
        self._lake.maintain()

    def _owns_shard_zero(self) -> bool:
        """One member runs maintenance: the owner of partition 0 (a replay owns every partition)."""
        return any(tp.partition == 0 for tp in self._next)

    async def _caught_up(self, targets: dict[TopicPartition, int] | None = None) -> bool:
        c = self._consumer
        assert c is not None
        if not self._assigned_once:
            return False
        if targets is None:
            await self._drain()  # a commit in flight may be fenced: its shards are then not this member's
        owned = list(self._next)
        if targets is None and set(owned) != c.assignment():
            # the group is moving partitions, or this member was fenced from some that Kafka still assigns it
            # (it read none of their records): not caught up until the group has settled them
            return False
        if not owned:
            return True  # more members than partitions: nothing to read here
        ends = targets if targets is not None else await c.end_offsets(owned)
        for tp in owned:
            if tp in ends and await c.position(tp) < ends[tp]:
                return False
        return True

    async def run(self) -> Stats:
        """Consume until stopped or idle (``until_idle``); a replay stops at the end offsets seen at start."""
        stats = await super().run()
        if self._failed is not None:
            raise self._failed
        if self.opts.replay and self._store is not None:
            await self._in_writer(self._lake.maintain)
        return stats
