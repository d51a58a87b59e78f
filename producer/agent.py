"""The agent object: build events, spool them durably, deliver them in the background (sync and async)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from types import TracebackType
from typing import Any, Literal, cast

from flightrec.producer.batcher import LineSink
from flightrec.producer.claims import Claim, write_claim
from flightrec.producer.deliver import Deliverer, require_delivered
from flightrec.producer.facts import collect_facts, load_override
from flightrec.producer.fit import fit_exit_event
from flightrec.producer.handoff import Handoff, hand_off, late_stages, settle_late_output, still_writing
from flightrec.producer.heartbeat import HeartbeatThread, heartbeat
from flightrec.producer.lost import LostSpool
from flightrec.producer.members import Member, join, leave, running
from flightrec.producer.redact import Redactor, visible
from flightrec.producer.scrub import scrub
from flightrec.producer.shapes import SecretShape, SecretShapesError, builtin_shapes, load_shapes
from flightrec.producer.spool import AnySpool, BootSealedError, Spool, SpoolWriteError
from flightrec.schemas import (
    Event,
    EventT,
    InstanceFacts,
    Lifecycle,
    LogBatch,
    ProcessExit,
    Sealed,
    new_event_id,
    now_us,
)

from flightrec.errors import FlightrecError, SpoolError
from flightrec.settings import STOCK_MAX_MESSAGE_BYTES, TOPIC_LOGS, Settings

log = logging.getLogger(__name__)

_FILLED = ("event_id", "instance_id", "boot_id", "seq")


def say(text: str) -> None:
    """Tell the person at the terminal (stderr, whatever the log level): what the agent could not record."""
    try:
        sys.stderr.write(f"flightrec agent: {text}\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


class Losses:
    """What could not be spooled: counted, said loudly on stderr, and noted in the next event that is spooled.

    Guarantees: every event that was built but not written is counted once (and its lines,
    for log batches); the first loss of each reason is said on stderr at once; :meth:`take`
    hands the counts not yet noted to exactly one note event.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.events = self.lines = 0  # in total
        self._events = self._lines = 0  # not yet noted in an event
        self._reason = ""
        self._stage = ""
        self._said: set[str] = set()

    def add(self, exc: SpoolWriteError) -> None:
        """Count the events of ``exc`` (and their lines); say the reason on stderr the first time."""
        lines = sum(len(e.text) for e in exc.events if isinstance(e, LogBatch))
        stage = next((str(s) for e in exc.events if (s := getattr(e, "stage", ""))), "")
        with self._lock:
            self.events += len(exc.events)
            self.lines += lines
            if not isinstance(exc, BootSealedError):  # those belong to a sealed boot, which names the stage
                self._events += len(exc.events)
                self._lines += lines
                self._reason = exc.reason
                self._stage = self._stage or stage
            first = exc.reason not in self._said
            self._said.add(exc.reason)
        if first:
            say(
                f"NOT RECORDED: {exc.reason}. The command goes on; what cannot be spooled is counted "
                "and the count is sent with the next event that can be."
            )

    def take(self) -> tuple[int, int, str, str] | None:
        """(events, lines, reason, stage) lost since the last note, or None; the counts are then noted."""
        with self._lock:
            if not self._events:
                return None
            out = (self._events, self._lines, self._reason, self._stage or "agent")
            self._events = self._lines = 0
            self._stage = ""
            return out

    def give_back(self, taken: tuple[int, int, str, str]) -> None:
        """A note that could not be written: its counts wait for the next one."""
        with self._lock:
            self._events += taken[0]
            self._lines += taken[1]
            self._stage = self._stage or taken[3]


def _secrets(settings: Settings, env: Mapping[str, str]) -> tuple[tuple[str, ...], dict[str, str]]:
    """The redactor's names and values: FLIGHTREC_REDACT's, and the Kafka password (from its file too)."""
    values = dict(env)
    with contextlib.suppress(FlightrecError):  # an unreadable password file is reported by the first Kafka client
        values["FLIGHTREC_SASL_PASSWORD"] = settings.password() or ""
    return (*settings.redact, "FLIGHTREC_SASL_PASSWORD"), values


