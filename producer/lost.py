"""The stand-in for a spool that cannot be created: the stage runs, nothing is written, the loss is counted."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from flightrec.producer.spool import Position, SpoolWriteError, built_for_counting
from flightrec.producer.spoolfolder import SpoolFolder
from flightrec.schemas import Event, EventT


class LostSpool:
    """Stands in for a spool that cannot be created (an :class:`~flightrec.producer.spool.AnySpool`): the command
    still runs, nothing is written.

    Every :meth:`append` raises :class:`SpoolWriteError` carrying the events it would have
    written, so that the agent can say what was lost; the rest answers "empty".
    """

    def __init__(self, root: str | Path, instance_id: str, reason: str) -> None:
        self.instance_id = instance_id
        self.key = instance_id.encode("utf-8")
        self.files = SpoolFolder.of(root, instance_id)  # where it would have been (named in messages)
        self.dir = self.files.path
        self.reason = reason
        self.events_spooled = 0

    def boot(self) -> tuple[str, int]:
        """No boot can be kept without a spool: an empty boot id."""
        return "", 0

    dirty = False

    def sent_once(self, boot_id: str, name: str) -> bool:
        """Nothing was ever sent."""
        return False

    def append(
        self,
        makers: Sequence[Callable[[str, int], EventT]],
        *,
        once: str | None = None,
        encode: Callable[[Event], bytes] | None = None,
        sync: bool = True,
        boot: str | None = None,
    ) -> list[EventT]:
        """Nothing can be written: SpoolWriteError with the events that were lost."""
        raise SpoolWriteError(self.reason, built_for_counting(makers, ""))

    def committed_end(self) -> Position:
        """Nothing written: the start."""
        return Position(0, 0)

    def load_cursor(self) -> Position:
        """Nothing written: the start."""
        return Position(0, 0)

    def pending(self) -> int:
        """Nothing waits for Kafka."""
        return 0

    def sync(self) -> None:
        """Nothing written, nothing to make durable."""

    def sync_due(self) -> None:
        """Nothing written, nothing to make durable."""

    def close(self) -> None:
        """Nothing to release."""
