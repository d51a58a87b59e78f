"""Delivery: ship spooled records to Kafka (acks=all, idempotent) and advance the spool's cursor."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import threading
import time
from typing import Any

from flightrec.producer.fit import (
    MIN_LIMIT,
    TOO_LARGE,
    Outgoing,
    is_permanent,
    marker_for,
    message_size,
    split_log_batch,
)
from flightrec.producer.redact import visible
from flightrec.producer.spool import AnySpool, Position, Record, Spool
from flightrec.schemas import now_us
from flightrec.schemas.auth import Signer, parse_fleet_key
from flightrec.schemas.sendtime import sent_header

from flightrec.errors import ConfigError, DeliveryError
from flightrec.settings import STOCK_MAX_MESSAGE_BYTES, TOPIC_LIFECYCLE, TOPICS, Settings

log = logging.getLogger(__name__)

POLL_S = 0.05  # how often appends by other processes are looked for
LOCK_RETRY_S = 0.2
ROUND_BYTES = 16 * 1024 * 1024  # records read and sent per round (acknowledgements awaited once per round)
BACKOFF_S = (0.2, 0.5, 1.0, 2.0, 3.0)
AWAY_AFTER_S = 2.0  # an attempt that has not come back after this long may mean Kafka does not answer
PROBE_EVERY_S = 1.0  # then a TCP connection to the bootstrap addresses decides, at most this often
PROBE_TIMEOUT_S = 0.5
# Bytes kept under a topic's limit for a message's headers (the send time, the writer's tag): events are built
# further under it (fit.py MARGIN, batcher.py BATCH_SLACK); parts of a split batch are cut to leave this room
HEADER_ROOM = 256


def bootstrap_answers(bootstrap: str, timeout: float = PROBE_TIMEOUT_S) -> bool:
    """Whether any of the bootstrap addresses ('host:port,host:port') accepts a TCP connection now."""
    for address in bootstrap.split(","):
        host, _, port = address.strip().rpartition(":")
        try:
            with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
                return True
        except (OSError, ValueError):
            continue
    return False


def producer_kwargs(settings: Settings, limits: dict[str, int] | None = None) -> dict[str, Any]:
    """aiokafka producer options: acks=all, idempotence, small linger, batches within the smallest topic limit."""
    limits = limits or {}
    largest = max(limits.values(), default=STOCK_MAX_MESSAGE_BYTES)
    smallest = min(limits.values(), default=STOCK_MAX_MESSAGE_BYTES)
    return dict(
        settings.kafka_kwargs(),
        acks="all",
        enable_idempotence=True,
        linger_ms=5,
        max_batch_size=max(1024, min(1024 * 1024, smallest - 512)),
        max_request_size=largest,
        request_timeout_ms=30000,
        retry_backoff_ms=200,
        metadata_max_age_ms=60000,
        client_id=f"flightrec-agent:{visible(settings.instance)[0]}",  # per-instance quota; non-UTF-8 bytes as \xNN
    )


def signer_for(settings: Settings) -> Signer | None:
    """Who tags this process's messages (schemas/auth.py): the instance's enrolled key, else the manager's key
    where the fleet key is at hand (the operator's side), else nobody (an unauthenticated fleet). A key that
    cannot be read is said on stderr and the messages go untagged: the stage is never stopped for it (the
    materializer then refuses them as unauthenticated, saying why)."""
    try:
        if settings.instance_key:
            return Signer.from_token(settings.instance_key)
        if settings.fleet_key:
            return Signer.manager(parse_fleet_key(settings.fleet_key))
    except ConfigError as exc:
        log.error("flightrec: %s; messages go untagged", exc)
    return None


class Deliverer:
    """Runs in a thread of its own with its own event loop; one per agent process.

    Guarantees: only the process holding ``deliver.lock`` sends (the others' events
    are shipped by it, in seq order, from the shared spool); a record's cursor
    moves past it only after Kafka acknowledged it with acks=all; while the broker
    is away, records wait in the spool and sending resumes when it is back, and a
    retry never re-sends what Kafka already acknowledged; a record Kafka refuses
    for good (over the topic's ``max.message.bytes``, invalid, not authorized) is
    split where it can be (a LogBatch), else replaced by a Dropped marker keeping
    its seq, so it never blocks the records after it; after a crash, records after
    the saved cursor are sent again with the same bytes (the same event_id).
    """

    def __init__(self, spool: Spool, settings: Settings) -> None:
        self.spool = spool
        self.settings = settings
        self.events_sent = 0
        self.errors_total = 0
        self.last_error: str | None = None
        self.dropped: list[str] = []  # one line per record replaced by a marker
        self.denied: str | None = None  # why the broker refuses this credential (access.py), while it does
        self.limits: dict[str, int] = {}
        self._cause_line: str | None = None  # why Kafka cannot be reached, as connection_cause named it
        self._acked = spool.load_cursor()
        self._done: set[Position] = set()  # acknowledged records beyond the cursor: never sent again
        self._forced: dict[Position, str] = {}  # records refused for good (not for size): their marker is sent
        self._lock_fd: int | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._cond = threading.Condition()
        self._failed_attempt: float | None = None  # monotonic start of the last attempt, while attempts fail
        self._attempt_since: float | None = None  # monotonic: an attempt (connect, send) outstanding since then
        self._retry_now = False  # cut the current backoff short once (an exiting agent's last try)
        self._lock_busy = False  # another process held deliver.lock when this one last tried it
        self._probed: tuple[float, bool] | None = None  # (when, away) of the last connection probe
        self._signer = signer_for(settings)

    def limit(self, topic: str) -> int:
        """The largest message this agent may build for ``topic`` (learned, else the setting, else stock)."""
        learned = self.limits.get(topic)
        cap = self.settings.max_message_bytes
        if learned is None:
            return cap or STOCK_MAX_MESSAGE_BYTES
        return min(learned, cap) if cap else learned

    # -- control from other threads -------------------------------------------

    def start(self) -> None:
        """Start the delivery thread."""
        self._thread = threading.Thread(target=self._main, name="flightrec-deliver", daemon=True)
        self._thread.start()  # not waited for: the stage starts while it imports and connects (a notify
        # before its loop runs is not needed: it looks at the spool first thing, then every POLL_S)

    def notify(self) -> None:
        """Say that new records were appended (thread-safe; wakes the sender at once)."""
        loop, wake = self._loop, self._wake
        if loop is not None and wake is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(wake.set)

    @property
    def acked(self) -> Position:
        """How far this process has seen Kafka acknowledge (its own sends, or the cursor file)."""
        return self._acked

    def failing(self, since: float = 0.0) -> bool:
        """Whether delivery seems to fail: as the instance's sender, an attempt begun at or after ``since``
        (monotonic) failed, or one has not come back within AWAY_AFTER_S (counted from ``since`` at the
        earliest); otherwise, the sender (another process) says so in the spool."""
        if self._lock_fd is not None:
            failed, attempt = self._failed_attempt, self._attempt_since
            return (failed is not None and failed >= since) or (
                attempt is not None and time.monotonic() - max(attempt, since) >= AWAY_AFTER_S
            )
        # another process sends: its note says so (a note without a live sender is stale), or nothing it sent was
        # acknowledged for AWAY_AFTER_S (an attempt of its may hang longer than that: a broker dropping packets)
        return self._lock_busy and (self.spool.files.delivery_away_noted() or time.monotonic() - since >= AWAY_AFTER_S)

    def away(self, since: float = 0.0) -> bool:
        """Whether Kafka does not answer: delivery fails (:meth:`failing`) and no bootstrap address accepts a
        connection now. A broker that answers but refuses (credentials, a leader moving) is not away."""
        if not self.failing(since):
            return False
        now = time.monotonic()
        if self._probed is None or now - self._probed[0] >= PROBE_EVERY_S:
            self._probed = (now, not bootstrap_answers(self.settings.bootstrap))
        return self._probed[1]

    def retry_now(self) -> None:
        """Try again at once, cutting a backoff short (once): an exiting agent's last word on whether Kafka answers."""
        self._retry_now = True
        self.notify()

    def _slow_attempt(self) -> None:
        """An attempt has been out for AWAY_AFTER_S: if Kafka does not even accept a connection, say so in the spool
        now (the instance's other agents read it at their exit), not after aiokafka's own timeout."""
        if self._attempt_since is not None:
            threading.Thread(target=self._note_if_unreachable, name="flightrec-probe", daemon=True).start()

    def _note_if_unreachable(self) -> None:
        if not bootstrap_answers(self.settings.bootstrap):
            self.last_error = self.last_error or f"no answer from {self.settings.bootstrap} within {AWAY_AFTER_S:g}s"
            self.say_away()

    def say_away(self) -> None:
        """As the instance's sender, note in the spool that Kafka does not answer (the next agents read it at exit)."""
        if self._lock_fd is not None:
            self.spool.files.note_delivery_away(f"{time.time():.3f} {self.last_error or 'no answer'}\n")

    def _answer(self) -> None:
        """Kafka acknowledged a round of sends: delivery works (the spool's note, if any, is removed)."""
        self._failed_attempt = None
        self.denied = None
        self.spool.files.clear_delivery_away()

    def wait_delivered(self, target: Position, timeout: float, unless_away: bool = False) -> bool:
        """Block until everything before ``target`` is acknowledged, or ``timeout`` s passed.

        ``unless_away``: try once more at once, and stop waiting as soon as that try (or the instance's
        sender, when another process sends) says Kafka does not answer (:meth:`away`).
        """
        since = time.monotonic()
        deadline = since + timeout
        if unless_away:
            self.retry_now()
        while True:
            with self._cond:
                if self._acked >= target:
                    return True
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                # someone else delivers (a late-output process): its cursor is watched every 20 ms
                self._cond.wait(min(left, 0.1 if self._lock_fd is not None else 0.02))
                if self._lock_fd is None:  # someone else delivers: watch its cursor
                    self._acked = max(self._acked, self.spool.load_cursor())
                if self._acked >= target:
                    return True
            if unless_away and (self.denied is not None or self.away(since)):  # the probe runs without the lock
                return False  # the sender needs; a refused credential is refused again on every try

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
                    log.error(
                        "the delivery thread hit %s; it retries in %gs (events stay in the spool %s)",
                        self.last_error,
                        BACKOFF_S[-1],
                        self.spool.dir,
                    )
                    self._release()
                    time.sleep(BACKOFF_S[-1])
        finally:
            loop.close()
            self._release()

    def _try_lock(self) -> bool:
        if self._lock_fd is not None:
            return True
        fd = self.spool.files.try_lock_delivery()
        if fd is None:
            self._lock_busy = True
            return False
        self._lock_busy = False
        self._lock_fd = fd
        self._acked = max(self._acked, self.spool.load_cursor())
        return True

    def _release(self) -> None:
        if self._lock_fd is not None:
            self.spool.files.release_delivery(self._lock_fd)
            self._lock_fd = None

    def _set_acked(self, pos: Position) -> None:
        with self._cond:
            self._acked = pos
            self._cond.notify_all()

    async def _sleep(self, seconds: float) -> None:
        assert self._wake is not None
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), seconds)
        self._wake.clear()

    async def _backoff(self, seconds: float) -> None:
        """Wait ``seconds`` after a failed attempt: new records do not cut it short (no retry storm), a stop does."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        while not self._stopping and not self._retry_now and (left := deadline - loop.time()) > 0:
            await self._sleep(left)
        self._retry_now = False

    async def _learn_limits(self) -> bool:
        """Ask the cluster for each topic's max.message.bytes; keep what is known when it cannot tell."""
        from flightrec.cluster import topic_limits

        try:
            learned = await topic_limits(self.settings.kafka_kwargs(), TOPICS)
        except Exception as exc:  # no DescribeConfigs right, broker away: the setting or the stock limit applies
            if self._stopping:  # the agent has said its last word: a try cut short by its stop is not news
                return False
            log.info(
                "cannot describe the topics' max.message.bytes (%s: %s); using %d bytes",
                type(exc).__name__,
                exc,
                self.limit(TOPIC_LIFECYCLE),
            )
            return False
        self.limits.update(learned)
        return True

    def _outgoing(self, rec: Record) -> list[Outgoing]:
        """What to send for a spooled record: itself when it fits its topic's limit, else parts, else a marker."""
        forced = self._forced.get(rec.end)
        if forced is not None:
            return [self._drop(rec, f"Kafka refused it: {forced}")]
        limit = self.limit(rec.topic) - HEADER_ROOM  # the record's headers count against the topic's limit too
        if message_size(rec.key, rec.value) <= limit:
            return [Outgoing(rec.topic, rec.key, rec.value)]
        parts = split_log_batch(rec.value, rec.key, limit)
        if parts is not None:
            return [Outgoing(rec.topic, rec.key, p) for p in parts]
        return [
            self._drop(
                rec,
                f"too large: the {len(rec.value)}-byte message is over {rec.topic}'s limit of "
                f"{limit} bytes (max.message.bytes) and cannot be split",
            )
        ]

    def _drop(self, rec: Record, reason: str) -> Outgoing:
        line = f"seq {rec.seq} on {rec.topic} ({len(rec.value)} bytes): {reason}"
        if line not in self.dropped:
            self.dropped.append(line)
            log.error("Kafka refuses an event for good; a Dropped marker keeps its place: %s", line)
        return Outgoing(TOPIC_LIFECYCLE, rec.key, marker_for(rec, reason))

    async def _send_one(self, producer: Any, out: Outgoing) -> Any:
        """Send one message; signed, it goes to the partition its tag names: the one the client's default partitioner
        picks for its key now (schemas/auth.py: a copy in another partition is refused)."""
        # the send time (schemas/sendtime.py): the clock is judged by it, never by an event's own time
        headers = [sent_header(now_us())]
        if self._signer is None:
            return await producer.send(out.topic, out.value, key=out.key, headers=headers)
        from aiokafka.partitioner import DefaultPartitioner

        partitions = sorted(await producer.partitions_for(out.topic))
        partition = DefaultPartitioner()(out.key, partitions, partitions)
        headers.append(self._signer.header(out.topic, partition, out.key, out.value))
        return await producer.send(out.topic, out.value, key=out.key, partition=partition, headers=headers)

    async def _send_all(self, producer: Any, records: list[Record]) -> tuple[BaseException | None, bool]:
        """Send what is not yet acknowledged; mark what Kafka acknowledged. Returns (transient error, retry now)."""
        plans: list[tuple[Record, list[Any]]] = []
        transient: BaseException | None = None
        for rec in records:
            if rec.end in self._done:
                continue
            futures = []
            for out in self._outgoing(rec):
                try:
                    futures.append(await self._send_one(producer, out))
                except Exception as exc:  # refused before sending (size) or the producer is unusable
                    futures.append(exc)
            plans.append((rec, futures))
        refused = False
        for rec, futures in plans:
            results = [f if isinstance(f, BaseException) else None for f in futures]
            pending = [f for f in futures if not isinstance(f, BaseException)]
            done = await asyncio.gather(*pending, return_exceptions=True)
            it = iter(done)
            results = [r if r is not None else next(it) for r in results]
            errors = [r for r in results if isinstance(r, BaseException)]
            if not errors:
                self._done.add(rec.end)
                self.events_sent += 1
                continue
            permanent = [e for e in errors if is_permanent(e)]
            if not permanent:
                transient = transient or errors[0]
                continue
            refused = True
            why = permanent[0]
            if rec.end in self._forced:  # even its marker is refused: retry, and say why
                transient = transient or why
            elif type(why).__name__ in TOO_LARGE:
                before = self.limit(rec.topic)
                await self._learn_limits()
                if self.limit(rec.topic) >= before:  # the cluster did not say less: believe the refusal, halve
                    if before <= MIN_LIMIT:
                        self._forced[rec.end] = f"{type(why).__name__}: {why}"
                    else:
                        self.limits[rec.topic] = max(MIN_LIMIT, before // 2)
            else:
                self._forced[rec.end] = f"{type(why).__name__}: {why}"
        return transient, refused

    async def _run(self) -> None:
        from aiokafka import AIOKafkaProducer

        self._wake = asyncio.Event()
        self._ready.set()
        producer: AIOKafkaProducer | None = None
        failures = 0
        learned = 0
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
                records, nxt = self.spool.read(cursor, end, ROUND_BYTES)
                if not records:
                    self.spool.save_cursor(nxt)
                    self._set_acked(nxt)
                    continue
                transient: BaseException | None = None
                refused = False
                self._attempt_since = time.monotonic()
                slow = asyncio.get_running_loop().call_later(AWAY_AFTER_S, self._slow_attempt)
                try:
                    if producer is None:
                        if learned < 3:  # until the cluster told us (or three tries: then the setting/stock limit)
                            learned = 3 if await self._learn_limits() else learned + 1
                        producer = AIOKafkaProducer(**producer_kwargs(self.settings, self.limits))
                        try:
                            await producer.start()
                        except BaseException:
                            p, producer = producer, None
                            await _close(p)
                            raise
                    transient, refused = await self._send_all(producer, records)
                except Exception as exc:  # KafkaError, OSError, timeouts: the records stay spooled
                    transient = exc
                slow.cancel()
                if transient is not None:  # said before the cause is probed: an exiting agent need not wait
                    self._failed_attempt = self._attempt_since
                    with self._cond:
                        self._cond.notify_all()
                self._attempt_since = None
                self._advance(records)
                if refused and producer is not None:  # a fresh producer: new batch sizes, clean sequence numbers
                    p, producer = producer, None
                    await _close(p)
                if transient is not None:
                    self.errors_total += 1
                    failures += 1
                    if failures == 1 or (failures % 20 == 0):  # name the cause: credentials, TLS, nothing there...
                        self._cause_line = await self._cause()
                    self.last_error = self._cause_line or f"{type(transient).__name__}: {transient}"
                    self.denied = self._denial(transient)
                    self.say_away()
                    if failures == 1:
                        log.warning(
                            "cannot deliver to Kafka at %s (%s); events wait in the spool %s",
                            self.settings.bootstrap,
                            self.last_error,
                            self.spool.dir,
                        )
                    if producer is not None:
                        p, producer = producer, None
                        await _close(p)
                    await self._backoff(BACKOFF_S[min(failures, len(BACKOFF_S)) - 1])
                    continue
                if failures:
                    log.info("delivery to Kafka resumed after %d failed attempts", failures)
                self._answer()
                failures = 0
                self._cause_line = None
        finally:
            if producer is not None:
                await _close(producer)
            self._release()

    def _denial(self, exc: BaseException) -> str | None:
        """One line when the broker refuses this credential (authorization, or the login the cause names)."""
        from flightrec.access import REFUSED_LOGIN, refusal_line, refusal_of

        refusal = refusal_of(exc)
        if refusal is not None:
            return refusal_line(refusal, self.settings.kafka_kwargs(), "write")
        if self._cause_line and REFUSED_LOGIN in self._cause_line:
            return self._cause_line  # connection_cause names the user and role
        return None

    async def _cause(self) -> str | None:
        from flightrec.cluster import connection_cause

        try:
            return await connection_cause(self.settings.kafka_kwargs(), timeout=5.0)
        except Exception:  # the probe is advice only
            return None

    def _advance(self, records: list[Record]) -> None:
        """Move the cursor over the acknowledged prefix of ``records`` (the rest is remembered, not resent)."""
        pos = None
        for rec in records:
            if rec.end not in self._done:
                break
            self._done.discard(rec.end)
            self._forced.pop(rec.end, None)
            pos = rec.end
        if pos is not None:
            self.spool.save_cursor(pos)
            self._set_acked(pos)


async def _close(producer: Any) -> None:
    with contextlib.suppress(BaseException):  # a producer that cannot stop cleanly is abandoned
        await asyncio.wait_for(producer.stop(), 5.0)


def require_delivered(ok: bool, spool: AnySpool, timeout: float, last_error: str | None) -> None:
    """Raise DeliveryError (saying what is left and what to do) when a flush did not finish."""
    if ok:
        return
    why = f" (last error: {last_error})" if last_error else ""
    raise DeliveryError(
        f"{spool.pending()} events of instance {spool.instance_id!r} were not acknowledged within {timeout:g}s{why}; "
        f"they stay in {spool.dir}: run `flightrec agent flush --instance {spool.instance_id}` when Kafka is reachable"
    )
