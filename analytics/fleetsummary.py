"""The Fleet page's headline, both breakdowns and its filters' choices: one statement over the fleet view."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
from flightrec.db.query import run_query
from flightrec.db.views import VIEWS

Db = str | Path

# The Fleet page's headline, both breakdowns and its filters' choices in one statement: the fleet view (a status
# for every instance) is computed once, where four queries computed it four times and each opened the database
# and bound the views again (BENCHMARKS.md, Dashboard)
_FLEET_SUMMARY = """
WITH everyone AS MATERIALIZED (SELECT status, state, gpu_model, failures, complete, verdict, last_event_us FROM fleet),
f AS MATERIALIZED (SELECT * FROM everyone WHERE $since IS NULL OR last_event_us >= $since),
by_status AS (SELECT coalesce(nullif(status, ''), 'unknown') AS status, count(*) AS instances FROM f GROUP BY ALL),
by_gpu AS (SELECT coalesce(nullif(gpu_model, ''), 'unknown') AS gpu_model, count(*) AS instances FROM f GROUP BY ALL)
SELECT c.*,
       (SELECT coalesce(list({'status': status, 'instances': instances} ORDER BY instances DESC, status), [])
        FROM by_status) AS by_status,
       (SELECT coalesce(list({'gpu_model': gpu_model, 'instances': instances} ORDER BY instances DESC, gpu_model), [])
        FROM by_gpu) AS by_gpu_model,
       o.*
FROM (SELECT count(*) AS instances,
             count(*) FILTER (WHERE status IN ('failed', 'below_min_rate')) AS failed,
             count(*) FILTER (WHERE status IN ('lost', 'destroyed')) AS gone,
             CAST(coalesce(sum(failures), 0) AS BIGINT) AS failures,
             count(*) FILTER (WHERE NOT coalesce(complete, false)) AS incomplete,
             count(*) FILTER (WHERE verdict = 'pass') AS passed
      FROM f) c,
     (SELECT list(DISTINCT status ORDER BY status) FILTER (WHERE status IS NOT NULL) AS statuses,
             list(DISTINCT state ORDER BY state) FILTER (WHERE state IS NOT NULL) AS states,
             list(DISTINCT gpu_model ORDER BY gpu_model) FILTER (WHERE gpu_model IS NOT NULL) AS gpu_models
      FROM everyone) o"""
FLEET_COUNTS = ("instances", "failed", "gone", "failures", "incomplete", "passed")


def fleet_summary(db: Db, since_us: int | None = None) -> pa.Table:
    """One row: the headline totals (FLEET_COUNTS), instances counted by status (``by_status``) and by GPU model
    (``by_gpu_model``), most first, and the filters' choices (``statuses``, ``states``, ``gpu_models``, of every
    instance). With ``since_us``, the totals and counts cover only instances heard from since then."""
    return run_query(db, _FLEET_SUMMARY, {"since": since_us}, prelude=VIEWS)


def fleet_counts(db: Db, since_us: int | None = None) -> pa.Table:
    """Totals for the headline: instances, failed, failures, incomplete evidence, pass verdicts.

    With ``since_us``, only instances heard from since then (the pages' time range).
    """
    return fleet_summary(db, since_us).select(list(FLEET_COUNTS))


def fleet_filter_options(db: Db) -> pa.Table:
    """Distinct statuses, states and GPU models of every instance, for the Fleet and Throughput filters."""
    return fleet_summary(db).select(["statuses", "states", "gpu_models"])
