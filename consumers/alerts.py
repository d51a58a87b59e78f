"""Webhook alerts: one Slack-compatible JSON message per new failure, incomplete boot or lost instance, at least once.

How it keeps its promises:

- *At least once, de-duplicated.* Right after each commit the writer thread calls
  :meth:`Alerter.sync`, which copies every new alertable row (a failure, or a boot
  that is sealed but incomplete) into the ``alerts`` table (the outbox) with its
  message, keyed by failure id (``incomplete:<instance>:<boot>`` for boots) and
  de-duplicated on (kind, instance, boot, stage). A row is marked ``sent_us`` only
  after the server answered 2xx. A crash before sending leaves it unsent, and the
  next start sends it; a restart never sends a row marked sent.
- *Never blocking materialization.* Posts happen on the alerter's own thread
  from a bounded queue; the writer only does two small SQL statements per commit.
  A server that is down costs retries with exponential backoff on that thread.
- *Status changes.* Every ``status_interval`` seconds the writer also reads the
  ``instance_status`` view stored in the file (the readers' one rule table, handed to
  the materializer as DDL: nothing here imports it) and records one ``lost`` row per
  silence, keyed ``lost:<instance>:<boot>:<last sign µs>``: a lost instance alerts once,
  and again only after it was heard from and went silent anew. A file without the
  stored view gets no ``lost`` alerts (a warning says so once).
- *Alerts start when enabled.* When the outbox is first created in a database
  that already holds failures, those are recorded as not to be sent (``sent_us``
  = 0), so enabling alerts on an old database does not replay its history.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any, Mapping

import duckdb
import pyarrow as pa

from flightrec.errors import ConfigError

log = logging.getLogger(__name__)

KINDS: tuple[str, ...] = ("failed", "lost", "below_min_rate", "incomplete")
MAX_FIELD = 1900  # Slack refuses a block field over 2,000 characters

_NEW = pa.schema([("alert_id", pa.string()), ("kind", pa.string()), ("instance_id", pa.string()),
                  ("boot_id", pa.string()), ("stage", pa.string()), ("ts_us", pa.int64()), ("payload", pa.string()),
                  ("created_us", pa.int64()), ("sent_us", pa.int64())])
_OUTCOMES = pa.schema([("alert_id", pa.string()), ("sent_us", pa.int64()), ("attempts", pa.int32()),
                       ("error", pa.string())])


def _record_outcomes(con: duckdb.DuckDBPyConnection, outcomes: list[tuple[str, int | None, int, str | None]]) -> None:
    """The senders' results into the outbox, as one Arrow batch and one UPDATE."""
    if not outcomes:
        return
    table = pa.Table.from_pylist([dict(zip(_OUTCOMES.names, o)) for o in outcomes], schema=_OUTCOMES)
    con.register("_alert_outcomes", table)
    try:
        con.execute("""UPDATE alerts SET sent_us = o.sent_us, attempts = alerts.attempts + o.attempts, error = o.error
                       FROM _alert_outcomes o WHERE alerts.alert_id = o.alert_id""")
    finally:
        con.unregister("_alert_outcomes")


OUTBOX_DDL = """
CREATE TABLE IF NOT EXISTS alerts (
    alert_id    VARCHAR PRIMARY KEY,  -- the failure id, 'incomplete:<instance>:<boot>' or 'lost:<instance>:<boot>:<µs>'
    kind        VARCHAR,              -- failed / below_min_rate / incomplete / lost
    instance_id VARCHAR,
    boot_id     VARCHAR,
    stage       VARCHAR,
    ts_us       BIGINT,
    payload     VARCHAR,              -- the JSON message, as posted
    created_us  BIGINT,
    sent_us     BIGINT,               -- NULL: not delivered yet; 0: predates alerts being enabled
    attempts    INTEGER DEFAULT 0,
    error       VARCHAR               -- set when the server refused the message for good (4xx)
)"""

