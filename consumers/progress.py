"""How far the materializer's input is read: the moment up to which everything Kafka held has been committed.

Silence is judged up to that moment, never beyond it (db/status.py): while the materializer's input lags or the
materializer is away, the moment stands still, so no instance turns `lost` for a silence the materializer has not
read, and a restarted one judges nothing lost before it has read its backlog.

The moment is learnt by asking Kafka for the end offsets at a wall time T: once every partition's committed offset
has reached the end asked at T, everything appended before T is in the database, and T is recorded in
``materializer_progress`` (its own small transaction, at most every RECORD_EVERY_S). :class:`Progress` is pure;
:func:`record` is the write (in the writer thread, on a database file).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping

import duckdb

RECORD_EVERY_S = 0.9  # a caught-up moment is written at most this often (one tiny transaction; `lost` waits for it)
MAX_ASKS = 64  # asks remembered while the input lags (older ones are superseded by newer satisfied ones)
# The input is called behind (flightrec status, /health) when its caught-up moment is older than this; `lost` is
# judged up to that moment whatever its age.
BEHIND_AFTER_S = 30.0

Offsets = Mapping[tuple[str, int], int]


class Progress:
    """The end offsets asked at wall times, and the latest time whose ends the committed offsets have reached."""

    def __init__(self) -> None:
        self._asks: deque[tuple[int, dict[tuple[str, int], int]]] = deque(maxlen=MAX_ASKS)
        self.caught_up_us: int | None = None  # the latest moment known caught up (this run)
        self.recorded_us: int | None = None  # the latest moment written to the database
        self.recorded_at: float = 0.0  # monotonic time of that write

    def asked(self, wall_us: int, ends: Offsets) -> None:
        """Kafka said these end offsets at ``wall_us`` (the materializer's clock, µs since the epoch)."""
        self._asks.append((wall_us, dict(ends)))

    def advance(self, committed: Offsets) -> int | None:
        """The newest ask whose every end the committed offsets reached: the new caught-up moment, or None."""
        found = None
        while self._asks:
            wall_us, ends = self._asks[0]
            if all(committed.get(tp, 0) >= end for tp, end in ends.items()):
                found = wall_us
                self._asks.popleft()
            else:
                break
        if found is not None and (self.caught_up_us is None or found > self.caught_up_us):
            self.caught_up_us = found
            return found
        return None

    def due(self, now: float, force: bool = False) -> int | None:
        """The moment to write now (newer than the one written, and RECORD_EVERY_S since, unless ``force``)."""
        if self.caught_up_us is None or self.caught_up_us == self.recorded_us:
            return None
        if not force and now - self.recorded_at < RECORD_EVERY_S:
            return None
        return self.caught_up_us

    def written(self, moment_us: int, now: float) -> None:
        self.recorded_us, self.recorded_at = moment_us, now


RECORD_SQL = "INSERT OR REPLACE INTO materializer_progress (run_id, caught_up_us) VALUES (?, ?)"


def record(con: duckdb.DuckDBPyConnection, run_id: str, caught_up_us: int) -> None:
    """Write this run's caught-up moment (its own transaction; the writer thread, between commits)."""
    con.execute(RECORD_SQL, [run_id, caught_up_us])
