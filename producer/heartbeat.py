"""Heartbeats: a thread that emits a Heartbeat event every FLIGHTREC_HEARTBEAT_S seconds while a stage runs."""

from __future__ import annotations

import logging
import threading
from types import TracebackType
from typing import TYPE_CHECKING

from flightrec.schemas import Heartbeat

if TYPE_CHECKING:
    from flightrec.producer.agent import _AgentBase

log = logging.getLogger(__name__)


class HeartbeatThread(threading.Thread):
    """Emits one Heartbeat at start and then every ``interval`` s until stopped (``with`` stops it).

    Guarantees: each heartbeat is an ordinary event (spooled, counted in the boot's
    seq) carrying the interval, so readers know when silence means `lost`; an
    interval of 0 or less sends nothing; a failure to emit (spool unwritable) is
    logged once and never reaches the stage.
    """

    def __init__(self, agent: _AgentBase, stage: str, interval: float, pid: int = 0) -> None:
        super().__init__(name=f"flightrec-heartbeat-{stage}", daemon=True)
        self.agent = agent
        self.stage = stage
        self.interval = float(interval)
        self.pid = pid
        self.sent = 0
        self._stop_event = threading.Event()
        self._failed = False

    def beat(self) -> None:
        """Emit one heartbeat now."""
        try:
            self.agent.emit(Heartbeat, stage=self.stage, interval_s=self.interval, pid=self.pid)
            self.sent += 1
        except Exception as exc:  # noqa: BLE001 - the agent never stands in the stage's way
            if not self._failed:
                log.error("could not record a heartbeat of stage %s: %s: %s", self.stage, type(exc).__name__, exc)
            self._failed = True

    def run(self) -> None:
        while not self._stop_event.is_set():
            self.beat()
            self._stop_event.wait(self.interval)

    def start(self) -> None:
        if self.interval > 0:
            super().start()

    def stop(self) -> None:
        """Stop beating (waits for a heartbeat being written)."""
        self._stop_event.set()
        if self.is_alive():
            self.join()

    def __enter__(self) -> HeartbeatThread:
        self.start()
        return self

    def __exit__(self, et: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()


def heartbeat(agent: _AgentBase, stage: str, pid: int = 0) -> HeartbeatThread:
    """``with heartbeat(agent, "benchmark"):`` - heartbeats for the life of a stage, at the agent's interval."""
    return HeartbeatThread(agent, stage, agent.settings.heartbeat_s, pid)