# The alertable rows that the outbox does not hold yet, as (kind, row).
_NEW_FAILURES = """
WITH f AS (SELECT CASE WHEN failure_class = 'below_min_rate' THEN 'below_min_rate' ELSE 'failed' END AS kind, *
           FROM failures)
SELECT * FROM f
WHERE failure_id NOT IN (SELECT alert_id FROM alerts)
  AND NOT EXISTS (SELECT 1 FROM alerts a WHERE a.kind = f.kind AND a.instance_id = f.instance_id
                  AND a.boot_id = f.boot_id AND a.stage IS NOT DISTINCT FROM f.stage)
ORDER BY ts_us"""
_NEW_INCOMPLETE = """
SELECT 'incomplete' AS kind, 'incomplete:' || b.instance_id || ':' || b.boot_id AS failure_id, b.instance_id,
       b.boot_id, NULL AS stage, b.last_event_us AS ts_us, b.incomplete_reason, b.events, b.sealed_count,
       i.gpu_model, i.host
FROM boots b LEFT JOIN instances i USING (instance_id)
WHERE b.sealed_count IS NOT NULL AND NOT b.complete
  AND NOT EXISTS (SELECT 1 FROM alerts a WHERE a.alert_id = 'incomplete:' || b.instance_id || ':' || b.boot_id)
ORDER BY b.last_event_us"""
# Instances the stored status view calls lost, one row per silence (its last sign of life).
_NEW_LOST = """
SELECT 'lost' AS kind, 'lost:' || s.instance_id || ':' || i.boot_id || ':' || CAST(s.last_sign_us AS VARCHAR)
           AS failure_id,
       s.instance_id, i.boot_id, NULL AS stage, s.last_sign_us AS ts_us, s.status_detail, s.silent_s,
       s.heartbeat_interval_s, i.gpu_model, i.host
FROM main.instance_status s JOIN instances i USING (instance_id)
WHERE s.status = 'lost' AND s.last_sign_us IS NOT NULL
  AND 'lost:' || s.instance_id || ':' || i.boot_id || ':' || CAST(s.last_sign_us AS VARCHAR)
      NOT IN (SELECT alert_id FROM alerts)
ORDER BY s.last_sign_us"""


def parse_kinds(text: str | None) -> tuple[str, ...]:
    """The kinds chosen by ``--alert-on`` (comma separated; empty or None: all)."""
    if not text or not text.strip():
        return KINDS
    kinds = tuple(dict.fromkeys(k.strip() for k in text.split(",") if k.strip()))
    unknown = [k for k in kinds if k not in KINDS]
    if unknown:
        raise ConfigError(f"--alert-on {','.join(unknown)}: unknown; choose from {','.join(KINDS)}")
    return kinds


@dataclass(frozen=True)
class AlertConfig:
    """Where and what to post, and how patiently."""

    url: str
    kinds: tuple[str, ...] = KINDS
    dashboard_url: str = "http://localhost:8501"
    backoff: float = 1.0        # first retry delay, doubled each time
    max_backoff: float = 60.0
    drain: float = 10.0         # seconds a stopping materializer lets queued messages go out
    queue_size: int = 256
    timeout: float = 10.0       # seconds per HTTP request
    status_interval: float = 15.0  # seconds between reads of the instance status (lost alerts)


def _cut(text: Any) -> str:
    s = "" if text is None else str(text)
    return s if len(s) <= MAX_FIELD else s[: MAX_FIELD - 1] + "…"


