"""The /metrics gauges of a materializer's own store: its size on disk, the space a compaction would return, the
oldest data it keeps, how far retention got, whether its disk is full, and where the archive stands.

Read by the upkeep (consumers/upkeep.py) in the writer thread every ``FIGURES_S`` and by the full-disk guard
(consumers/diskfull.py); served from a registry's collector, so nothing here touches the database when Prometheus
scrapes.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector


@dataclass(frozen=True)
class Figures:
    """The store's figures as last read (None: not known yet)."""

    database_bytes: int | None = None  # the file and its WAL on disk
    free_bytes: int | None = None  # of those, blocks DuckDB holds free (what `flightrec compact` returns)
    oldest_line_us: int | None = None  # the oldest kept log line (its ts_us)
    expired_before_us: int | None = None  # lines received before this were judged by retention
    disk_full: bool = False  # the materializer stopped taking batches: no room to commit
    lines_expired: int = 0  # log lines retention deleted in this run
    samples_merged: int = 0  # throughput samples merged into hourly rows in this run
    compactions: int = 0
    compaction_seconds: float = 0.0  # the last compaction's duration (commits waited that long)
    archive_next: Mapping[tuple[str, int], int] = field(default_factory=dict)  # the archive's next offset


def _us_to_s(us: int | None) -> float | None:
    return None if us is None else us / 1e6


class StoreFigures(Collector):
    """A Prometheus collector of :class:`Figures`; ``update(**changes)`` from any thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.figures = Figures()

    def register(self, registry: CollectorRegistry) -> StoreFigures:
        registry.register(self)
        return self

    def update(self, **changes: object) -> None:
        with self._lock:
            self.figures = replace(self.figures, **changes)  # type: ignore[arg-type] # Figures' own field names

    def add(self, lines: int = 0, samples: int = 0) -> None:
        with self._lock:
            f = self.figures
            self.figures = replace(f, lines_expired=f.lines_expired + lines, samples_merged=f.samples_merged + samples)

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            f = self.figures
        yield from _gauges(f)
        yield CounterMetricFamily(
            "flightrec_retention_lines_expired",
            "Log lines retention deleted (FLIGHTREC_KEEP_LINES_DAYS)",
            f.lines_expired,
        )
        yield CounterMetricFamily(
            "flightrec_retention_samples_merged",
            "Throughput samples merged into hourly rows (FLIGHTREC_KEEP_SAMPLES_DAYS)",
            f.samples_merged,
        )
        yield CounterMetricFamily("flightrec_compactions", "Compactions of the database file (this run)", f.compactions)
        if f.archive_next:
            archive = GaugeMetricFamily(
                "flightrec_archive_next_offset",
                "The next offset the archive will hold, per partition (FLIGHTREC_ARCHIVE)",
                labels=["topic", "partition"],
            )
            for (topic, partition), offset in sorted(f.archive_next.items()):
                archive.add_metric([topic, str(partition)], offset)
            yield archive


def _gauges(f: Figures) -> Iterator[Metric]:
    yield GaugeMetricFamily(
        "flightrec_disk_full", "1 while the materializer holds its batch for want of disk space", int(f.disk_full)
    )
    yield GaugeMetricFamily(
        "flightrec_last_compaction_seconds", "How long the last compaction took (commits waited)", f.compaction_seconds
    )
    optional = (
        ("flightrec_database_bytes", "The database file and its WAL on disk, in bytes", f.database_bytes),
        ("flightrec_database_free_bytes", "Free blocks inside the file: what a compaction returns", f.free_bytes),
        (
            "flightrec_oldest_line_timestamp_seconds",
            "The oldest kept log line (its instance's clock), Unix time",
            _us_to_s(f.oldest_line_us),
        ),
        (
            "flightrec_lines_expired_before_timestamp_seconds",
            "Lines Kafka received before this were judged by retention (kept only as failure context), Unix time",
            _us_to_s(f.expired_before_us),
        ),
    )
    for name, doc, value in optional:
        if value is not None:
            yield GaugeMetricFamily(name, doc, value)
