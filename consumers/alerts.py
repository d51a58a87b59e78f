"""Webhook alerts: one Slack-compatible JSON message per new failure, incomplete boot or lost instance, at most once;
one per window for refused events, whatever instances they claim.

How it keeps its promises:

- *At most once per alert and key.* Right after each commit the writer thread calls
  :meth:`Alerter.sync`, which copies every new alertable row (a failure, or a boot
  that is sealed but incomplete) into the ``alerts`` table (the outbox) with its
  message, keyed by failure id (``incomplete:<instance>:<boot>`` for boots) and
  de-duplicated on (kind, instance, boot, stage). Before each POST the sender marks
  the row ``attempted_us`` in the database (committed); a POST whose outcome is
  unknown (sent, then no answer within the timeout, a reset, a 5xx other than 503)
  is never sent again, and neither is one that was in flight when the process died
  (the next start finds the mark). Only a POST that certainly did not reach the
  receiver (no connection made; 408, 429, 503 answers) is retried, with backoff.
  Every message carries a stable idempotency key (``flightrec.idempotency_key`` and
  the ``Idempotency-Key`` header, a UUIDv5 of the alert id).
- *Never blocking materialization.* Posts happen on the alerter's own thread
  from a bounded queue; the writer only does a few small SQL statements per commit.
  A server that is down costs retries with exponential backoff on that thread.
- *Status changes, one alert per silence.* Every ``status_interval`` seconds the writer
  also reads the ``instance_status`` view stored in the file (the readers' one rule
  table, handed to the materializer as DDL: nothing here imports it) and records a
  ``lost`` row keyed ``lost:<instance>:<boot>:<last sign µs>``, the last sign being when
  Kafka received the boot's last event. A boot already alerted as lost alerts again
  only when something was received from it after that alert was made (a new silence);
  a backlog folded late or heartbeats stamped by a wrong clock make no second alert.
  Where the view judges by the instance's own clock (CreateTime topics) a new alert
  needs the boot to have been seen not lost in between. A file without the stored view
  gets no ``lost`` alerts (a warning says so once).
- *Untrusted text stays text.* Instance ids, stage names, lines and details come from hosts: in the Slack text and
  blocks they are escaped for mrkdwn (``&`` ``<`` ``>``: no ``<!channel>``, ``<!here>``, mention or disguised
  ``<url|label>`` can form) and kept on one line (webhook.slack_text); links are built with the id URL-quoted.
- *Refused events are summed.* Events refused as forged, revoked or unauthenticated make one ``refused`` alert per
  ``refused_window`` (10 minutes) at most, with how many were refused since the last one and how many more instance
  ids they claimed: a stolen agent credential claiming hundreds of made-up ids cannot flood the channel.
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
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import duckdb
import pyarrow as pa
from flightrec.consumers import alert_age, kind_alerts, webhook
from flightrec.consumers.options import ALERT_KINDS
from flightrec.consumers.webhook import slack_text
from flightrec.db.kinds import QUIET_US

from flightrec.errors import ConfigError

log = logging.getLogger(__name__)

KINDS: tuple[str, ...] = ALERT_KINDS
MAX_FIELD = 1900  # Slack refuses a block field over 2,000 characters
REFUSED_WINDOW_S = 600.0  # refused events: one alert per 10 minutes at most, with the count since the last one
# Failure kinds: those of the failures each commit added are looked at after it; every kind only this often (the
# failure_kinds view over every failure costs about a second per 100,000 failures on a loaded 2-core machine).
KINDS_INTERVAL_S = 300.0

_NEW = pa.schema(
    [
        ("alert_id", pa.string()),
        ("kind", pa.string()),
        ("instance_id", pa.string()),
        ("boot_id", pa.string()),
        ("stage", pa.string()),
        ("ts_us", pa.int64()),
        ("payload", pa.string()),
        ("created_us", pa.int64()),
        ("sent_us", pa.int64()),
        ("refused_total", pa.int64()),
        ("refused_instances", pa.int64()),
    ]
)
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
    error       VARCHAR,              -- why it is not sent (again): refused for good (4xx), or the outcome is unknown
    attempted_us BIGINT,              -- a POST began then, its outcome not recorded yet (NULL: none in flight)
    outcome     VARCHAR               -- delivered / refused / unknown; NULL: to be sent
);
ALTER TABLE alerts ADD COLUMN IF NOT EXISTS attempted_us BIGINT;
ALTER TABLE alerts ADD COLUMN IF NOT EXISTS outcome VARCHAR;
ALTER TABLE alerts ADD COLUMN IF NOT EXISTS refused_total BIGINT;  -- refused events in all, when a 'refused' was made
ALTER TABLE alerts ADD COLUMN IF NOT EXISTS refused_instances BIGINT  -- instances they claimed in all, then"""
# A POST in flight when the last materializer stopped without recording its outcome: it may have been received.
_IN_FLIGHT_LEFT = """
UPDATE alerts SET outcome = 'unknown', attempted_us = NULL,
       error = 'outcome unknown: a POST was in flight when the materializer stopped; not sent again'
WHERE attempted_us IS NOT NULL AND outcome IS NULL AND sent_us IS NULL AND error IS NULL"""

