"""Delivery: ship spooled records to Kafka (acks=all, idempotent) and advance the spool's cursor."""

from __future__ import annotations

import asyncio
import fcntl
import logging
import os
import threading
import time
from typing import Any

from flightrec.errors import DeliveryError
from flightrec.settings import Settings

from flightrec.producer.spool import Position, Spool

log = logging.getLogger(__name__)

POLL_S = 0.05  # how often appends by other processes are looked for
LOCK_RETRY_S = 0.2
BACKOFF_S = (0.2, 0.5, 1.0, 2.0, 3.0)


def producer_kwargs(settings: Settings) -> dict[str, Any]:
    """aiokafka producer options: acks=all, idempotence, small linger, room for big log batches."""
    return dict(
        settings.kafka_kwargs(),
        acks="all",
        enable_idempotence=True,
        linger_ms=5,
        max_batch_size=1024 * 1024,
        max_request_size=8 * 1024 * 1024,
        request_timeout_ms=30000,
        retry_backoff_ms=200,
        metadata_max_age_ms=60000,
    )


class Deliverer:
    """Runs in a thread of its own with its own event loop; one per agent process.

    Guarantees: only the process holding ``deliver.lock`` sends (the others' events
    are shipped by it, in seq order, from the shared spool); a record's cursor
    moves past it only after Kafka acknowledged it with acks=all; while the broker
    is away, records wait in the spool and sending resumes when it is back; after a
    crash, records after the saved cursor are sent again with the same bytes (the
    same event_id), never dropped.
    """

    def __init__(self, spool: Spool, settings: Settings) -> None:
        self.spool = spool
        self.settings = settings
        self.events_sent = 0
        self.errors_total = 0
        self.last_error: str | None = None
        self._acked = spool.load_cursor()
        self._lock_fd: int | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._cond = threading.Condition()

    # -- control from other threads -------------------------------------------

    def start(self) -> None:
        """Start the delivery thread."""
        self._thread = threading.Thread(target=self._main, name="flightrec-deliver", daemon=True)
        self._thread.start()
        self._ready.wait(5)

    def notify(self) -> None:
        """Say that new records were appended (thread-safe; wakes the sender at once)."""
        loop, wake = self._loop, self._wake
        if loop is not None and wake is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(wake.set)
            except RuntimeError:
                pass

    @property
    def acked(self) -> Position:
        """How far this process has seen Kafka acknowledge (its own sends, or the cursor file)."""
        return self._acked

    def wait_delivered(self, target: Position, timeout: float) -> bool:
        """Block until everything before ``target`` is acknowledged, or ``timeout`` s passed."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._acked < target:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(min(left, 0.1))
                if self._lock_fd is None:  # someone else delivers: watch its cursor
                    self._acked = max(self._acked, self.spool.load_cursor())
            return True

    def stop(self, timeout: float = 5.0) -> None:
        """Stop sending (what is not acknowledged stays in the spool) and release the lock."""
        self._stopping = True
        self.notify()
        if self._thread is not None:
            self._thread.join(timeout)

    # -- the thread -----------------------------------------------------------

    def _main(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            while not self._stopping:  # the thread never dies: an unexpected error is said, and it tries again
                try:
                    loop.run_until_complete(self._run())
                except Exception as exc:  # a damaged spool, a bug: the spool keeps the events
                    self.errors_total += 1
                    self.last_error = f"{type(exc).__name__}: {exc}"
                    log.error("the delivery thread hit %s; it retries in %gs (events stay in the spool %s)",
                              self.last_error, BACKOFF_S[-1], self.spool.dir)
                    self._release()
                    time.sleep(BACKOFF_S[-1])
        finally:
            loop.close()
            self._release()

    def _try_lock(self) -> bool:
        if self._lock_fd is not None:
            return True
        fd = os.open(self.spool.dir / "deliver.lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            return False
        self._lock_fd = fd
        self._acked = max(self._acked, self.spool.load_cursor())
        return True

    def _release(self) -> None:
        if self._lock_fd is not None:
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
            os.close(self._lock_fd)
            self._lock_fd = None

    def _set_acked(self, pos: Position) -> None:
        with self._cond:
            self._acked = pos
            self._cond.notify_all()

    async def _sleep(self, seconds: float) -> None:
        assert self._wake is not None
        try:
            await asyncio.wait_for(self._wake.wait(), seconds)
        except asyncio.TimeoutError:
            pass
        self._wake.clear()

    async def _run(self) -> None:
        from aiokafka import AIOKafkaProducer

        self._wake = asyncio.Event()
        self._ready.set()
        producer: AIOKafkaProducer | None = None
        failures = 0
        try:
            while not self._stopping:
                if not self._try_lock():
                    self._set_acked(max(self._acked, self.spool.load_cursor()))
                    await self._sleep(LOCK_RETRY_S)
                    continue
                end = self.spool.committed_end()
                cursor = self._acked
                if cursor >= end:
                    await self._sleep(POLL_S)
                    continue
                records, nxt = self.spool.read(cursor, end)
                if not records:
                    self.spool.save_cursor(nxt)
                    self._set_acked(nxt)
                    continue
                try:
                    if producer is None:
                        producer = AIOKafkaProducer(**producer_kwargs(self.settings))
                        try:
                            await producer.start()
                        except BaseException:
                            p, producer = producer, None
                            await _close(p)
                            raise
                    futures = [await producer.send(r.topic, r.value, key=r.key) for r in records]
                    await asyncio.gather(*futures)
                except Exception as exc:  # KafkaError, OSError, timeouts: the records stay spooled
                    self.errors_total += 1
                    failures += 1
                    self.last_error = f"{type(exc).__name__}: {exc}"
                    if failures == 1:
                        log.warning("cannot deliver to Kafka at %s (%s); events wait in the spool %s",
                                    self.settings.bootstrap, self.last_error, self.spool.dir)
                    if producer is not None:
                        p, producer = producer, None
                        await _close(p)
                    await self._sleep(BACKOFF_S[min(failures, len(BACKOFF_S)) - 1])
                    continue
                if failures:
                    log.info("delivery to Kafka resumed after %d failed attempts", failures)
                failures = 0
                self.events_sent += len(records)
                self.spool.save_cursor(nxt)
                self._set_acked(nxt)
        finally:
            if producer is not None:
                await _close(producer)
            self._release()


async def _close(producer: Any) -> None:
    try:
        await asyncio.wait_for(producer.stop(), 5.0)
    except BaseException:  # a producer that cannot stop cleanly is abandoned
        pass


def require_delivered(ok: bool, spool: Spool, timeout: float, last_error: str | None) -> None:
    """Raise DeliveryError (saying what is left and what to do) when a flush did not finish."""
    if ok:
        return
    why = f" (last error: {last_error})" if last_error else ""
    raise DeliveryError(
        f"{spool.pending()} events of instance {spool.instance_id!r} were not acknowledged within {timeout:g}s{why}; "
        f"they stay in {spool.dir}: run `flightrec agent flush --instance {spool.instance_id}` when Kafka is reachable"
    )
