"""A thread that fdatasyncs (then closes) file descriptors handed to it, so that a writer does not wait."""

from __future__ import annotations

import logging
import os
import threading

log = logging.getLogger(__name__)

IDLE_S = 1.0  # the thread ends after this long without work


class Syncer:
    """fdatasync in the background: :meth:`hand` returns at once, :meth:`drain` waits for all handed so far.

    Guarantees: every fd handed is fdatasync'd once, in order, and closed (also when the
    fdatasync fails: the failure is logged); the thread starts at a :meth:`hand` and ends
    when it had nothing to do for IDLE_S.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self.syncs = 0
        self._fds: list[int] = []
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None

    def hand(self, fd: int) -> None:
        """fdatasync and close ``fd`` (owned from now on) soon, in the syncer thread."""
        with self._cond:
            self._fds.append(fd)
            self._cond.notify_all()
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="flightrec-spool-sync", daemon=True)
                self._thread.start()

    def drain(self) -> None:
        """Wait until every fd handed so far is synced."""
        with self._cond:
            while self._fds:
                self._cond.wait()

    def _run(self) -> None:
        while True:
            with self._cond:
                if not self._fds:
                    self._cond.wait(IDLE_S)
                if not self._fds:  # idle: the thread ends (the next hand() starts another)
                    self._thread = None
                    return
                fd = self._fds[0]
            try:
                os.fdatasync(fd)
                self.syncs += 1
            except OSError as exc:
                log.error("%s: cannot fdatasync a spool segment: %s", self.name, exc)
            finally:
                os.close(fd)
                with self._cond:
                    self._fds.pop(0)
                    self._cond.notify_all()
