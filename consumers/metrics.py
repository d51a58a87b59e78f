"""Prometheus /metrics of a running materializer: lag, what it folded, commits, dead letters, alerts, the fleet."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import replace
from typing import Any

import duckdb
from flightrec.consumers.alert_age import historical
from flightrec.consumers.health import serve
from flightrec.db.fold import Delta
from flightrec.db.health import VERSIONS, Health, disk, figures_sql, judge, lag
from flightrec.db.markers import disk_full_since_us
from flightrec.db.stats import Stats
from flightrec.db.status import STATUSES
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from flightrec.errors import MaterializeError

log = logging.getLogger(__name__)

# Commits take milliseconds when idle and seconds under a backlog of large batches; 2 s: no commit waits longer
# for anything a reader does (docs/materializer.md).
COMMIT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 2.5, 5.0, 10.0, 30.0)
ALERT_FAILED = ("refused", "unknown")  # the outbox's outcomes that will not be delivered
REFUSED_REASONS = (
    "forged",
    "unauthenticated",
    "unverified",
)  # dead letters of events trust refused or kept aside (db/trust.py)
DEAD_REASONS = (
    "decode",
    "fold",
    "conflict",
    "unreadable",
    *REFUSED_REASONS,
)  # the first words of the fold's and store's reasons


def dead_letter_reason(reason: str | None) -> str:
    """A bounded label from a dead letter's reason text: its first word (decode, fold, conflict, ...)."""
    head = (reason or "").split(":", 1)[0].strip().lower()
    return head if head.isidentifier() and len(head) <= 32 else "other"


