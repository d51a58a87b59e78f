"""Prometheus /metrics of a running materializer: lag, what it folded, commits, dead letters, alerts, the fleet."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator, Mapping
from typing import Any

import duckdb
from flightrec.db.fold import Delta
from flightrec.db.stats import Stats
from flightrec.db.status import STATUSES
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from flightrec.errors import MaterializeError

log = logging.getLogger(__name__)

# Commits take milliseconds when idle and seconds under a backlog of large batches; 2 s: no commit waits longer
# for anything a reader does (docs/materializer.md).
COMMIT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 2.5, 5.0, 10.0, 30.0)
ALERT_FAILED = ("refused", "unknown")  # the outbox's outcomes that will not be delivered


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

    def __init__(self, port: int, address: str = "0.0.0.0") -> None:
        self.port, self.address = port, address
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
        self._database = _Database()
        r.register(self._database)
        self._server: Any = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Serve /metrics; MaterializeError (one line) when the port cannot be bound."""
        try:
            self._server, self._thread = start_http_server(self.port, self.address, registry=self.registry)
        except OSError as exc:
            raise MaterializeError(
                f"cannot serve metrics on {self.address}:{self.port} ({exc.strerror or exc}): choose another "
                "--metrics-port"
            ) from exc
        log.info("serving Prometheus metrics on http://%s:%d/metrics", self.address, self.port)

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
        self.last_commit.set(time.time())
        self.events.inc(stats.events_received)
        self.events_written.inc(stats.events_written)
        self.lines.inc(stats.lines_written)
        self.duplicates.inc(stats.duplicates_dropped)
        if delta.dead.num_rows:
            for reason in delta.dead.column("reason").to_pylist():
                self.dead.labels(dead_letter_reason(reason)).inc()
        elif stats.dead_letters:  # the store's own (an event id reused with other content)
            self.dead.labels("conflict").inc(stats.dead_letters)

    def count_errors(self, n: int) -> None:
        if n:
            self.errors.inc(n)

    def set_lag(self, ends: Mapping[tuple[str, int], int], committed: Mapping[tuple[str, int], int]) -> None:
        """Lag per partition: its end offset minus the next offset the database holds (0 when none)."""
        for (topic, partition), end in ends.items():
            self.lag.labels(topic, str(partition)).set(max(0, end - committed.get((topic, partition), 0)))

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
        finally:
            cur.close()
        with self._database.lock:
            self._database.statuses, self._database.alerts, self._database.read = statuses, alerts, True