def _shapes(settings: Settings) -> tuple[SecretShape, ...]:
    """The secret shapes FLIGHTREC_SECRET_SHAPES asks for; a file that cannot be used is said on stderr and the
    built-in list masks instead: a bad shape never stops a stage."""
    try:
        return load_shapes(settings.secret_shapes)
    except SecretShapesError as exc:
        say(f"FLIGHTREC_SECRET_SHAPES: {exc}. Masking with the built-in secret shapes only until it is fixed.")
        return builtin_shapes()


class Stage:
    """``with agent.stage("x"):`` - Lifecycle started, then succeeded, or failed with the exception text.

    The exception is re-raised; works as ``async with`` too.
    """

    def __init__(self, agent: _AgentBase, name: str, attributes: Mapping[str, str] | None = None) -> None:
        self.agent = agent
        self.name = name
        self.attributes = dict(attributes or {})
        self._t0 = 0.0
        self._beats: HeartbeatThread | None = None

    def __enter__(self) -> Stage:
        self._t0 = time.monotonic()
        self.agent.event(self.name, "started", attributes=self.attributes)
        self._beats = heartbeat(self.agent, self.name, os.getpid())
        self._beats.start()
        return self

    def __exit__(
        self, et: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> Literal[False]:
        if self._beats is not None:
            self._beats.stop()
        attrs = dict(self.attributes, duration_s=f"{time.monotonic() - self._t0:.3f}")
        if exc is None:
            self.agent.event(self.name, "succeeded", attributes=attrs)
        else:
            detail = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            self.agent.event(self.name, "failed", detail=detail, attributes=attrs)
        return False

    async def __aenter__(self) -> Stage:
        return self.__enter__()

    async def __aexit__(
        self, et: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool:
        return self.__exit__(et, exc, tb)


class _AgentBase:
    """What the sync and the async agent share: event building, the spool, the deliverer.

    Guarantees: :meth:`emit` returns only once the event is written to the spool
    (fsync'd), carrying a fresh event_id, this boot's boot_id and the next seq of
    the boot (gap-free across every agent process of the instance); texts are
    masked by the redactor (FLIGHTREC_REDACT, URL credentials, secret shapes) before they are
    written; delivery never blocks emit, and a broker that is away only delays it.
    """

    def __init__(
        self,
        instance_id: str | None = None,
        settings: Settings | None = None,
        *,
        spool_dir: str | None = None,
        new_boot: bool = False,
        deliver: bool = True,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.settings = settings or Settings.from_env()
        self.instance_id = visible(instance_id or self.settings.instance)[0]  # non-UTF-8 bytes as \xNN
        root = spool_dir or self.settings.spool
        self.losses = Losses()
        self.spool: AnySpool
        working: Spool | None = None  # only a spool that works is delivered
        try:
            self.spool = working = Spool(root, self.instance_id, new_boot=new_boot)
        except SpoolError as exc:  # the stage must run anyway: nothing is recorded, and that is said
            say(f"NOT RECORDED: {exc}. Nothing of instance {self.instance_id} is recorded by this agent.")
            self.spool = LostSpool(root, self.instance_id, str(exc))
        self.redactor = Redactor(
            *_secrets(self.settings, os.environ if env is None else env), shapes=_shapes(self.settings)
        )
        self.deliverer: Deliverer | None = (
            Deliverer(working, self.settings) if deliver and working is not None else None
        )
        self.events_emitted = 0
        self._stage_member: Member | None = None  # the stage this agent runs (a seal does not wait for it)
        self._closed: bool | None = None  # once closed: whether everything was acknowledged then

    # -- lifecycle --------------------------------------------------------------

    def _start(self) -> None:
        if self.deliverer is not None:
            self.deliverer.start()

    def _close(self, timeout: float | None = None, unless_away: bool | None = None) -> bool:
        """Wait up to the flush timeout for delivery, stop; True if everything was acknowledged.

        ``unless_away`` (default: when no ``timeout`` is given): a Kafka that does not answer is not waited for.
        Closing again (``close()`` inside ``with``) does nothing and says how the first close went.
        """
        if self._closed is not None:
            return self._closed
        ok = True
        if self.losses.events:
            self._note_losses()
            say(
                f"NOT RECORDED in total: {self.losses.lines} log lines in {self.losses.events} events of "
                f"instance {self.instance_id}"
            )
        if self.deliverer is not None:
            # at the default exit, a Kafka that does not answer is not waited for (the events are safe in the spool)
            at_exit = timeout is None  # the default exit, not a caller's own bound
            unless_away = at_exit if unless_away is None else unless_away
            timeout = self.settings.flush_timeout if timeout is None else timeout
            t0 = time.monotonic()
            ok = self._flush_blocking(timeout, unless_away)
            away = not ok and self.deliverer.away(t0)
            if not ok and self.deliverer.denied is not None:
                self._say_denied()
            elif not ok:
                why = f" (last error: {self.deliverer.last_error})" if self.deliverer.last_error else ""
                after = (
                    f"Kafka at {self.settings.bootstrap} does not answer{why}: not waited for after "
                    f"{time.monotonic() - t0:.1f}s"
                    if away
                    else f"not yet acknowledged after {timeout:g}s{why}"
                )
                log.warning(
                    "%d events of %s %s; they stay in %s for `flightrec agent flush` or the next agent",
                    self.spool.pending(),
                    self.instance_id,
                    after,
                    self.spool.dir,
                )
            if away:
                self.deliverer.say_away()
            if self.deliverer.dropped:
                log.warning(
                    "%d events of %s were refused by Kafka for good and dropped (a Dropped marker keeps "
                    "each one's seq): %s",
                    len(self.deliverer.dropped),
                    self.instance_id,
                    "; ".join(self.deliverer.dropped),
                )
            # the thread's stop waits for a request in flight; a caller's own timeout bounds that wait too
            stop_wait = 0.2 if away else (5.0 if at_exit else min(5.0, max(0.2, timeout - (time.monotonic() - t0))))
            self.deliverer.stop(stop_wait)
        self.spool.close()
        self._closed = ok
        return ok

    def _say_denied(self) -> None:
        """The broker refuses this credential: stop the sender (its next tries would say the same), then say so last."""
        assert self.deliverer is not None
        denied = self.deliverer.denied
        self.deliverer.stop(0.2)
        log.warning(
            "%d events of %s not delivered: %s; they stay in %s for `flightrec agent flush` with a credential that "
            "may write",
            self.spool.pending(),
            self.instance_id,
            denied,
            self.spool.dir,
        )

    def _flush_blocking(self, timeout: float, unless_away: bool = False) -> bool:
        if self.deliverer is None:
            return False
        target = self.spool.committed_end()
        self.deliverer.notify()
        return self.deliverer.wait_delivered(target, timeout, unless_away)

    # -- events -----------------------------------------------------------------

    @property
    def boot_id(self) -> str:
        """The boot id the next event will carry (starting the boot if none is open)."""
        return self.spool.boot()[0]

    def emit_makers(
        self,
        makers: Sequence[Callable[[str, int], EventT]],
        once: str | None = None,
        encode: Callable[[Event], bytes] | None = None,
        sync: bool = True,
        scrubbed: bool = False,
        boot: str | None = None,
    ) -> list[EventT]:
        """Spool several events in one write (one fsync; ``sync=False``: group commit, see Spool); each maker
        gets (boot_id, seq).

        Every event is scrubbed first (:func:`scrub`): undecodable bytes escaped, secrets masked, then cut;
        ``scrubbed`` says the makers build events that are clean already (the line batcher's).
        """
        redactor, cap = self.redactor, self.settings.max_line

        def clean(make: Callable[[str, int], EventT]) -> Callable[[str, int], EventT]:
            def build(boot: str, seq: int) -> EventT:
                ev = scrub(make(boot, seq), redactor, cap)
                if isinstance(ev, ProcessExit):  # argv and tails cut (after masking) to fit the topic's limit
                    return fit_exit_event(ev, self.message_limit(ProcessExit.topic))
                return ev

            return build

        try:
            events = self.spool.append(
                makers if scrubbed else [clean(m) for m in makers], once=once, encode=encode, sync=sync, boot=boot
            )
        except SpoolWriteError as exc:  # never stop the caller (a stage): count it, say it, note it later
            self.losses.add(exc)
            return cast("list[EventT]", exc.events)  # built by these makers (for counting), as the error says
        if events:
            self._note_losses()
        self.events_emitted += len(events)
        if self.deliverer is not None and events:
            self.deliverer.notify()
        return events

    def line_sink(self) -> LineSink:
        """What a line source (flightrec.producer.batcher) needs of this agent: its batches go through
        :meth:`emit_makers` into the spool."""
        return LineSink(
            instance_id=self.instance_id,
            redactor=self.redactor,
            emit=self.emit_makers,
            sync_due=self.spool.sync_due,
            sync=self.spool.sync,
            logs_limit=lambda: self.message_limit(TOPIC_LOGS),
        )

    def _note_losses(self) -> None:
        """After a successful write: a Lifecycle ``info`` event saying what was lost before it, if anything."""
        taken = self.losses.take()
        if taken is None:
            return
        events, lines, reason, stage = taken
        eid, iid, ts = new_event_id(), self.instance_id, now_us()
        detail = f"not recorded: {lines} log lines in {events} events ({reason})"
        attrs = {"lost_events": str(events), "lost_lines": str(lines)}

        def make(boot: str, seq: int) -> Event:
            return scrub(
                Lifecycle(
                    event_id=eid,
                    instance_id=iid,
                    boot_id=boot,
                    seq=seq,
                    ts_us=ts,
                    stage=stage,
                    state="info",
                    detail=detail,
                    attributes=attrs,
                ),
                self.redactor,
                self.settings.max_line,
            )

        try:
            self.spool.append([make])
        except SpoolWriteError:
            self.losses.give_back(taken)

    def emit(self, cls: type[EventT], **fields: Any) -> EventT:
        """Build an event of type ``cls`` from ``fields`` (the common fields are filled in) and spool it."""
        bad = [k for k in _FILLED if k in fields]
        if bad:
            raise TypeError(f"emit fills {', '.join(bad)} itself; do not pass them")
        ts = fields.pop("ts_us", None) or now_us()
        if cls is Lifecycle:  # texts from shell scripts (masked and cut by emit_makers)
            if "detail" in fields:
                fields["detail"] = str(fields["detail"])
            if "attributes" in fields:
                fields["attributes"] = {str(k): str(v) for k, v in fields["attributes"].items()}
        eid = new_event_id()
        iid = self.instance_id

        def make(boot_id: str, seq: int) -> EventT:
            return cls(event_id=eid, instance_id=iid, boot_id=boot_id, seq=seq, ts_us=ts, **fields)

        try:
            return self.emit_makers([make])[0]
        except (TypeError, ValueError, IndexError) as exc:  # IndexError: not even built for counting
            raise TypeError(f"cannot build {cls.__name__} from {sorted(fields)}: {exc}") from exc

    def event(self, stage: str, state: str, detail: str = "", attributes: Mapping[str, str] | None = None) -> Lifecycle:
        """A Lifecycle event (started / succeeded / failed / skipped / info)."""
        return self.emit(Lifecycle, stage=stage, state=state, detail=detail, attributes=dict(attributes or {}))

    def stage(self, name: str, **attributes: str) -> Stage:
        """A context manager that reports a stage's start and its end (failed with the exception text)."""
        return Stage(self, name, attributes)

    def facts(self, force: bool = False, **overrides: Any) -> InstanceFacts | None:
        """Send InstanceFacts once per boot (None when this boot already has them, unless ``force``).

        Facts come from nvidia-smi and /proc; FLIGHTREC_FACTS (a JSON file) and ``overrides`` win.
        """
        override: dict[str, Any] = load_override(self.settings.facts) if self.settings.facts else {}
        override.update(overrides)
        boot_id, _ = self.spool.boot()
        if not force and self.spool.sent_once(boot_id, "facts"):
            return None
        values = collect_facts(override)
        eid, iid, ts = new_event_id(), self.instance_id, now_us()

        def make(boot: str, seq: int) -> InstanceFacts:
            return InstanceFacts(event_id=eid, instance_id=iid, boot_id=boot, seq=seq, ts_us=ts, **values)

        events = self.emit_makers([make], once=None if force else "facts")
        return events[0] if events else None

    def claim_follow(self, path: str, claim: Claim) -> None:
        """Record in the spool folder that the stage of ``claim.token`` follows ``path`` from ``claim`` on: an earlier
        stage's leftover following the same file stops there (flightrec.producer.claims; never raises)."""
        write_claim(self.spool.files, self.boot_id, path, claim)

    def hand_off(self, h: Handoff) -> int:
        """Give a stage's leftovers (``h``) to this instance's late-output process; return its pid.

        Raises OSError where the process cannot be started (flightrec.producer.handoff)."""
        return hand_off(h, self.spool.files)

    def join(self, what: str) -> Member | None:
        """Register ``what`` (a stage, a probe) as running in this boot until :meth:`leave`; a seal waits for it."""
        return join(self.spool, what) if isinstance(self.spool, Spool) else None

    def leave(self, member: Member | None) -> None:
        """``what`` of :meth:`join` ended."""
        if isinstance(self.spool, Spool):
            leave(self.spool, member)

    @contextmanager
    def running_stage(self, stage: str) -> Iterator[Member | None]:
        """``with agent.running_stage("x"):`` - stage x takes part in this boot; this agent's own seal skips it."""
        member = self.join(f"stage {stage}")
        before, self._stage_member = self._stage_member, member
        try:
            yield member
        finally:
            self._stage_member = before
            self.leave(member)

    def note_late_losses(self) -> int:
        """Lifecycle ``info`` events of the lines that stages' leftovers wrote while no late-output process recorded
        them (it died; its keeper passed them on and left notes, flightrec.producer.keeper): one per stage, in the
        current boot, with ``lost_lines`` and ``lost_bytes``; returns how many lines. Notes of older boots are
        dropped (said in the log): their boot was sealed, and the seal named what still ran."""
        from flightrec.producer.keeper import take_late_losses

        if not isinstance(self.spool, Spool) or not self.spool.files.late_losts():  # (a listing: nothing to take)
            return 0
        boot_id = self.spool.boot()[0]
        losses, files = take_late_losses(self.spool.files, boot_id)
        total = 0
        for stage, (lines, size) in sorted(losses.items()):
            self.event(
                stage,
                "info",
                detail=f"not recorded: {lines} lines ({size} bytes) that the stage's leftovers "
                "wrote after its late-output process died (its keeper passed them on)",
                attributes={"lost_lines": str(lines), "lost_bytes": str(size), "late_output": "lost"},
            )
            total += lines
        for p in files:
            self.spool.files.drop_late_lost(p)
        for p in self.spool.files.late_lost_boots_but(boot_id):
            log.warning("dropping %s: its boot is sealed (its late output was named by the seal)", p.name)
            self.spool.files.drop_late_lost(p)
        return total

    def seal(self, reason: str = "", wait: float | None = None) -> Sealed:
        """The Sealed event closing this boot: it counts every event of the boot (itself included).

        It first waits up to ``wait`` seconds (FLIGHTREC_SEAL_WAIT) for the boot's other running
        stages and facts probes (any process) to end, so that their events belong to the boot; what
        still runs then is named in the seal's reason, and its later events are not recorded.
        Then it waits for the boot's late output (what processes left behind by a stage still write)
        until nothing that can write it is left, up to FLIGHTREC_LATE_WAIT: a Lifecycle ``info``
        event of each such stage says so first (the destroy gate shows it). What still writes after
        that is named in the seal's reason; its later lines are passed on but no longer recorded.
        """
        wait = self.settings.seal_wait if wait is None else wait
        own = self._stage_member
        left_late: list[str] = []
        if isinstance(self.spool, Spool):
            boot_id = own.boot_id if own is not None else self.spool.boot()[0]
            deadline = time.monotonic() + wait
            while running(self.spool, boot_id, own) and time.monotonic() < deadline:
                time.sleep(0.05)
            late_wait = self.settings.late_wait
            for st in late_stages(self.spool.files, boot_id):
                self.event(
                    st.stage,
                    "info",
                    detail=f"the seal waits up to {late_wait:g}s for the late output of {still_writing(st)}",
                    attributes={"seal_waits_for": "late_output", "late_wait_s": f"{late_wait:g}"},
                )
            left_late = settle_late_output(self.spool.files, boot_id, late_wait)
            self.note_late_losses()  # what a dead late-output process's keeper passed on unrecorded, in this boot
        spool, eid, iid, ts = self.spool, new_event_id(), self.instance_id, now_us()

        def make(boot: str, seq: int) -> Sealed:
            left = running(spool, boot, own) if isinstance(spool, Spool) and seq >= 0 else []
            why = reason
            if left:
                why += (
                    f"{'; ' if why else ''}still running when sealed after waiting {wait:g}s, their later "
                    f"events are not recorded: {', '.join(left)}"
                )
            if left_late:
                why += (
                    f"{'; ' if why else ''}late output still running when sealed, its later lines are not "
                    f"recorded: {'; '.join(left_late)}"
                )
            if left or left_late:
                log.warning("sealing boot %s of %s: %s", boot, iid, why)
            return Sealed(
                event_id=eid, instance_id=iid, boot_id=boot, seq=seq, ts_us=ts, event_count=seq + 1, reason=why
            )

        return self.emit_makers([make])[0]

    def message_limit(self, topic: str) -> int:
        """The largest message this agent builds for ``topic``: the topic's max.message.bytes once learned."""
        if self.deliverer is not None:
            return self.deliverer.limit(topic)
        return self.settings.max_message_bytes or STOCK_MAX_MESSAGE_BYTES

    def pending(self) -> int:
        """Events in the spool not yet acknowledged by Kafka."""
        return self.spool.pending()


class SyncAgent(_AgentBase):
    """The agent for synchronous code: ``with open_agent(...) as agent``; delivery runs in a thread."""

    def __enter__(self) -> SyncAgent:
        self._start()
        return self

    def __exit__(self, et: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self._close()

    def flush(self, timeout: float | None = None, *, strict: bool = False, unless_away: bool = False) -> bool:
        """Wait until every spooled event is acknowledged; False (or DeliveryError when ``strict``) on timeout.

        ``unless_away``: stop waiting as soon as Kafka is known not to answer (see Deliverer.wait_delivered).
        """
        timeout = self.settings.flush_timeout if timeout is None else timeout
        ok = self._flush_blocking(timeout, unless_away)
        if strict:
            require_delivered(ok, self.spool, timeout, self.deliverer.last_error if self.deliverer else None)
        return ok

    def close(self, timeout: float | None = None, *, unless_away: bool | None = None) -> bool:
        """Flush for up to ``timeout`` (default: the flush timeout), then stop delivering; ``unless_away``: a Kafka
        that does not answer is not waited for (the default when no ``timeout`` is given)."""
        return self._close(timeout, unless_away)


class Agent(_AgentBase):
    """The agent for asyncio code: ``async with Agent(instance_id=...) as agent``.

    ``emit`` is a plain call (a short spool write); ``await agent.flush()`` waits for Kafka.
    """

    async def __aenter__(self) -> Agent:
        self._start()
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await asyncio.to_thread(self._close)

    async def flush(self, timeout: float | None = None, *, strict: bool = False) -> bool:
        """Wait until every spooled event is acknowledged; False (or DeliveryError when ``strict``) on timeout."""
        timeout = self.settings.flush_timeout if timeout is None else timeout
        ok = await asyncio.to_thread(self._flush_blocking, timeout)
        if strict:
            require_delivered(ok, self.spool, timeout, self.deliverer.last_error if self.deliverer else None)
        return ok


def open_agent(instance_id: str | None = None, settings: Settings | None = None, **kwargs: Any) -> SyncAgent:
    """A synchronous agent to use as a context manager (see :class:`SyncAgent`)."""
    return SyncAgent(instance_id=instance_id, settings=settings, **kwargs)


__all__ = ["Agent", "SyncAgent", "Stage", "open_agent", "FlightrecError"]