def message(kind: str, row: Mapping[str, Any], dashboard_url: str) -> dict[str, Any]:
    """The Slack-compatible message for one alertable row: ``text``, ``blocks`` and a ``flightrec`` object."""
    base = dashboard_url.rstrip("/")
    inst, alert_id = row["instance_id"], row["failure_id"]
    if kind == "lost":
        link = f"{base}/instance?instance={inst}"
        klass, hint, matched = "lost", row.get("status_detail") or "", ""
        text = f"flightrec: {inst} is lost: {hint}"
    elif kind == "incomplete":
        link = f"{base}/instance?instance={inst}"
        klass, hint = "incomplete", (f"sealed but incomplete: {row.get('incomplete_reason')} "
                                     f"({row.get('events')} of {row.get('sealed_count')} events)")
        text = f"flightrec: {inst} ended with incomplete evidence: {row.get('incomplete_reason')}"
        matched = ""
    else:
        link = f"{base}/failures?failure={alert_id}"
        klass, hint, matched = row.get("failure_class") or "unclassified", row.get("hint") or "", \
            row.get("matched_line") or ""
        text = f"flightrec: {inst} failed in {row.get('stage')}: {klass}. {hint}".rstrip()
    fields = {"Instance": inst, "Class": klass, "Hint": hint, "Matched line": matched, "Link": link}
    body: dict[str, Any] = {
        "kind": kind, "alert_id": alert_id, "instance_id": inst, "boot_id": row.get("boot_id"),
        "stage": row.get("stage"), "failure_class": klass, "hint": hint, "matched_line": matched, "link": link,
        "ts_us": row.get("ts_us"), "gpu_model": row.get("gpu_model"),
    }
    for key in ("exit_code", "signal_name", "detail"):
        if row.get(key) is not None:
            body[key] = row[key]
    return {
        "text": _cut(text),
        "blocks": [
            {"type": "section", "text": {"type": "mrkdwn", "text": _cut(text)}},
            {"type": "section", "fields": [{"type": "mrkdwn", "text": _cut(f"*{k}*\n{v or '-'}")}
                                           for k, v in fields.items()]},
        ],
        "flightrec": body,
    }