# The alertable rows that the outbox does not hold yet, as (kind, row).
_NEW_FAILURES = """
WITH f AS (SELECT CASE WHEN failure_class = 'below_min_rate' THEN 'below_min_rate' ELSE 'failed' END AS kind,
                  * EXCLUDE (kind), kind AS failure_kind
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
# Events refused as forged, revoked or unauthenticated (db/trust.py), summed over every claimed instance: any stolen
# agent credential can claim as many made-up instance ids as it likes, so the alerts are one per window with the
# count (Alerter._refused), the claimed instances on the dashboard (the instance_trust view).
_REFUSED = """(d.reason LIKE 'forged:%' OR d.reason LIKE 'revoked:%' OR d.reason LIKE 'unauthenticated:%')"""
_REFUSED_NOW = f"""
SELECT count(*) AS total, count(DISTINCT d.instance_id) AS instances, arg_max(d.reason, d."offset") AS detail,
       (SELECT list(instance_id ORDER BY n DESC, instance_id)[1:5] FROM (
            SELECT d.instance_id, count(*) AS n FROM dead_letters d
            WHERE d.instance_id IS NOT NULL AND {_REFUSED} GROUP BY d.instance_id)) AS examples
FROM dead_letters d WHERE d.instance_id IS NOT NULL AND {_REFUSED}"""
_REFUSED_ALERTED = """
SELECT max(created_us), coalesce(max(refused_total), 0), coalesce(max(refused_instances), 0)
FROM alerts WHERE kind = 'refused'"""
# Every instance the stored status view calls lost now, keyed by its silence (the last sign of life), with when
# the latest lost alert of the same boot was made (NULL: none) and whether this silence's key is recorded.
# ``s.*``: a view stored by an older flightrec lacks liveness_clock (then: the instance's clock).
_LOST_NOW = """
SELECT s.*, 'lost' AS kind, 'lost:' || s.instance_id || ':' || i.boot_id || ':' || CAST(s.last_sign_us AS VARCHAR)
           AS failure_id,
       i.boot_id, NULL AS stage, s.last_sign_us AS ts_us, i.gpu_model, i.host,
       (SELECT max(a.created_us) FROM alerts a WHERE a.kind = 'lost' AND a.instance_id = s.instance_id
                                                 AND a.boot_id = i.boot_id) AS alerted_us,
       EXISTS (SELECT 1 FROM alerts a WHERE a.alert_id = 'lost:' || s.instance_id || ':' || i.boot_id || ':'
                                                         || CAST(s.last_sign_us AS VARCHAR)) AS recorded
