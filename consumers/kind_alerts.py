"""Failure-kind alerts: one webhook message per new or regressed failure kind, never one per failure.

A kind's status is the ``failure_kinds`` view's (db/views.py; stored in the file by the materializer, as the
``instance_status`` view the ``lost`` alerts read): ``new`` (first seen within a day) and ``regressed`` (seen again
after a quiet week) alert; ``ongoing`` and ``explained`` (a rule covers it) do not. Each alert is keyed by the
failure that opened the episode, ``failure_kind:<kind>:<failure id>``: the kind's first failure for a new kind,
the first failure after its quiet gap for a regressed one. The key is a pure function of the failures, so
however many batches, failures or restarts follow, one episode makes one row in the outbox (and the outbox's
guarantees make it one post); a later regression of the same kind has another opening failure, so another alert.

Whether a kind's alert is history (a database built from old topics) is judged by its newest evidence:
``consumers/alert_age.py`` takes the newest append time over every failure of the kind.
"""

from __future__ import annotations

import logging
import urllib.parse
from collections.abc import Mapping
from typing import Any

import duckdb
from flightrec.consumers.webhook import slack_text
from flightrec.db.kinds import QUIET_US
from flightrec.db.views import sane_us

log = logging.getLogger(__name__)

ALERT = "failure_kind"  # the alert's kind (--alert-on failure_kind)
STATUSES = ("new", "regressed")  # the statuses that alert
EXAMPLES_SHOWN = 3  # example failure ids in the message's text

# The kinds to alert that the outbox does not hold yet, each with the failure that opened its episode: the latest
# failure of the kind that follows a quiet gap of $quiet µs or more (the first failure, for a kind seen once): the
# view's own quiet window (FLIGHTREC_KINDS_QUIET_DAYS, AlertConfig.kinds_quiet_us).
_KINDS_NOW = f"""
WITH s AS (SELECT * FROM main.failure_kinds WHERE list_contains($statuses, status){{only}}),
f AS (SELECT f.kind, f.failure_id, {sane_us("f.ts_us")} AS ts_us,
             {sane_us("f.ts_us")} - lag({sane_us("f.ts_us")}) OVER (
                 PARTITION BY f.kind ORDER BY f.ts_us, f.failure_id) AS quiet_us
      FROM failures f WHERE f.kind IN (SELECT kind FROM s)),
o AS (SELECT kind, arg_max(failure_id, (ts_us, failure_id))
                       FILTER (WHERE quiet_us IS NULL OR quiet_us >= $quiet) AS opened_by
      FROM f GROUP BY kind)
SELECT '{ALERT}' AS kind, s.kind AS failure_kind, '{ALERT}:' || s.kind || ':' || o.opened_by AS failure_id,
       NULL AS instance_id, NULL AS boot_id, NULL AS stage, s.last_us AS ts_us, o.opened_by, s.status, s.template,
       s.failures, s.instances, s.hosts, s.gpu_models, s.failure_class, s.first_us, s.last_us,
       s.example_failure_ids
FROM s JOIN o USING (kind)
WHERE o.opened_by IS NOT NULL
  AND NOT EXISTS (SELECT 1 FROM alerts a WHERE a.alert_id = '{ALERT}:' || s.kind || ':' || o.opened_by)
ORDER BY s.first_us, s.kind"""


def has_view(con: duckdb.DuckDBPyConnection) -> bool:
    """Whether the file holds the stored failure_kinds view (and failures.kind, which it reads)."""
    found = con.execute(
        "SELECT count(*) FROM duckdb_views() WHERE view_name = 'failure_kinds' AND schema_name = 'main'"
    ).fetchall()[0][0]
    return bool(found)


_EVERY = _KINDS_NOW.replace("{only}", "")
_ONLY = _KINDS_NOW.replace("{only}", " AND list_contains($kinds, kind)")  # the filter reaches the view's scan


def kinds_now(
    con: duckdb.DuckDBPyConnection, kinds: list[str] | None = None, quiet_us: int = QUIET_US
) -> list[dict[str, Any]]:
    """The new and regressed kinds (of ``kinds``; None: every kind) whose episode the outbox does not hold yet, as
    alertable rows; ``quiet_us``: the silence after which a kind's next failure opens a new episode."""
    if kinds is None:
        cur = con.execute(_EVERY, {"statuses": list(STATUSES), "quiet": quiet_us})
    else:
        cur = con.execute(_ONLY, {"statuses": list(STATUSES), "kinds": kinds, "quiet": quiet_us})
    names = [d[0] for d in cur.description]
    return [dict(zip(names, values, strict=True)) for values in cur.fetchall()]


def link(base: str, kind: str) -> str:
    """The kind on the dashboard's Failure kinds page."""
    return f"{base}/kinds?kind={urllib.parse.quote(str(kind), safe='')}"


def message_parts(row: Mapping[str, Any], base: str) -> tuple[str, dict[str, str], dict[str, Any]]:
    """The text, the Slack fields and the ``flightrec`` object's own keys of a kind's alert (text escaped)."""
    kind, status = str(row["failure_kind"]), str(row.get("status") or "")
    template = slack_text(row.get("template") or "")
    counts = f"{row.get('failures')} failure(s) on {row.get('instances')} instance(s) so far"
    examples = ", ".join(slack_text(i) for i in list(row.get("example_failure_ids") or ())[:EXAMPLES_SHOWN])
    url = link(base, kind)
    text = f"flightrec: {status} failure kind {slack_text(kind)}: {template} ({counts})"
    fields = {
        "Kind": f"{slack_text(kind)} ({status})",
        "Template": template,
        "Failures": f"{counts}; e.g. {examples}" if examples else counts,
        "Class": slack_text(row.get("failure_class") or "unknown"),
        "Link": slack_text(url),
    }
    body = {
        "failure_kind": kind,
        "status": status,
        "template": row.get("template") or "",
        "failures": row.get("failures"),
        "instances": row.get("instances"),
        "hosts": row.get("hosts"),
        "gpu_models": list(row.get("gpu_models") or ()),
        "first_us": row.get("first_us"),
        "last_us": row.get("last_us"),
        "opened_by": row.get("opened_by"),
        "example_failure_ids": list(row.get("example_failure_ids") or ()),
        "link": url,
    }
    return text, fields, body