class Alerter:
    """The outbox in the database and the thread that posts it. Call sync() and close() from the writer thread."""

    def __init__(self, config: AlertConfig) -> None:
        url = urllib.parse.urlsplit(config.url)
        if url.scheme not in ("http", "https") or not url.netloc:
            raise ConfigError(f"webhook {config.url!r} is not an http(s) URL; give --webhook https://host/path")
        self.config = config
        self._queue: queue.Queue[tuple[str, str]] = queue.Queue(maxsize=config.queue_size)
        self._queued: set[str] = set()                  # enqueued, outcome not yet recorded (writer thread)
        self._outcomes: list[tuple[str, int | None, int, str | None]] = []  # (id, sent_us, attempts, error)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._busy = threading.Event()
        self._thread = threading.Thread(target=self._send_loop, name="flightrec-alerts", daemon=True)
        self._status_due = 0.0                          # monotonic time of the next status read
        self._status_missing_said = False

    # -- writer thread -----------------------------------------------------------

    def start(self, con: duckdb.DuckDBPyConnection) -> None:
        """Create the outbox (recording any earlier failures as not to be sent), start the sender, queue what is due."""
        existed = con.execute("SELECT count(*) FROM duckdb_tables() WHERE table_name = 'alerts'").fetchone()[0]
        con.execute(OUTBOX_DDL)
        if not existed:
            self._record_new(con, sent_us=0)
        self._thread.start()
        self.sync(con)

    def sync(self, con: duckdb.DuckDBPyConnection) -> None:
        """Record outcomes, copy new alertable rows into the outbox, queue the unsent ones (never blocks)."""
        with self._lock:
            outcomes, self._outcomes = self._outcomes, []
        _record_outcomes(con, outcomes)
        self._queued.difference_update(o[0] for o in outcomes)
        self._record_new(con, sent_us=None)
        free = self.config.queue_size - self._queue.qsize()
        if free <= 0:
            return
        due = con.execute("SELECT alert_id, payload FROM alerts WHERE sent_us IS NULL AND error IS NULL "
                          "AND list_contains(?, kind) ORDER BY created_us, ts_us",
                          [list(self.config.kinds)]).fetchall()
        for alert_id, payload in due:
            if alert_id in self._queued:
                continue
            try:
                self._queue.put_nowait((alert_id, payload))
            except queue.Full:
                break
            self._queued.add(alert_id)

    def _record_new(self, con: duckdb.DuckDBPyConnection, sent_us: int | None) -> None:
        now = time.time_ns() // 1000
        rows = []
        queries = [_NEW_FAILURES, _NEW_INCOMPLETE]
        if time.monotonic() >= self._status_due and ("lost" in self.config.kinds or sent_us is not None):
            self._status_due = time.monotonic() + self.config.status_interval
            if self._has_status_view(con):
                queries.append(_NEW_LOST)
        for sql in queries:
            cur = con.execute(sql)
            names = [d[0] for d in cur.description]
            for values in cur.fetchall():
                row = dict(zip(names, values))
                if row["kind"] not in self.config.kinds and sent_us is None:
                    continue  # not chosen: not recorded, so choosing it later still alerts
                rows.append([row["failure_id"], row["kind"], row["instance_id"], row["boot_id"], row["stage"],
                             row["ts_us"], json.dumps(message(row["kind"], row, self.config.dashboard_url),
                                                      default=str), now, sent_us])
        if rows:  # one Arrow batch, one INSERT (a first start may record thousands of earlier failures)
            unique = {r[0]: r for r in rows}  # one row per alert id within the batch too
            con.register("_new_alerts", pa.Table.from_pylist([dict(zip(_NEW.names, r)) for r in unique.values()],
                                                             schema=_NEW))
            try:
                con.execute("INSERT INTO alerts BY NAME SELECT * FROM _new_alerts ON CONFLICT DO NOTHING")
            finally:
                con.unregister("_new_alerts")

    def _has_status_view(self, con: duckdb.DuckDBPyConnection) -> bool:
        found = con.execute("SELECT count(*) FROM duckdb_views() WHERE view_name = 'instance_status' "
                            "AND schema_name = 'main'").fetchone()[0]
        if not found and not self._status_missing_said:
            self._status_missing_said = True
            log.warning("no instance_status view stored in the database: no `lost` alerts "
                        "(run the materializer through `flightrec materialize`, which stores the views)")
        return bool(found)

    def close(self, con: duckdb.DuckDBPyConnection | None) -> None:
        """Give queued messages ``drain`` seconds, stop the sender, record the outcomes."""
        deadline = time.monotonic() + self.config.drain
        while self._thread.is_alive() and (self._queue.unfinished_tasks or self._busy.is_set()) \
                and time.monotonic() < deadline:
            time.sleep(0.05)
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=self.config.timeout + 1)
        if con is not None:
            with self._lock:
                outcomes, self._outcomes = self._outcomes, []
            _record_outcomes(con, outcomes)
        left = self._queue.unfinished_tasks
        if left:
            log.warning("%d alert(s) not delivered yet to %s; they are sent at the next start", left, self.config.url)

    # -- sender thread -------------------------------------------------------------

    def _send_loop(self) -> None:
        while not self._stop.is_set():
            try:
                alert_id, payload = self._queue.get(timeout=0.1)
            except queue.Empty:
                continue
            self._busy.set()
            try:
                sent_us, attempts, error = self._deliver(alert_id, payload)
                if sent_us is not None or error is not None:
                    with self._lock:
                        self._outcomes.append((alert_id, sent_us, attempts, error))
            finally:
                self._busy.clear()
                self._queue.task_done()

    def _deliver(self, alert_id: str, payload: str) -> tuple[int | None, int, str | None]:
        """Post until delivered, refused for good, or stopped: (sent_us, attempts, error)."""
        delay, attempts = self.config.backoff, 0
        while not self._stop.is_set():
            attempts += 1
            req = urllib.request.Request(self.config.url, data=payload.encode(), method="POST",
                                         headers={"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(req, timeout=self.config.timeout) as resp:
                    resp.read()
                return time.time_ns() // 1000, attempts, None
            except urllib.error.HTTPError as exc:
                if 400 <= exc.code < 500 and exc.code not in (408, 429):
                    log.error("the webhook refused alert %s (HTTP %d); fix the URL or payload, it is not retried",
                              alert_id, exc.code)
                    return None, attempts, f"HTTP {exc.code}"
                why = f"HTTP {exc.code}"
            except (urllib.error.URLError, OSError) as exc:
                why = str(getattr(exc, "reason", exc))
            log.warning("alert %s not delivered (%s); retrying in %.1fs", alert_id, why, delay)
            self._stop.wait(delay)
            delay = min(delay * 2, self.config.max_backoff)
        return None, attempts, None