FROM main.instance_status s JOIN instances i USING (instance_id)
WHERE s.status = 'lost' AND s.last_sign_us IS NOT NULL
ORDER BY s.last_sign_us, s.instance_id"""


def new_silences(rows: list[dict[str, Any]], lost_before: set[tuple[str, str]]) -> list[dict[str, Any]]:
    """The rows of _LOST_NOW that are a new silence to alert: one alert per silence, whatever the heartbeats say.

    A boot never alerted as lost alerts. One already alerted alerts again only for a new silence: judged by the
    receiver's clock, something was received from it after that alert was made (its last sign is later); judged
    by the instance's own clock (no receive times), it was seen not lost in between (``lost_before`` holds the
    boots lost at the previous look). A backlog folded late, heartbeats stamped by a wrong clock, a restart: no
    second alert. Pure.
    """
    out = []
    for r in rows:
        if r["recorded"]:
            continue
        previous = r["alerted_us"]
        if previous is not None:
            if r.get("liveness_clock") == "receiver":
                if r["last_sign_us"] <= previous:
                    continue
            elif (r["instance_id"], r["boot_id"]) in lost_before:
                continue
        out.append(r)
    return out


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
    backoff: float = 1.0  # first retry delay, doubled each time
    max_backoff: float = 60.0
    drain: float = 10.0  # seconds a stopping materializer lets queued messages go out
    queue_size: int = 256
    timeout: float = 10.0  # seconds per HTTP request
    status_interval: float = 15.0  # seconds between reads of the instance status (lost alerts)
    max_age: float = 900.0  # evidence Kafka received longer ago than this at first sight is recorded, not posted
    refused_window: float = REFUSED_WINDOW_S  # at most one refused-events alert per this many seconds
    kinds_interval: float = KINDS_INTERVAL_S  # seconds between looks at every failure kind (else: those just failed)
    kinds_quiet_us: int = QUIET_US  # the failure_kinds view's quiet window (FLIGHTREC_KINDS_QUIET_DAYS)


def _cut(text: Any) -> str:
    """At most MAX_FIELD characters, never ending inside an escape (&amp; &lt; &gt;)."""
    s = "" if text is None else str(text)
    if len(s) <= MAX_FIELD:
        return s
    s = s[: MAX_FIELD - 1]
    amp = s.rfind("&", len(s) - 5)
    if amp >= 0 and ";" not in s[amp:]:
        s = s[:amp]
    return s + "…"


def _refused_text(row: Mapping[str, Any]) -> tuple[str, str]:
    examples = ", ".join(slack_text(i) for i in row.get("examples") or ())
    hint = (
        f"{row.get('refused_events')} event(s) refused since the last such alert, claiming "
        f"{row.get('instances')} more instance id(s) (e.g. {examples}); the latest: {slack_text(row.get('detail'))}"
    )
    return hint, f"flightrec: events were refused (forged, revoked or unauthenticated): {hint}"


def message(kind: str, row: Mapping[str, Any], dashboard_url: str) -> dict[str, Any]:
    """The Slack-compatible message for one alertable row: ``text``, ``blocks`` and a ``flightrec`` object.

    Every value that came from an instance (ids, stages, lines, details) is escaped for Slack's mrkdwn and the text
    is one line (webhook.slack_text); the ``flightrec`` object keeps the raw values (JSON)."""
    base = dashboard_url.rstrip("/")
    if kind == kind_alerts.ALERT:
        text, fields, own = kind_alerts.message_parts(row, base)
        return _slack(text, fields, {**_common(kind, row), "failure_class": row.get("failure_class"), **own})
    inst, alert_id = row["instance_id"], row["failure_id"]
    shown = slack_text(inst)
    link = f"{base}/instance?instance={urllib.parse.quote(str(inst), safe='')}"
    if kind == "lost":
        klass, hint, matched = "lost", slack_text(row.get("status_detail") or ""), ""
        text = f"flightrec: {shown} is lost: {hint}"
    elif kind == "refused":
        link = f"{base}/"  # the Fleet page: the refused count per claimed instance
        klass, matched = "refused", ""
        hint, text = _refused_text(row)
    elif kind == "incomplete":
        reason = slack_text(row.get("incomplete_reason"))
        klass, matched = "incomplete", ""
        hint = f"sealed but incomplete: {reason} ({row.get('events')} of {row.get('sealed_count')} events)"
        text = f"flightrec: {shown} ended with incomplete evidence: {reason}"
    else:
        link = f"{base}/failures?failure={urllib.parse.quote(str(alert_id), safe='')}"
        klass = slack_text(row.get("failure_class") or "unclassified")
        hint = slack_text(row.get("hint") or "")
        matched = slack_text(row.get("decisive_line") or row.get("matched_line") or "")
        text = f"flightrec: {shown} failed in {slack_text(row.get('stage'))}: {klass}. {hint}".rstrip()
    fields = {"Instance": shown if kind != "refused" else "-", "Class": klass, "Hint": hint, "Decisive line": matched}
    fields["Link"] = slack_text(link)
    body: dict[str, Any] = {
        **_common(kind, row),
        "failure_class": row.get("failure_class") or klass,
        "hint": hint,
        "decisive_line": row.get("decisive_line") or row.get("matched_line") or "",
        "matched_line": row.get("decisive_line") or row.get("matched_line") or "",  # the old name of decisive_line
        "link": link,
        "ts_us": row.get("ts_us"),
        "gpu_model": row.get("gpu_model"),
    }
    for key in ("exit_code", "signal_name", "detail", "refused_events", "instances", "examples"):
        if row.get(key) is not None:
            body[key] = row[key]
    return _slack(text, fields, body)


def _common(kind: str, row: Mapping[str, Any]) -> dict[str, Any]:
    """The keys every alert's ``flightrec`` object starts with."""
    return {
        "kind": kind,
        "alert_id": row["failure_id"],
        "idempotency_key": webhook.idempotency_key(row["failure_id"]),
        "instance_id": row["instance_id"],
        "boot_id": row.get("boot_id"),
        "stage": row.get("stage"),
    }