class _Database(Collector):
    """The figures read from the database (alerts' outbox, instance statuses), as of the last read."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.statuses: dict[str, int] = {}
        self.alerts: dict[str, int] = {}
        self.read = False

    def collect(self) -> Iterator[Metric]:
        with self.lock:
            statuses, alerts, read = dict(self.statuses), dict(self.alerts), self.read
        if not read:
            return
        fleet = GaugeMetricFamily(
            "flightrec_instances", "Instances by their one status (the fleet view's rule table)", labels=["status"]
        )
        for status in STATUSES:
            fleet.add_metric([status], statuses.get(status, 0))
        yield fleet
        yield CounterMetricFamily(
            "flightrec_alerts_sent",
            "Webhook alerts delivered (alerts.outcome = delivered)",
            value=alerts.get("delivered", 0),
        )
        failed = CounterMetricFamily(
            "flightrec_alerts_failed", "Webhook alerts that will not be delivered, by outcome", labels=["outcome"]
        )
        for outcome in ALERT_FAILED:
            failed.add_metric([outcome], alerts.get(outcome, 0))
        yield failed


class Metrics:
    """The metrics one materializer serves on ``port`` (``/metrics``, Prometheus text format), in a registry
    of its own. ``observe_commit`` runs after each commit, ``set_lag`` in the consume loop, ``read_database``
    in the writer thread."""

    def __init__(
        self,
        port: int,
        address: str = "127.0.0.1",
        db_path: str | None = None,
        max_age: float = 900.0,
        classes: Iterable[str] = (),
    ) -> None:
        self.port, self.address = port, address
        self.db_path = db_path  # the database file whose disk /health reports (None: a lake)
        self.max_age = max_age  # failures whose evidence is older at first sight are not counted (alert_age.py)
        self.registry = CollectorRegistry()
        r = self.registry
        self.events = Counter("flightrec_events_folded", "Kafka messages folded (dead letters included)", registry=r)
        self.events_written = Counter("flightrec_events_written", "Events stored for the first time", registry=r)
        self.lines = Counter("flightrec_log_lines_folded", "Log lines stored", registry=r)
        self.duplicates = Counter("flightrec_duplicates_dropped", "Events dropped as already stored", registry=r)
        self.dead = Counter(
            "flightrec_dead_letters", "Messages kept as dead letters, by reason", ["reason"], registry=r
        )
        self.commit_seconds = Histogram(
            "flightrec_commit_duration_seconds", "Time of one database commit", buckets=COMMIT_BUCKETS, registry=r
        )
        self.errors = Counter("flightrec_materializer_errors", "Errors met and survived (a broker away)", registry=r)
        self.lag = Gauge(
            "flightrec_consumer_lag_messages",
            "Messages in the partition not yet committed to the database (end offset - committed offset)",
            ["topic", "partition"],
            registry=r,
        )
        self.last_commit = Gauge(
            "flightrec_last_commit_timestamp_seconds", "When the last commit ended (Unix time)", registry=r
        )
        self.input_caught_up = Gauge(
            "flightrec_input_caught_up_timestamp_seconds",
            "When the materializer last had committed everything Kafka held (Unix time): silences are judged up to "
            "there (consumers/progress.py)",
            registry=r,
        )
        self.failures = Counter(
            "flightrec_failures",
            "Failures folded, by class, whose evidence Kafka received within FLIGHTREC_ALERT_MAX_AGE (a rebuild "
            "from old topics counts none); counted whatever becomes of the instance (destroyed or not)",
            ["failure_class"],
            registry=r,
        )
        self.refused = Counter(
            "flightrec_refused_events",
            "Events refused as forged or unauthenticated, or kept unverified (delivered after the destroy: "
            "db/trust.py), by reason",
            ["reason"],
            registry=r,
        )
        self.disk_free = Gauge(
            "flightrec_database_disk_free_bytes", "Bytes free on the disk holding the database file", registry=r
        )
        self.disk_size = Gauge(
            "flightrec_database_disk_size_bytes", "Size of the disk holding the database file", registry=r
        )
        # Every label value known beforehand is exported from the start at 0: the first failure of a class (or the
        # first refused event) then raises its series from 0 to 1, which increase() sees; a series born at 1 it
        # would not, and the alert on the first one would never fire.
        for cls in sorted({*classes, "unknown", "unclassified", "below_min_rate"}):
            self.failures.labels(cls)
        for reason in REFUSED_REASONS:
            self.refused.labels(reason)
        for reason in DEAD_REASONS:
            self.dead.labels(reason)
        self._failures_seen: set[str] | None = None  # failure ids already counted (None: not read yet)
        self._health = Health()
        self._lag_total: int | None = None
        self._caught_up_us: int | None = None
        self._last_commit_us: int | None = None
        self._database = _Database()
        r.register(self._database)
        self._server: Any = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Serve /metrics; MaterializeError (one line) when the port cannot be bound."""
        try:
            self._server, self._thread = serve(self.address, self.port, self.registry, self.health)
        except OSError as exc:
            raise MaterializeError(
                f"cannot serve metrics on {self.address}:{self.port} ({exc.strerror or exc}): choose another "
                "--metrics-port"
            ) from exc
        log.info("serving Prometheus metrics on http://%s:%d/metrics (and /health)", self.address, self.port)

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def observe_commit(self, delta: Delta, stats: Stats, seconds: float) -> None:
        """One commit: its duration, what it folded, its dead letters by reason."""
        self.commit_seconds.observe(seconds)
        now = time.time()
        self.last_commit.set(now)
        self._last_commit_us = int(now * 1e6)
        self.events.inc(stats.events_received)
        self.events_written.inc(stats.events_written)
        self.lines.inc(stats.lines_written)
        self.duplicates.inc(stats.duplicates_dropped)
        if delta.dead.num_rows:
            for reason in delta.dead.column("reason").to_pylist():
                label = dead_letter_reason(reason)
                self.dead.labels(label).inc()
                if label in REFUSED_REASONS:
                    self.refused.labels(label).inc()
        elif stats.dead_letters:  # the store's own (an event id reused with other content)
            self.dead.labels("conflict").inc(stats.dead_letters)

    def count_errors(self, n: int) -> None:
        if n:
            self.errors.inc(n)

    def set_lag(self, ends: Mapping[tuple[str, int], int], committed: Mapping[tuple[str, int], int]) -> None:
        """Lag per partition: its end offset minus the next offset the database holds (0 when none)."""
        for (topic, partition), end in ends.items():
            self.lag.labels(topic, str(partition)).set(max(0, end - committed.get((topic, partition), 0)))
        self._lag_total = lag(ends, committed)

    def caught_up(self, moment_us: int) -> None:
        """The input was read to the end as of ``moment_us`` (consumers/progress.py)."""
        self._caught_up_us = moment_us
        self.input_caught_up.set(moment_us / 1e6)

    def health(self) -> tuple[bool, dict[str, Any]]:
        """/health: healthy or not, and the figures (the HTTP server's thread)."""
        with self._database.lock:
            h = self._health
        free, total = disk(self.db_path) if self.db_path else (None, None)
        h = replace(
            h,
            lag_messages=self._lag_total,
            caught_up_us=self._caught_up_us or h.caught_up_us,
            last_commit_us=self._last_commit_us or h.last_commit_us,
            disk_free_bytes=free,
            disk_total_bytes=total,
            disk_full_since_us=disk_full_since_us(self.db_path) if self.db_path else None,
        )
        h = replace(h, problems=judge(h, time.time_ns() // 1000))
        return not h.problems, h.as_dict()

    def read_database(self, con: duckdb.DuckDBPyConnection) -> None:
        """Instances by status and alerts by outcome, from the database (writer thread; cheap aggregates)."""
        cur = con.cursor()
        try:
            views = {
                r[0] for r in cur.execute("SELECT view_name FROM duckdb_views() WHERE schema_name = 'main'").fetchall()
            }
            tables = {r[0] for r in cur.execute("SELECT table_name FROM duckdb_tables()").fetchall()}
            statuses: dict[str, int] = {}
            if "instance_status" in views:
                statuses = dict(
                    cur.execute("SELECT status, count(*) FROM main.instance_status GROUP BY status").fetchall()
                )
            alerts: dict[str, int] = {}
            if "alerts" in tables:
                alerts = dict(
                    cur.execute(
                        "SELECT outcome, count(*) FROM alerts WHERE outcome IS NOT NULL GROUP BY outcome"
                    ).fetchall()
                )
            figures = self._figures(cur, tables, statuses)
            self._count_failures(cur)
            if self.db_path:
                free, total = disk(self.db_path)
                if free is not None and total is not None:
                    self.disk_free.set(free)
                    self.disk_size.set(total)
        finally:
            cur.close()
        with self._database.lock:
            self._database.statuses, self._database.alerts, self._database.read = statuses, alerts, True
            self._health = figures

    @staticmethod
    def _figures(cur: duckdb.DuckDBPyConnection, tables: set[str], statuses: dict[str, int]) -> Health:
        """The database's operating figures (db/health.py) for /health."""
        row = cur.execute(figures_sql("materializer_progress" in tables)).fetchall()[0]
        versions = tuple((str(v), int(n)) for v, n, _ in cur.execute(VERSIONS).fetchall())
        return Health(
            last_commit_us=row[0],
            caught_up_us=row[2],
            dead_letters=int(row[3]),
            instances=int(row[4]),
            versions=versions,
            statuses=tuple(statuses.items()),
        )

    def _count_failures(self, cur: duckdb.DuckDBPyConnection) -> None:
        """Count the failures first seen since the last read, by class (not those of history: alert_age.py)."""
        rows = [
            {
                "kind": "failed",
                "failure_id": r[0],
                "failure_class": r[1],
                "instance_id": r[2],
                "boot_id": r[3],
                "stage": r[4],
            }
            for r in cur.execute(
                "SELECT failure_id, coalesce(failure_class, 'unclassified'), instance_id, boot_id, stage FROM failures"
            ).fetchall()
        ]
        if self._failures_seen is None:  # what the database held when this process started is not counted
            self._failures_seen = {r["failure_id"] for r in rows}
            return
        new = [r for r in rows if r["failure_id"] not in self._failures_seen]
        if not new:
            return
        old = historical(cur, new, time.time_ns() // 1000, self.max_age)
        for r in new:
            self._failures_seen.add(r["failure_id"])
            if r["failure_id"] not in old:
                self.failures.labels(r["failure_class"]).inc()
