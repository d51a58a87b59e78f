"""What the database keeps as it ages (the ``FLIGHTREC_KEEP_*`` settings): the policy alone, light to import (the
CLI reads it before any database is touched); db/retention.py enforces it."""

from __future__ import annotations

from dataclasses import dataclass

from flightrec.settings import Settings

DAY_US = 86_400_000_000


@dataclass(frozen=True)
class Keep:
    """What the database keeps (the ``FLIGHTREC_KEEP_*`` settings). None: for ever."""

    lines_days: float | None = 14.0
    failures_days: float | None = None
    context_minutes: float = 10.0
    samples_days: float | None = 30.0
    sample_bucket_s: int = 3600

    @classmethod
    def from_settings(cls, settings: Settings) -> Keep:
        return cls(
            lines_days=settings.keep_lines_days,
            failures_days=settings.keep_failures_days,
            context_minutes=settings.keep_context_minutes,
            samples_days=settings.keep_samples_days,
        )

    @property
    def enforced(self) -> bool:
        """Whether anything ever goes."""
        return self.lines_days is not None or self.samples_days is not None

    def describe(self) -> str:
        """One line for logs."""

        def days(d: float | None) -> str:
            return "forever" if d is None else f"{d:g} days"

        return (
            f"log lines {days(self.lines_days)}, failure context {days(self.failures_days)} "
            f"({self.context_minutes:g} min before the failed stage), throughput samples {days(self.samples_days)} "
            "then hourly"
        )