def _slack(text: str, fields: Mapping[str, str], body: dict[str, Any]) -> dict[str, Any]:
    """A Slack-compatible message: ``text``, ``blocks`` (the text, then the fields) and the ``flightrec`` object."""
    return {
        "text": _cut(text),
        "blocks": [
            {"type": "section", "text": {"type": "mrkdwn", "text": _cut(text)}},
            {
                "type": "section",
                "fields": [{"type": "mrkdwn", "text": _cut(f"*{k}*\n{v or '-'}")} for k, v in fields.items()],
            },
        ],
        "flightrec": body,
    }


class Alerter:
    """The outbox in the database and the thread that posts it. Call start(), sync() and close() from the writer
    thread; the sender thread writes delivery state (the in-flight mark, outcomes) through a cursor of its own."""

    def __init__(
        self, config: AlertConfig, post: Callable[[str, bytes, str, float], webhook.PostResult] | None = None
    ) -> None:
        url = urllib.parse.urlsplit(config.url)
        if url.scheme not in ("http", "https") or not url.netloc:
            raise ConfigError(f"webhook {config.url!r} is not an http(s) URL; give --webhook https://host/path")
        self.config = config
        self._post = post or webhook.post
        self._queue: queue.Queue[tuple[str, str]] = queue.Queue(maxsize=config.queue_size)
        self._queued: set[str] = set()  # enqueued, outcome not yet recorded (writer thread)
        self._done: list[str] = []  # ids whose outcome the sender recorded (under _lock)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._busy = threading.Event()
        self._db: duckdb.DuckDBPyConnection | None = None  # the sender's cursor
        self._thread = threading.Thread(target=self._send_loop, name="flightrec-alerts", daemon=True)
        self._status_due = 0.0  # monotonic time of the next status read
        self._status_missing_said = False
        self._kinds_missing_said = False
        self._kinds_due = 0.0  # monotonic time of the next look at every failure kind
        self._lost_before: set[tuple[str, str]] = set()  # (instance, boot) lost at the previous status read

    # -- writer thread -----------------------------------------------------------

    def start(self, con: duckdb.DuckDBPyConnection) -> None:
        """Create the outbox (recording any earlier failures as not to be sent), settle the POSTs a stopped
        materializer left in flight (outcome unknown: not sent again), start the sender, queue what is due."""
        existed = con.execute("SELECT count(*) FROM duckdb_tables() WHERE table_name = 'alerts'").fetchall()[0][0]
        con.execute(OUTBOX_DDL)
        left = con.execute(_IN_FLIGHT_LEFT).fetchall()[0][0]
        if left:
            log.warning(
                "%d alert(s) were being posted when the last materializer stopped: their outcome is unknown, "
                "so they are not sent again (alerts.outcome = 'unknown')",
                left,
            )
        self._lost_before = {
            (r[0], r[1])
            for r in con.execute("SELECT DISTINCT instance_id, boot_id FROM alerts WHERE kind = 'lost'").fetchall()
        }
        if not existed:
            self._record_new(con, sent_us=0)
        self._db = con.cursor()
        self._thread.start()
        self.sync(con)

    def sync(self, con: duckdb.DuckDBPyConnection) -> None:
        """Copy new alertable rows into the outbox, queue the unsent ones (never blocks)."""
        with self._lock:
            done, self._done = self._done, []
        self._queued.difference_update(done)
        self._record_new(con, sent_us=None)
        free = self.config.queue_size - self._queue.qsize()
        if free <= 0:
            return
        due = con.execute(
            "SELECT alert_id, payload FROM alerts WHERE sent_us IS NULL AND error IS NULL "
            "AND outcome IS NULL AND list_contains(?, kind) ORDER BY created_us, ts_us",
            [list(self.config.kinds)],
        ).fetchall()
        for alert_id, payload in due:
            if alert_id in self._queued:
                continue
            try:
                self._queue.put_nowait((alert_id, payload))
            except queue.Full:
                break
            self._queued.add(alert_id)

    def _rows(self, con: duckdb.DuckDBPyConnection, sql: str) -> list[dict[str, Any]]:
        cur = con.execute(sql)
        names = [d[0] for d in cur.description]
        return [dict(zip(names, values, strict=True)) for values in cur.fetchall()]

    def _refused(self, con: duckdb.DuckDBPyConnection, now_us: int) -> list[dict[str, Any]]:
        """One refused-events row when events were refused since the last such alert and that alert is at least
        ``refused_window`` old: their count, how many more instances they claimed, a few of those; none from a
        database made before dead letters named their instance."""
        has = con.execute(
            "SELECT count(*) FROM duckdb_columns() WHERE table_name = 'dead_letters' AND column_name = 'instance_id'"
        ).fetchall()[0][0]
        if not has:
            return []
        last_us, alerted, alerted_instances = con.execute(_REFUSED_ALERTED).fetchall()[0]
        if last_us is not None and now_us - last_us < self.config.refused_window * 1e6:
            return []
        now = self._rows(con, _REFUSED_NOW)[0]
        if now["total"] <= alerted:
            return []
        return [
            {
                "kind": "refused",
                "failure_id": f"refused:{now_us}",
                "instance_id": None,
                "boot_id": None,
                "stage": None,
                "ts_us": now_us,
                "refused_events": now["total"] - alerted,
                "instances": max(0, now["instances"] - alerted_instances),
                "examples": list(now["examples"] or ()),
                "detail": now["detail"],
                "refused_total": now["total"],
                "refused_instances": now["instances"],
            }
        ]

    def _found(self, con: duckdb.DuckDBPyConnection, now: int, sent_us: int | None) -> list[dict[str, Any]]:
        """Every alertable row the outbox does not hold yet: failures, incomplete boots, refused events; lost
        instances every ``status_interval``; new and regressed failure kinds when failures were added or at the
        status read."""
        failures = self._rows(con, _NEW_FAILURES)
        found = failures + self._rows(con, _NEW_INCOMPLETE) + self._refused(con, now)
        status_due = time.monotonic() >= self._status_due
        if status_due:
            self._status_due = time.monotonic() + self.config.status_interval
        if status_due and ("lost" in self.config.kinds or sent_us is not None) and self._has_status_view(con):
            lost = self._rows(con, _LOST_NOW)
            found += new_silences(lost, self._lost_before)
            self._lost_before = {(r["instance_id"], r["boot_id"]) for r in lost}
        return found + self._kinds(con, sent_us, {r["failure_kind"] for r in failures if r.get("failure_kind")})

    def _kinds(self, con: duckdb.DuckDBPyConnection, sent_us: int | None, touched: set[str]) -> list[dict[str, Any]]:
        """The new and regressed failure kinds not alerted yet (kind_alerts.py), when chosen (or at the outbox's
        creation, to record them as not to be sent): those of the failures just found (``touched``), and every kind
        at start and each ``kinds_interval`` (a failure the per-failure query leaves out, a row rebuilt); none from
        a file without the stored view."""
        if kind_alerts.ALERT not in self.config.kinds and sent_us is None:
            return []
        every = time.monotonic() >= self._kinds_due
        if not every and not touched:
            return []
        if not kind_alerts.has_view(con):
            if not self._kinds_missing_said:
                self._kinds_missing_said = True
                log.warning(
                    "no failure_kinds view stored in the database: no `failure_kind` alerts "
                    "(run the materializer through `flightrec materialize`, which stores the views)"
                )
            return []
        if every:
            self._kinds_due = time.monotonic() + self.config.kinds_interval
        return kind_alerts.kinds_now(con, None if every else sorted(touched), self.config.kinds_quiet_us)

    def _record_new(self, con: duckdb.DuckDBPyConnection, sent_us: int | None) -> None:
        now = time.time_ns() // 1000
        found = self._found(con, now, sent_us)
        old = alert_age.historical(con, found, now, self.config.max_age) if sent_us is None else {}
        rows = []
        for row in found:
            if row["kind"] not in self.config.kinds and sent_us is None:
                continue  # not chosen: not recorded, so choosing it later still alerts
            rows.append(
                [
                    row["failure_id"],
                    row["kind"],
                    row["instance_id"],
                    row["boot_id"],
                    row["stage"],
                    row["ts_us"],
                    json.dumps(message(row["kind"], row, self.config.dashboard_url), default=str),
                    now,
                    0 if row["failure_id"] in old else sent_us,  # history (alert_age.py): recorded, not sent
                    row.get("refused_total"),
                    row.get("refused_instances"),
                ]
            )
        if rows:  # one Arrow batch, one INSERT (a first start may record thousands of earlier failures)
            unique = {r[0]: r for r in rows}  # one row per alert id within the batch too
            con.register(
                "_new_alerts",
                pa.Table.from_pylist([dict(zip(_NEW.names, r, strict=True)) for r in unique.values()], schema=_NEW),
            )
            try:
                con.execute("INSERT INTO alerts BY NAME SELECT * FROM _new_alerts ON CONFLICT DO NOTHING")
            finally:
                con.unregister("_new_alerts")
            alert_age.mark(con, old)

    def _has_status_view(self, con: duckdb.DuckDBPyConnection) -> bool:
        found = con.execute(
            "SELECT count(*) FROM duckdb_views() WHERE view_name = 'instance_status' AND schema_name = 'main'"
        ).fetchall()[0][0]
        if not found and not self._status_missing_said:
            self._status_missing_said = True
            log.warning(
                "no instance_status view stored in the database: no `lost` alerts "
                "(run the materializer through `flightrec materialize`, which stores the views)"
            )
        return bool(found)

    def close(self, con: duckdb.DuckDBPyConnection | None) -> None:
        """Give queued messages ``drain`` seconds, then stop the sender (a POST under way gets its timeout)."""
        deadline = time.monotonic() + self.config.drain
        while (
            self._thread.is_alive()
            and (self._queue.unfinished_tasks or self._busy.is_set())
            and time.monotonic() < deadline
        ):
            time.sleep(0.05)
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=self.config.timeout + 1)
        if self._thread.is_alive():
            log.warning(
                "a POST to %s is still under way; its outcome is unknown and it is not sent again", self.config.url
            )
        elif self._db is not None:
            self._db.close()
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
                self._deliver(alert_id, payload)
            except Exception:  # noqa: BLE001 - a sender that dies would leave every later alert unsent
                log.exception("alert %s: delivery failed unexpectedly; it is tried again at the next start", alert_id)
            finally:
                self._busy.clear()
                self._queue.task_done()

    def _write(self, sql: str, params: list[Any]) -> bool:
        """One committed statement on the sender's cursor; a write conflict with the writer thread is tried again."""
        assert self._db is not None
        for attempt in range(20):
            try:
                self._db.execute(sql, params)
                return True
            except duckdb.TransactionException as exc:
                if attempt == 19:
                    log.error("could not record the delivery state of an alert: %s", exc)
                time.sleep(0.01 * (attempt + 1))
            except duckdb.Error as exc:
                log.error("could not record the delivery state of an alert: %s", exc)
                return False
        return False

    def _deliver(self, alert_id: str, payload: str) -> None:
        """Post until delivered, refused, of unknown outcome, or stopped; each POST marked in flight beforehand."""
        delay, key, body = self.config.backoff, webhook.idempotency_key(alert_id), payload.encode()
        while not self._stop.is_set():
            # at most once: the mark is committed before the request leaves; unmarked, it does not leave
            if not self._write(
                "UPDATE alerts SET attempted_us = ?, attempts = attempts + 1 WHERE alert_id = ?",
                [time.time_ns() // 1000, alert_id],
            ):
                return  # stays due: the next start tries again (nothing was sent)
            result = self._post(self.config.url, body, key, self.config.timeout)
            if result.outcome == webhook.RETRY:
                self._write("UPDATE alerts SET attempted_us = NULL WHERE alert_id = ?", [alert_id])
                wait = min(max(delay, result.retry_after or 0.0), self.config.max_backoff)
                log.warning("alert %s not delivered (%s); retrying in %.1fs", alert_id, result.why, wait)
                self._stop.wait(wait)
                delay = min(delay * 2, self.config.max_backoff)
                continue
            sent = time.time_ns() // 1000 if result.outcome == webhook.DELIVERED else None
            error = None
            if result.outcome == webhook.REFUSED:
                error = result.why
                log.error(
                    "the webhook refused alert %s (%s); fix the URL or payload, it is not retried", alert_id, result.why
                )
            elif result.outcome == webhook.UNKNOWN:
                error = f"outcome unknown ({result.why}); not sent again: at most once"
                log.warning("alert %s: %s", alert_id, error)
            self._write(
                "UPDATE alerts SET sent_us = ?, outcome = ?, error = ?, attempted_us = NULL WHERE alert_id = ?",
                [sent, result.outcome, error, alert_id],
            )
            with self._lock:
                self._done.append(alert_id)
            return
