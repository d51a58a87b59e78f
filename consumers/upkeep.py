"""What a materializer does between its commits to keep a database file bounded: retention in small steps
(db/retention.py), compaction at a quiet moment (db/compact.py), and the file's figures for /metrics.

Every job runs in the writer thread in the gap after a commit, as the one thing in flight (the next commit waits
for it, so a job is kept short):
- a retention step when the batch being gathered is not due for twice as long as the last step took (its size
  adapts so that a step takes about ``STEP_S``), at most one per commit interval (the writer gives retention at most
  ``STEP_S`` of every interval, 0.05 of 0.5 s), or once every ``FORCE_S`` whatever the load, so that a writer that
  never idles still expires lines; when nothing is left to judge, the next look is ``IDLE_S`` later;
- a checkpoint once a retention pass deleted rows and found nothing more to judge: DuckDB writes the row groups
  anew without them, and the blocks they held become free (reused by the next rows, or returned by a compaction);
- the figures (file size, free blocks, oldest line, how far retention got) every ``FIGURES_S``, and the archive's
  position (listed in a thread of its own, never holding up a commit);
- a compaction when at least ``compact_free_share`` of the file is free blocks (and at least ``MIN_FREE_BYTES``),
  the retention pass is over and checkpointed (a compaction in the middle of one copies the rows it deletes next,
  whose space then stays in the new file), the materializer keeps up (the batch being gathered is small), and the
  last one was ``COMPACT_EVERY_S`` ago:
  the store is closed, the file copied and renamed (commits wait meanwhile: the time is on /metrics and in the
  log), the store opened again.
A job that fails is logged and tried again later; it never stops the materializer.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
from flightrec.consumers.storefigures import StoreFigures
from flightrec.db import compact, retention
from flightrec.db.keep import Keep
from flightrec.db.retention import StepResult

from flightrec.errors import FlightrecError

log = logging.getLogger(__name__)
STEP_S = 0.05  # what one retention step should take
FORCE_S = 30.0  # a step at least this often, even when commits never leave a gap
IDLE_S = 60.0  # the next look once nothing is left to judge
CONTEXT_S = 60.0  # the failures' context is read again this often (it changes only with failures)
FIGURES_S = 30.0
COMPACT_EVERY_S = 3600.0
MIN_FREE_BYTES = 64 << 20
FAILED_PAUSE_S = 300.0  # after a job failed


@dataclass
class _Sizing:
    """The retention step's size, adapted so that a step takes about STEP_S."""

    events: int = 100  # small at first: the first step of a run reads a cold file
    lo: int = 20
    hi: int = 200_000

    def adapt(self, seconds: float, judged: int) -> None:
        if judged < self.events:  # the step ran out of work: its time says nothing about its size
            return
        if seconds > STEP_S:
            self.events = max(self.lo, int(self.events * 0.6))
        elif seconds < STEP_S / 2:
            self.events = min(self.hi, int(self.events * 1.5))


