"""The agent object: build events, spool them durably, deliver them in the background (sync and async)."""

from __future__ import annotations

import asyncio
import logging
import os
import time
from types import TracebackType
from typing import Any, Callable, Mapping

from flightrec.errors import FlightrecError
from flightrec.schemas import Event, InstanceFacts, Lifecycle, Sealed, new_event_id, now_us
from flightrec.settings import Settings

from flightrec.producer.deliver import Deliverer, require_delivered
from flightrec.producer.facts import collect_facts, load_override
from flightrec.producer.redact import Redactor
from flightrec.producer.spool import Spool

log = logging.getLogger(__name__)

_FILLED = ("event_id", "instance_id", "boot_id", "seq")


def _cut(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters and marked, as long tail lines are."""
    return text if len(text) <= limit else text[:limit] + " [cut]"


class Stage:
    """``with agent.stage("x"):`` - Lifecycle started, then succeeded, or failed with the exception text.

    The exception is re-raised; works as ``async with`` too.
    """

    def __init__(self, agent: "_AgentBase", name: str, attributes: Mapping[str, str] | None = None) -> None:
        self.agent = agent
        self.name = name
        self.attributes = dict(attributes or {})
        self._t0 = 0.0

    def __enter__(self) -> "Stage":
        self._t0 = time.monotonic()
        self.agent.event(self.name, "started", attributes=self.attributes)
        return self

    def __exit__(self, et: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> bool:
        attrs = dict(self.attributes, duration_s=f"{time.monotonic() - self._t0:.3f}")
        if exc is None:
            self.agent.event(self.name, "succeeded", attributes=attrs)
        else:
            detail = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            self.agent.event(self.name, "failed", detail=detail, attributes=attrs)
        return False

    async def __aenter__(self) -> "Stage":
        return self.__enter__()

    async def __aexit__(self, et: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> bool:
        return self.__exit__(et, exc, tb)


class _AgentBase:
    """What the sync and the async agent share: event building, the spool, the deliverer.

    Guarantees: :meth:`emit` returns only once the event is written to the spool
    (fsync'd), carrying a fresh event_id, this boot's boot_id and the next seq of
    the boot (gap-free across every agent process of the instance); texts are
    masked by the redactor (FLIGHTREC_REDACT, URL credentials) before they are
    written; delivery never blocks emit, and a broker that is away only delays it.
    """

    def __init__(self, instance_id: str | None = None, settings: Settings | None = None, *,
                 spool_dir: str | None = None, new_boot: bool = False, deliver: bool = True,
                 env: Mapping[str, str] | None = None) -> None:
        self.settings = settings or Settings.from_env()
        self.instance_id = instance_id or self.settings.instance
        self.spool = Spool(spool_dir or self.settings.spool, self.instance_id, new_boot=new_boot)
        self.redactor = Redactor(self.settings.redact, os.environ if env is None else env)
        self.deliverer: Deliverer | None = Deliverer(self.spool, self.settings) if deliver else None
        self.events_emitted = 0
        self._closed: bool | None = None  # once closed: whether everything was acknowledged then

    # -- lifecycle --------------------------------------------------------------

    def _start(self) -> None:
        if self.deliverer is not None:
            self.deliverer.start()

    def _close(self, timeout: float | None = None) -> bool:
        """Wait up to the flush timeout for delivery, stop; True if everything was acknowledged.

        Closing again (``close()`` inside ``with``) does nothing and says how the first close went.
        """
        if self._closed is not None:
            return self._closed
        ok = True
        if self.deliverer is not None:
            timeout = self.settings.flush_timeout if timeout is None else timeout
            ok = self._flush_blocking(timeout)
            if not ok:
                log.warning("%d events of %s not yet acknowledged after %gs; they stay in %s for "
                            "`flightrec agent flush` or the next agent", self.spool.pending(), self.instance_id,
                            timeout, self.spool.dir)
            self.deliverer.stop()
        self.spool.close()
        self._closed = ok
        return ok

    def _flush_blocking(self, timeout: float) -> bool:
        if self.deliverer is None:
            return False
        target = self.spool.committed_end()
        self.deliverer.notify()
        return self.deliverer.wait_delivered(target, timeout)

    # -- events -----------------------------------------------------------------

    @property
    def boot_id(self) -> str:
        """The boot id the next event will carry (starting the boot if none is open)."""
        return self.spool.boot()[0]

    def emit_makers(self, makers: list[Callable[[str, int], Event]], once: str | None = None,
                    encode: Callable[[Event], bytes] | None = None) -> list[Event]:
        """Spool several events in one write (one fsync); each maker gets (boot_id, seq)."""
        events = self.spool.append(makers, once=once, encode=encode)
        self.events_emitted += len(events)
        if self.deliverer is not None and events:
            self.deliverer.notify()
        return events

    def emit(self, cls: type[Event], **fields: Any) -> Event:
        """Build an event of type ``cls`` from ``fields`` (the common fields are filled in) and spool it."""
        bad = [k for k in _FILLED if k in fields]
        if bad:
            raise TypeError(f"emit fills {', '.join(bad)} itself; do not pass them")
        ts = fields.pop("ts_us", None) or now_us()
        if cls is Lifecycle:  # texts from shell scripts: masked, and cut like log lines (one event fits a message)
            cap = self.settings.max_line
            if "detail" in fields:
                fields["detail"] = _cut(self.redactor.text(str(fields["detail"])), cap)
            if "attributes" in fields:
                fields["attributes"] = {k: _cut(v, cap) for k, v in self.redactor.mapping(
                    {str(k)[:cap]: str(v) for k, v in fields["attributes"].items()}).items()}
        eid = new_event_id()
        iid = self.instance_id

        def make(boot_id: str, seq: int) -> Event:
            return cls(event_id=eid, instance_id=iid, boot_id=boot_id, seq=seq, ts_us=ts, **fields)

        try:
            return self.emit_makers([make])[0]
        except (TypeError, ValueError) as exc:
            raise TypeError(f"cannot build {cls.__name__} from {sorted(fields)}: {exc}") from exc

    def event(self, stage: str, state: str, detail: str = "", attributes: Mapping[str, str] | None = None) -> Lifecycle:
        """A Lifecycle event (started / succeeded / failed / skipped / info)."""
        return self.emit(Lifecycle, stage=stage, state=state, detail=detail, attributes=dict(attributes or {}))  # type: ignore[return-value]

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
        if not force and (self.spool.dir / f"once-{boot_id}-facts").exists():
            return None
        values = collect_facts(override)
        eid, iid, ts = new_event_id(), self.instance_id, now_us()

        def make(boot: str, seq: int) -> Event:
            return InstanceFacts(event_id=eid, instance_id=iid, boot_id=boot, seq=seq, ts_us=ts, **values)

        events = self.emit_makers([make], once=None if force else "facts")
        return events[0] if events else None  # type: ignore[return-value]

    def seal(self, reason: str = "") -> Sealed:
        """The Sealed event closing this boot: it counts every event of the boot (itself included).

        Late output of the boot (lines that processes left behind by a stage still write)
        is spooled first, waiting up to FLIGHTREC_LATE_WAIT; from then on it is passed on
        but no longer recorded.
        """
        from flightrec.producer.late import settle_late_output

        settle_late_output(self.spool.dir, self.boot_id, self.settings.late_wait)
        eid, iid, ts = new_event_id(), self.instance_id, now_us()

        def make(boot: str, seq: int) -> Event:
            return Sealed(event_id=eid, instance_id=iid, boot_id=boot, seq=seq, ts_us=ts, event_count=seq + 1,
                          reason=reason)

        return self.emit_makers([make])[0]  # type: ignore[return-value]

    def pending(self) -> int:
        """Events in the spool not yet acknowledged by Kafka."""
        return self.spool.pending()


class SyncAgent(_AgentBase):
    """The agent for synchronous code: ``with open_agent(...) as agent``; delivery runs in a thread."""

    def __enter__(self) -> "SyncAgent":
        self._start()
        return self

    def __exit__(self, et: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self._close()

    def flush(self, timeout: float | None = None, *, strict: bool = False) -> bool:
        """Wait until every spooled event is acknowledged; False (or DeliveryError when ``strict``) on timeout."""
        timeout = self.settings.flush_timeout if timeout is None else timeout
        ok = self._flush_blocking(timeout)
        if strict:
            require_delivered(ok, self.spool, timeout, self.deliverer.last_error if self.deliverer else None)
        return ok

    def close(self, timeout: float | None = None) -> bool:
        """Flush for up to ``timeout`` (default: the flush timeout), then stop delivering."""
        return self._close(timeout)


class Agent(_AgentBase):
    """The agent for asyncio code: ``async with Agent(instance_id=...) as agent``.

    ``emit`` is a plain call (a short spool write); ``await agent.flush()`` waits for Kafka.
    """

    async def __aenter__(self) -> "Agent":
        self._start()
        return self

    async def __aexit__(self, et: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
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
