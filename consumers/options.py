"""How one materializer (or replay) run behaves: its options and their defaults, which the CLI's flags take."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from flightrec.db.keep import Keep
from flightrec.db.kinds import KindWindows
from flightrec.db.location import Location, locate
from flightrec.db.trust import TrustConfig

if TYPE_CHECKING:
    from flightrec.db.classify import RuleTable

DEFAULT_GROUP = "flightrec-materializer"


def _topics() -> tuple[str, ...]:
    from flightrec.schemas.topics import TOPICS  # on use: the CLI reads these defaults without loading the codec

    return TOPICS


ALERT_KINDS: tuple[str, ...] = (
    "failed",
    "lost",
    "below_min_rate",
    "incomplete",
    "refused",
    "failure_kind",
)  # what a webhook may be sent


@dataclass(frozen=True)
class Options:
    """How one materializer (or replay) run behaves."""

    db: str | Location  # the --db string, or the Location the CLI parsed it into
    group: str = DEFAULT_GROUP
    until_idle: float | None = None  # stop once caught up and idle this long
    replay: bool = False  # stop at the end offsets seen at start; the db must be new
    instance: str | None = None  # replay only this instance
    since_us: int | None = None  # replay only events at or after this time
    rules: RuleTable | None = None  # the base table (--rules; None: the packaged one)
    rules_file: str | None = None  # the operator's rules, in front of the base, watched (consumers/rulewatch.py)
    serve: bool = True  # publish snapshots of the file for readers (flightrec.db.snapshot)
    batch_bytes: int | None = None  # message bytes per transaction (None: the store's default, the materializer's)
    batch_messages: int = 5000
    commit_interval: float = 0.5  # seconds a partial batch may wait
    memory_limit: str = "512MB"
    lock_wait: float = 30.0  # seconds to wait for another process holding the file
    topics: tuple[str, ...] = field(default_factory=lambda: _topics())
    webhook: str | None = None  # post alerts there (consumers/alerts.py); never in a replay
    alert_on: tuple[str, ...] = ALERT_KINDS
    dashboard_url: str = "http://localhost:8501"
    alert_backoff: float = 1.0  # first retry delay of a failed post
    alert_drain: float = 10.0  # seconds a stopping materializer lets queued alerts go out
    alert_timeout: float = 10.0  # seconds a webhook POST may take; past it the outcome is unknown (not resent)
    views: tuple[str, ...] = ()  # CREATE OR REPLACE VIEW statements stored in the file at start
    data_path: str | None = None  # a lake's data folder (--data-path); None for a file
    session_timeout: float = 10.0  # a lake's group: seconds before a silent member's partitions move
    status_interval: float = 15.0  # seconds between evaluations of instance status (lost alerts)
    alert_max_age: float = 900.0  # alerts for evidence Kafka received longer ago at first sight are not posted
    trust: TrustConfig = field(default_factory=TrustConfig)  # the fleet key and what untagged events get
    metrics_port: int | None = None  # serve Prometheus /metrics there (consumers/metrics.py); a file only
    metrics_address: str = "127.0.0.1"  # the address /metrics (and /health) listens on: this host unless asked
    # what the database keeps (db/retention.py): nothing expires unless told (the CLI passes FLIGHTREC_KEEP_*)
    keep: Keep = field(default_factory=lambda: Keep(lines_days=None, samples_days=None))
    compact_free_share: float = 0.0  # compact the file at a quiet moment once this share is free (0: never)
    archive: str | None = None  # replay reads what the topics no longer hold from this archive (consumers/archive.py)
    kind_windows: KindWindows = field(default_factory=KindWindows)  # the failure kinds' statuses (FLIGHTREC_KINDS_*)

    @property
    def location(self) -> Location:
        """The database written: a file or a lake (db.location.locate: ``db`` passes through when parsed)."""
        return locate(self.db, self.data_path, writing=True)