class Upkeep:
    """The jobs of one file's materializer (see the module's doc). ``run(fn, *args)`` runs in the writer thread;
    ``reopen(between)`` closes the store, runs ``between`` and opens the store again (the materializer's); ``wrote()``
    says, in the writer thread, that a step deleted rows (readers see it at the next publish)."""

    def __init__(
        self,
        keep: Keep,
        path: Path,
        figures: StoreFigures,
        *,
        run: Callable[..., Awaitable[Any]],
        con: Callable[[], duckdb.DuckDBPyConnection],
        wrote: Callable[[], None] = lambda: None,
        reopen: Callable[[Callable[[], Any]], Awaitable[Any]],
        commit_interval: float,
        compact_free_share: float = 0.5,
        archive: str | None = None,
        topics: tuple[str, ...] = (),
    ) -> None:
        self.keep = keep
        self.path = path
        self.figures = figures
        self._run, self._con, self._reopen, self._wrote = run, con, reopen, wrote
        self.commit_interval = commit_interval
        self.compact_free_share = compact_free_share
        self.sizing = _Sizing()
        now = time.monotonic()
        self.next_step = now if keep.enforced else float("inf")
        self.last_step = now
        self.next_figures = now
        self.last_compaction = now - COMPACT_EVERY_S  # a file found mostly free is compacted at the first quiet time
        self.paused_until = 0.0
        self.context: tuple[pa.Table, pa.Table] | None = None
        self.context_read = 0.0
        self.step_seconds = STEP_S  # the last step's duration
        self.total = StepResult()
        self.deleted_since_checkpoint = 0
        self.expiring = keep.enforced  # a retention pass has more to judge (none judged yet at the start)
        self.archive, self.topics = archive, topics
        self.archive_read: asyncio.Task[None] | None = None

    def start(self, now: float, pending: Any) -> asyncio.Future[None] | None:
        """The job due now (``now``: the loop's clock, monotonic), started (the caller holds it as the one thing in
        flight), or None."""
        if now < self.paused_until:
            return None
        if self._compaction_due(now, pending):
            return asyncio.ensure_future(self._guarded("compaction", self._compact))
        if self.deleted_since_checkpoint and now >= self.next_step:  # a pass is done: its deletes written out
            self.deleted_since_checkpoint = 0
            return asyncio.ensure_future(self._guarded("a checkpoint", self._checkpoint))
        if now >= self.next_figures:
            self.next_figures = now + FIGURES_S
            if self.archive and (self.archive_read is None or self.archive_read.done()):
                self.archive_read = asyncio.ensure_future(self._position())
            return asyncio.ensure_future(self._guarded("reading the database's figures", self._read_figures))
        if self._step_due(now, pending):
            self.last_step = now
            return asyncio.ensure_future(self._guarded("retention", self._step))
        return None

    def _step_due(self, now: float, pending: Any) -> bool:
        if now < self.next_step:
            return False
        if now - self.last_step >= FORCE_S:
            return True
        if pending.full(now):
            return False
        waited = now - pending.since if pending.records else 0.0
        return self.commit_interval - waited > 2 * self.step_seconds

    def _compaction_due(self, now: float, pending: Any) -> bool:
        f = self.figures.figures
        if self.compact_free_share <= 0 or not f.database_bytes or f.free_bytes is None:
            return False
        if now - self.last_compaction < COMPACT_EVERY_S or f.free_bytes < MIN_FREE_BYTES:
            return False
        if self.expiring or self.deleted_since_checkpoint:  # mid-pass: it would copy what the pass deletes next
            return False
        quiet = pending.bytes < pending.max_bytes // 4 and pending.lines < pending.max_lines // 4
        return quiet and f.free_bytes >= self.compact_free_share * f.database_bytes

    async def _guarded(self, what: str, job: Callable[[], Awaitable[None]]) -> None:
        try:
            await job()
        except (FlightrecError, duckdb.Error, OSError) as exc:
            self.paused_until = time.monotonic() + FAILED_PAUSE_S
            log.warning("%s failed (the materializer goes on; tried again in %.0f s): %s", what, FAILED_PAUSE_S, exc)

    async def _step(self) -> None:
        started = time.monotonic()
        result: StepResult = await self._run(self._step_in_writer)
        seconds = self.step_seconds = time.monotonic() - started
        self.sizing.adapt(seconds, result.events_judged)
        self.total += result
        self.figures.add(lines=result.lines_deleted, samples=result.samples_merged)
        self.deleted_since_checkpoint += result.lines_deleted + result.samples_merged
        self.expiring = not result.done
        self.next_step = started + (IDLE_S if result.done else self.commit_interval)  # one step an interval
        if result.lines_deleted or result.samples_merged:
            log.debug("retention step: %s in %.3f s", result, seconds)

    def _step_in_writer(self) -> StepResult:
        con = self._con()
        now = time.monotonic()
        if self.context is None or now - self.context_read >= CONTEXT_S:
            self.context = retention.kept_context(con, self.keep, time.time_ns() // 1000)
            self.context_read = now
        result = retention.run_step(con, self.keep, max_events=self.sizing.events, context=self.context)
        if result.lines_deleted or result.samples_merged:
            self._wrote()  # not a commit: the readers' next snapshot has it all the same
        return result

    async def _checkpoint(self) -> None:
        started = time.monotonic()
        await self._run(lambda: self._con().execute("CHECKPOINT"))
        log.info("retention: checkpointed the deleted rows out of %s in %.2f s", self.path, time.monotonic() - started)
        self.next_figures = 0.0  # the free blocks it made: read them now

    async def _position(self) -> None:
        """The archive's next offset per partition, for /metrics (a failure is logged: the archive may be away)."""
        from flightrec.consumers.archive import Archive  # only where an archive is set

        try:
            archive = Archive(self.archive or "")
            position = await asyncio.to_thread(archive.position, self.topics)
        except (FlightrecError, OSError, pa.ArrowException) as exc:
            log.warning("cannot read the archive's position for /metrics: %s", exc)
            return
        self.figures.update(archive_next=position)

    async def _read_figures(self) -> None:
        figures = await self._run(self._figures_in_writer)
        self.figures.update(**figures)

    def _figures_in_writer(self) -> dict[str, Any]:
        con = self._con()
        _, free = compact.free_bytes(con)
        return {
            "database_bytes": compact.file_bytes(self.path),
            "free_bytes": free,
            "oldest_line_us": retention.oldest_line_us(con),
            "expired_before_us": retention.mark(con, "lines"),
        }

    async def _compact(self) -> None:
        self.last_compaction = time.monotonic()
        f = self.figures.figures
        log.info(
            "compacting %s (%.0f of %.0f MiB free): commits wait until it is done",
            self.path,
            (f.free_bytes or 0) / 2**20,
            (f.database_bytes or 0) / 2**20,
        )
        done: compact.Compaction = await self._reopen(lambda: compact.compact_file(self.path, lock_wait=5.0))
        self.figures.update(
            compactions=self.figures.figures.compactions + 1,
            compaction_seconds=done.seconds,
            database_bytes=done.bytes_after,
            free_bytes=0,
        )
        log.warning("%s; commits waited for it", done.summary())
