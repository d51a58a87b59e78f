"""The consumers' one counter type: what one committed batch did, and (summed) what a run did."""

from __future__ import annotations

from dataclasses import dataclass, fields


@dataclass(frozen=True)
class Stats:
    """Counters of one batch or, added up with ``+``, of a run; every field is a count."""

    events_received: int = 0  # Kafka messages folded (dead letters and filtered ones included)
    events_written: int = 0  # events stored for the first time (event_id not seen before)
    lines_written: int = 0  # log lines stored
    duplicates_dropped: int = 0  # events whose event_id was already stored or came twice in the batch
    dead_letters: int = 0  # messages kept as dead letters
    failures_written: int = 0  # failures rows (re)computed
    commits: int = 0  # transactions committed
    errors_total: int = 0  # errors met and survived (a broker away, a failed read)
    conflicts_retried: int = 0  # lake transactions retried after a DuckLake "Transaction conflict"
    fenced: int = 0  # lake commits refused because another member had claimed the partition
    catalog_waits: int = 0  # lake transactions retried after the catalog (PostgreSQL) did not answer
    oom_retried: int = 0  # commits run again after "Out of Memory"

    def __add__(self, other: Stats) -> Stats:
        return Stats(**{f.name: getattr(self, f.name) + getattr(other, f.name) for f in fields(self)})

    def summary(self) -> str:
        """One line, name=value for every counter (logs and the CLI's closing line)."""
        return " ".join(f"{f.name}={getattr(self, f.name)}" for f in fields(self))
