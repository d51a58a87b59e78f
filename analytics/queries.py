"""The parameterized queries the dashboard pages run, over the views of db/views.py."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from flightrec.analytics.fleetsummary import (  # noqa: F401 - the pages' names
    FLEET_COUNTS,
    fleet_counts,
    fleet_filter_options,
    fleet_summary,
)
from flightrec.db.kinds import KindWindows
from flightrec.db.query import freshness, run_query
from flightrec.db.views import ALL_VIEWS, VIEWS, prelude_for, ts
from flightrec.schemas.events import KIND_DECISIONS

from flightrec.settings import Settings

log = logging.getLogger(__name__)

Db = str | Path

# Rows the log viewer and the SQL console show at most (the rest is counted, not sent).
MAX_LOG_ROWS = 2000
MAX_CONSOLE_ROWS = 10_000


def q(db: Db, sql: str, params: dict[str, Any] | None = None) -> pa.Table:
    """Run one read-only statement over the views, parameters bound."""
    return run_query(db, sql, params or None, prelude=VIEWS)


def _list(values: Sequence[str] | None) -> list[str]:
    return [str(v) for v in values] if values else []


def like_pattern(text: str) -> str:
    """A case-insensitive ILIKE pattern that matches ``text`` literally anywhere (escape '\\')."""
    escaped = text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{escaped}%"


# ---- Fleet ---------------------------------------------------------------------------


def fleet_table(
    db: Db,
    states: Sequence[str] | None = None,
    gpu_models: Sequence[str] | None = None,
    search: str = "",
    only_failed: bool = False,
    only_incomplete: bool = False,
    statuses: Sequence[str] | None = None,
    since_us: int | None = None,
) -> pa.Table:
    """The instances table with its filters (every filter is a bound parameter).

    Status first; ``failure`` and ``instance`` are the row's relative links (ui.page_link_url's form) to
    its latest failure and its Instance page; ``failure_class`` is that of the current boot's failure,
    else of the latest one.
    """
    return q(
        db,
        """
        WITH lf AS (SELECT instance_id, arg_max(failure_id, ts_us) AS failure_id,
                           arg_max(failure_class, ts_us) AS last_class
                    FROM failures GROUP BY instance_id)
        SELECT status, instance_id, coalesce(failure_class, last_class) AS failure_class,
               'failures?failure=' || url_encode(lf.failure_id) AS failure,
               'instance?instance=' || url_encode(instance_id) AS instance, status_detail,
               state, stage, age_hours, proofs_per_hour, verdict, failures, complete,
               gpu_model, cost_per_proof, last_seen, incomplete_reason
        FROM fleet LEFT JOIN lf USING (instance_id)
        WHERE (len($states) = 0 OR list_contains($states, state))
          AND (len($statuses) = 0 OR list_contains($statuses, status))
          AND ($since IS NULL OR last_event_us >= $since)
          AND (len($gpus) = 0 OR list_contains($gpus, gpu_model))
          AND ($search = '' OR instance_id ILIKE $pattern ESCAPE '\\')
          AND (NOT $only_failed OR failures > 0 OR state = 'failed' OR status IN ('failed', 'below_min_rate'))
          AND (NOT $only_incomplete OR NOT coalesce(complete, false))
        ORDER BY last_event_us DESC NULLS LAST, instance_id""",
        {
            "states": _list(states),
            "gpus": _list(gpu_models),
            "search": search,
            "pattern": like_pattern(search),
            "only_failed": only_failed,
            "only_incomplete": only_incomplete,
            "statuses": _list(statuses),
            "since": since_us,
        },
    )


ATTENTION = ("failed", "below_min_rate", "lost")  # statuses the Fleet page lists first, with links ...
ATTENTION_LIMIT = 200  # ... and destroyed ones whose evidence is incomplete; past this many it says how many more


def fleet_attention(db: Db, since_us: int | None = None, limit: int = ATTENTION_LIMIT) -> pa.Table:
    """Every instance that needs a look (failed, too slow, lost, or destroyed with its evidence incomplete),
    most recent first, with its latest failure; ``more`` counts those past ``limit``."""
    return q(
        db,
        """
        WITH lf AS (SELECT instance_id, arg_max(failure_id, ts_us) AS failure_id,
                           arg_max(failure_class, ts_us) AS last_class
                    FROM failures GROUP BY instance_id),
        a AS (SELECT status, instance_id, coalesce(failure_class, last_class) AS failure_class, lf.failure_id,
                     CASE WHEN status = 'destroyed' THEN status_detail || ' · evidence incomplete: '
                          || coalesce(incomplete_reason, 'not sealed') ELSE status_detail END AS status_detail,
                     last_event_us
              FROM fleet LEFT JOIN lf USING (instance_id)
              WHERE (list_contains($statuses, status) OR (status = 'destroyed' AND NOT coalesce(complete, false)))
                AND ($since IS NULL OR last_event_us >= $since))
        SELECT status, instance_id, failure_class, failure_id, status_detail, count(*) OVER () - $limit AS more
        FROM a ORDER BY last_event_us DESC NULLS LAST, instance_id LIMIT $limit""",
        {"statuses": list(ATTENTION), "since": since_us, "limit": int(limit)},
    )


def instance_ids(db: Db, since_us: int | None = None) -> list[str]:
    """Every instance id (heard from since ``since_us`` when given), the most recently active first."""
    t = q(
        db,
        """SELECT instance_id FROM fleet WHERE $since IS NULL OR last_event_us >= $since
                 ORDER BY last_event_us DESC NULLS LAST, instance_id""",
        {"since": since_us},
    )
    return t.column("instance_id").to_pylist()


# ---- Instance ------------------------------------------------------------------------


def fleet_row(db: Db, instance_id: str) -> pa.Table:
    """The instance's row of the fleet view (zero rows when unknown)."""
    return q(db, "SELECT * FROM fleet WHERE instance_id = $id", {"id": instance_id})


def instance_stages(db: Db, instance_id: str) -> pa.Table:
    """Its stage runs for the timeline; an unfinished run ends at the instance's last event."""
    return q(
        db,
        f"""
        SELECT s.stage, s.run_no, s.boot_id, s.started_at,
               coalesce(s.ended_at, {ts("i.last_event_us")}) AS ended_at,
               -- a run with no end on an instance that is gone, or in a boot that is sealed, did not go on
               -- running: say so
               CASE WHEN s.outcome = 'running' AND (f.status IN ('lost', 'destroyed', 'finished')
                                                    OR s.boot_id <> i.boot_id OR i.sealed)
                    THEN 'no end (' || CASE WHEN s.boot_id <> i.boot_id THEN 'rebooted'
                                            WHEN i.sealed THEN 'sealed' ELSE f.status END || ')'
                    ELSE s.outcome END AS outcome,
               s.detail, s.duration_s
        FROM stage_runs s LEFT JOIN instances i USING (instance_id) LEFT JOIN fleet f USING (instance_id)
        WHERE s.instance_id = $id
        ORDER BY s.started_us""",
        {"id": instance_id},
    )


def instance_manager_events(db: Db, instance_id: str) -> pa.Table:
    """What the manager said about the instance (rented, destroyed, notes), oldest first."""
    return q(
        db,
        """
        SELECT make_timestamp(ts_us) AS at, kind, source_id AS source, detail,
               CAST(attributes AS VARCHAR) AS attributes
        FROM manager_events WHERE instance_id = $id ORDER BY ts_us, seq""",
        {"id": instance_id},
    )


def instance_rejected(db: Db, instance_id: str) -> pa.Table:
    """The instance's messages kept as dead letters (its key), newest first: an event id reused with other content,
    a message that does not decode ... (reason, where it is in Kafka)."""
    return q(
        db,
        """
        SELECT reason, topic, "partition", "offset"
        FROM dead_letters WHERE key = encode($id) ORDER BY topic, "partition", "offset" DESC LIMIT 50""",
        {"id": instance_id},
    )


def instance_trust(db: Db) -> pa.Table:
    """Who wrote the fleet's events (db/trust.py): instances tagged by a key, unauthenticated ones, and the events
    refused in each one's name. No rows from a database a materializer has not yet migrated to version 3."""
    has = (
        run_query(
            db,
            "SELECT count(*) AS n FROM duckdb_columns() WHERE table_name = 'events_seen' AND column_name = 'key_id'",
        )
        .column("n")[0]
        .as_py()
    )
    if not has:
        return pa.table({"instance_id": pa.array([], pa.string())})
    return run_query(
        db,
        """
        SELECT t.instance_id, t.authenticated, t.refused_events, t.last_refusal,
               t.instance_id IN (SELECT instance_id FROM instances) AS heard
        FROM instance_trust t ORDER BY t.refused_events DESC, t.instance_id""",
        prelude=prelude_for("instance_trust"),
    )


def manager_only_instances(db: Db, since_us: int | None = None) -> pa.Table:
    """Instances the manager rented (and did not give back) whose agent never sent an event: paid for, silent."""
    return q(
        db,
        """
        SELECT instance_id, make_timestamp(min(ts_us)) AS first_manager_event
        FROM manager_events m
        WHERE NOT EXISTS (SELECT 1 FROM instances i WHERE i.instance_id = m.instance_id)
          AND NOT list_contains($decisions, m.kind)
        GROUP BY instance_id
        HAVING NOT bool_or(kind IN ('destroyed', 'released')) AND ($since IS NULL OR max(ts_us) >= $since)
        ORDER BY min(ts_us) DESC, instance_id""",
        {"since": since_us, "decisions": list(KIND_DECISIONS)},  # decisions on kinds: no instance's
    )


def instance_exits(db: Db, instance_id: str) -> pa.Table:
    """Its subprocess exits, oldest first."""
    return q(
        db,
        f"""
        SELECT {ts("ts_us")} AS ended_at, stage, array_to_string(argv, ' ') AS command,
               exit_code, signal_name, start_error, duration_s, timed_out
        FROM process_exits WHERE instance_id = $id ORDER BY ts_us""",
        {"id": instance_id},
    )


def instance_throughput(db: Db, instance_id: str) -> pa.Table:
    """Its throughput samples and results over time."""
    return q(
        db,
        """
        SELECT ts, kind, phase, proofs, seconds, proofs_per_hour, min_rate, verdict, cost_per_proof
        FROM throughput_view WHERE instance_id = $id ORDER BY ts_us""",
        {"id": instance_id},
    )


def instance_failures(db: Db, instance_id: str) -> pa.Table:
    """Its failures, newest first."""
    return q(
        db,
        """
        SELECT failure_id, stage, failed_at, failure_class, outcome, hint, decisive_line, ts_us
        FROM failure_context WHERE instance_id = $id ORDER BY ts_us DESC""",
        {"id": instance_id},
    )


def failure_lines_end(db: Db, failure_id: str) -> int | None:
    """When the failed stage's last line was written in the failure's boot (its late ones included: a daemon the
    stage left running may write the decisive line after the exit), µs; None without lines."""
    t = q(
        db,
        """
        SELECT max(l.ts_us) AS last_us
        FROM failures f JOIN log_view l ON l.instance_id = f.instance_id AND l.boot_id = f.boot_id AND l.stage = f.stage
        WHERE f.failure_id = $id""",
        {"id": failure_id},
    )
    return t.column("last_us")[0].as_py() if t.num_rows else None


def log_page(
    db: Db,
    instance_id: str,
    stages: Sequence[str] | None = None,
    sources: Sequence[str] | None = None,
    search: str = "",
    around_us: int | None = None,
    limit: int = MAX_LOG_ROWS,
    newest_first: bool = False,
) -> tuple[pa.Table, pa.Table]:
    """What the log viewer shows, in one scan of the instance's lines: (sources, lines).

    ``sources``: the stages and sources its lines came from, with counts (the filters' options).
    ``lines``: its last ``limit`` lines matching the filters, in time order; with ``around_us``
    those up to that moment; with ``newest_first`` the newest first (the live tail). Column
    ``matching`` holds how many lines match in all. The instance's lines are cut out of the
    table once, then both answers come from those few rows; the page reads its filters first.
    """
    t = q(
        db,
        """
        WITH mine AS MATERIALIZED (SELECT * FROM log_view WHERE instance_id = $id),
        src AS (SELECT list({'stage': stage, 'source': source, 'lines': n} ORDER BY stage, source) AS sources
                FROM (SELECT stage, source, count(*) AS n FROM mine GROUP BY ALL)),
        sel AS (
            SELECT ts, stage, source, line_no, text, truncated, late, ts_us, seq, count(*) OVER () AS matching
            FROM mine
            WHERE (len($stages) = 0 OR list_contains($stages, stage))
              AND (len($sources) = 0 OR list_contains($sources, source))
              AND ($search = '' OR text ILIKE $pattern ESCAPE '\\')
              AND ($around IS NULL OR ts_us <= $around)
            ORDER BY ts_us DESC, seq DESC, line_no DESC
            LIMIT $limit)
        SELECT src.sources, sel.* FROM src LEFT JOIN sel ON true
        ORDER BY CASE WHEN $newest THEN -ts_us ELSE ts_us END, CASE WHEN $newest THEN -seq ELSE seq END,
                 CASE WHEN $newest THEN -line_no ELSE line_no END""",
        {
            "id": instance_id,
            "stages": _list(stages),
            "sources": _list(sources),
            "search": search,
            "pattern": like_pattern(search),
            "around": around_us,
            "limit": int(limit),
            "newest": newest_first,
        },
    )
    found = (t.column("sources")[0].as_py() if t.num_rows else None) or []
    source_table = pa.Table.from_pylist(
        found, schema=pa.schema([("stage", pa.string()), ("source", pa.string()), ("lines", pa.int64())])
    )
    lines = t.drop_columns(["sources"])
    return source_table, lines.filter(pc.is_valid(lines.column("seq")))


# ---- Failures ------------------------------------------------------------------------


def failure_filter_options(db: Db) -> pa.Table:
    """Distinct failure classes and GPU models among failures."""
    return q(
        db,
        """
        SELECT list(DISTINCT failure_class ORDER BY failure_class) FILTER (WHERE failure_class IS NOT NULL) AS classes,
               list(DISTINCT gpu_model ORDER BY gpu_model) FILTER (WHERE gpu_model IS NOT NULL) AS gpu_models
        FROM failure_context""",
    )


UNITS = ("minute", "hour", "day")


def _unit(unit: str) -> str:
    if unit not in UNITS:
        raise ValueError(f"cannot bucket by {unit!r}; use one of {', '.join(UNITS)}")
    return unit


def failures_span(
    db: Db, classes: Sequence[str] | None = None, gpu_models: Sequence[str] | None = None, since_us: int | None = None
) -> pa.Table:
    """The first and last failure time (µs) of the filtered failures, to choose the chart's buckets."""
    return q(
        db,
        """
        SELECT min(ts_us) AS first_us, max(ts_us) AS last_us
        FROM failure_context
        WHERE (len($classes) = 0 OR list_contains($classes, failure_class))
          AND (len($gpus) = 0 OR list_contains($gpus, gpu_model))
          AND ($since IS NULL OR ts_us >= $since)""",
        {"classes": _list(classes), "gpus": _list(gpu_models), "since": since_us},
    )


def failures_over_time(
    db: Db,
    classes: Sequence[str] | None = None,
    gpu_models: Sequence[str] | None = None,
    since_us: int | None = None,
    unit: str = "hour",
) -> pa.Table:
    """Failures per ``unit`` (minute, hour, day) and class (filtered)."""
    return q(
        db,
        f"""
        SELECT date_trunc('{_unit(unit)}', failed_at) AS bucket, coalesce(failure_class, 'unknown') AS failure_class,
               count(*) AS failures
        FROM failure_context
        WHERE (len($classes) = 0 OR list_contains($classes, failure_class))
          AND (len($gpus) = 0 OR list_contains($gpus, gpu_model))
          AND ($since IS NULL OR ts_us >= $since)
        GROUP BY ALL ORDER BY bucket""",
        {"classes": _list(classes), "gpus": _list(gpu_models), "since": since_us},
    )


def failures_by_gpu(
    db: Db, classes: Sequence[str] | None = None, gpu_models: Sequence[str] | None = None, since_us: int | None = None
) -> pa.Table:
    """Failures per GPU model and class (filtered)."""
    return q(
        db,
        """
        SELECT coalesce(nullif(gpu_model, ''), 'unknown') AS gpu_model,
               coalesce(failure_class, 'unknown') AS failure_class,
               count(*) AS failures
        FROM failure_context
        WHERE (len($classes) = 0 OR list_contains($classes, failure_class))
          AND (len($gpus) = 0 OR list_contains($gpus, gpu_model))
          AND ($since IS NULL OR ts_us >= $since)
        GROUP BY ALL ORDER BY failures DESC""",
        {"classes": _list(classes), "gpus": _list(gpu_models), "since": since_us},
    )


def failure_list(
    db: Db,
    classes: Sequence[str] | None = None,
    gpu_models: Sequence[str] | None = None,
    limit: int = 5000,
    since_us: int | None = None,
) -> pa.Table:
    """The failures, newest first (filtered)."""
    return q(
        db,
        """
        SELECT failure_id, failed_at, instance_id, stage, failure_class, outcome, gpu_model, decisive_line, hint
        FROM failure_context
        WHERE (len($classes) = 0 OR list_contains($classes, failure_class))
          AND (len($gpus) = 0 OR list_contains($gpus, gpu_model))
          AND ($since IS NULL OR ts_us >= $since)
        ORDER BY ts_us DESC, failure_id LIMIT $limit""",
        {"classes": _list(classes), "gpus": _list(gpu_models), "limit": int(limit), "since": since_us},
    )


def failure_detail(db: Db, failure_id: str) -> dict[str, Any] | None:
    """Everything about one failure, as a dict (None when there is no such failure)."""
    t = q(db, "SELECT * FROM failure_context WHERE failure_id = $id", {"id": failure_id})
    rows = t.to_pylist()
    return rows[0] if rows else None


def failure_events(db: Db, failure_id: str, limit: int = 20) -> pa.Table:
    """The lifecycle events of the failure's boot that led up to it (those up to its stage's failed event), with times.

    The same events as the failure's ``preceding_events``, each with its time and stage.
    """
    return q(
        db,
        """
        WITH f AS (SELECT instance_id, boot_id, stage, ts_us FROM failures WHERE failure_id = $id),
        upto AS (
            SELECT greatest(coalesce((SELECT e.seq FROM events_seen e WHERE e.event_id = $id), -1),
                            coalesce((SELECT max(l.seq) FROM lifecycle_events l
                                      JOIN f USING (instance_id, boot_id, stage)
                                      WHERE l.kind = 'lifecycle' AND l.state = 'failed'), -1)) AS seq)
        SELECT * FROM (
            SELECT make_timestamp(l.ts_us) AS at, l.stage, l.state, l.detail, l.seq
            FROM lifecycle_events l JOIN f USING (instance_id, boot_id)
            WHERE l.kind = 'lifecycle' AND l.seq <= (SELECT seq FROM upto)
            ORDER BY l.seq DESC LIMIT $limit)
        ORDER BY seq""",
        {"id": failure_id, "limit": int(limit)},
    )


# ---- Failure kinds -------------------------------------------------------------------

KIND_FAILURES_SHOWN = 200  # a kind's failures listed on its page at most, the latest first

# Every kind with its money: each failed instance's cost up to its first failure (failure_cost, db/money.py) goes to
# that failure's kind, as the Cost page gives it to its class, so no dollar counts twice (a kind that was no
# instance's first failure lost $0 of its own); ``dollars_lost`` is NULL when no instance that lost money to the kind
# has a price (unknown, not $0), and only what the priced ones lost when some have none (``unpriced`` counts them).
_KINDS = """
WITH m AS (
    SELECT f.kind,
           CASE WHEN bool_or(c.first_of_instance) THEN sum(c.dollars_before_failure) FILTER (WHERE c.first_of_instance)
                ELSE 0 END AS dollars_lost,
           coalesce(sum(c.hours_before_failure) FILTER (WHERE c.first_of_instance), 0) AS hours_lost,
           count(*) FILTER (WHERE c.first_of_instance AND c.price_per_hour IS NULL) AS unpriced,
           count(*) FILTER (WHERE c.first_of_instance) AS first_failures
    FROM failure_cost c JOIN failures f USING (failure_id) WHERE f.kind IS NOT NULL GROUP BY f.kind)
SELECT k.kind, k.status, k.failures, k.instances, m.dollars_lost, k.template, k.failure_class, k.first_seen,
       k.last_seen, m.hours_lost, coalesce(m.unpriced, 0) AS unpriced, k.hosts, k.gpu_models,
       coalesce(m.first_failures, 0) AS first_failures, k.example_failure_ids, k.first_us, k.last_us
FROM failure_kinds k LEFT JOIN m USING (kind)
WHERE $since IS NULL OR k.last_us >= $since
ORDER BY CASE k.status WHEN 'new' THEN 0 WHEN 'regressed' THEN 1 ELSE 2 END, m.dollars_lost DESC NULLS LAST,
         k.failures DESC, k.kind"""


def _kind_windows() -> KindWindows:
    """The failure kinds' status windows of this dashboard's settings (FLIGHTREC_KINDS_*), as `flightrec kinds`."""
    return KindWindows.from_settings(Settings.from_env())


def failure_kinds(db: Db, since_us: int | None = None) -> pa.Table:
    """Every failure kind (the failure_kinds view), new and regressed first, then by the money lost to it
    (``dollars_lost``, ``unpriced``: see _KINDS), then by failures; with ``since_us``, those seen since then."""
    return run_query(db, _KINDS, {"since": since_us}, prelude=prelude_for(_KINDS, _kind_windows()))


def kind_failures(db: Db, kind: str, limit: int = KIND_FAILURES_SHOWN) -> pa.Table:
    """One kind's failures with their decisive lines, the latest first; ``more`` counts those past ``limit``."""
    return q(
        db,
        """
        SELECT c.failure_id, c.failed_at, c.instance_id, c.stage, c.failure_class, c.outcome, c.gpu_model,
               c.decisive_line, count(*) OVER () - $limit AS more
        FROM failure_context c JOIN failures f USING (failure_id)
        WHERE f.kind = $kind
        ORDER BY c.ts_us DESC NULLS LAST, c.failure_id DESC LIMIT $limit""",
        {"kind": kind, "limit": int(limit)},
    )


def new_kinds(db: Db) -> int | None:
    """How many failure kinds are new now (first seen within the failure_kinds view's window: 24 h); None from a
    database a materializer has not yet migrated to failures.kind (version 8)."""
    has = run_query(
        db, "SELECT count(*) AS n FROM duckdb_columns() WHERE table_name = 'failures' AND column_name = 'kind'"
    )
    if not has.column("n")[0].as_py():
        return None
    sql = "SELECT count(*) AS n FROM failure_kinds WHERE status = 'new'"
    return int(run_query(db, sql, prelude=prelude_for(sql, _kind_windows())).column("n")[0].as_py())


# ---- Throughput ----------------------------------------------------------------------


def gpu_throughput(db: Db) -> pa.Table:
    """Per GPU model: proofs/hour quantiles, the minimum rate, how many fall below, cost per proof."""
    return q(db, "SELECT * FROM gpu_throughput ORDER BY median_proofs_per_hour DESC NULLS LAST")


def instance_rates(db: Db, gpu_models: Sequence[str] | None = None, since_us: int | None = None) -> pa.Table:
    """Latest proofs/hour per instance with its minimum rate and cost per proof."""
    return q(
        db,
        """
        SELECT instance_id, coalesce(nullif(gpu_model, ''), 'unknown') AS gpu_model, proofs_per_hour, min_rate,
               proofs_per_hour >= min_rate AS meets_min_rate, verdict, price_per_hour, cost_per_proof
        FROM fleet
        WHERE proofs_per_hour IS NOT NULL
          AND (len($gpus) = 0 OR list_contains($gpus, gpu_model))
          AND ($since IS NULL OR last_event_us >= $since)
        ORDER BY proofs_per_hour DESC""",
        {"gpus": _list(gpu_models), "since": since_us},
    )


def throughput_span(db: Db, gpu_models: Sequence[str] | None = None, since_us: int | None = None) -> pa.Table:
    """The first and last measured sample time (µs), to choose the chart's buckets."""
    return q(
        db,
        """
        SELECT min(ts_us) AS first_us, max(ts_us) AS last_us
        FROM throughput_samples
        WHERE proofs_per_hour IS NOT NULL AND (phase IS NULL OR phase = 'measured')
          AND (len($gpus) = 0 OR list_contains($gpus, gpu_model))
          AND ($since IS NULL OR ts_us >= $since)""",
        {"gpus": _list(gpu_models), "since": since_us},
    )


def throughput_over_time(
    db: Db, gpu_models: Sequence[str] | None = None, since_us: int | None = None, unit: str = "hour"
) -> pa.Table:
    """Measured proofs/hour per GPU model and ``unit`` (minute, hour, day; median over instances)."""
    return q(
        db,
        f"""
        SELECT date_trunc('{_unit(unit)}', ts) AS bucket, coalesce(nullif(gpu_model, ''), 'unknown') AS gpu_model,
               median(proofs_per_hour) AS proofs_per_hour, count(*) AS samples
        FROM throughput_view
        WHERE proofs_per_hour IS NOT NULL AND (phase IS NULL OR phase = 'measured')
          AND (len($gpus) = 0 OR list_contains($gpus, gpu_model))
          AND ($since IS NULL OR ts_us >= $since)
        GROUP BY ALL ORDER BY bucket""",
        {"gpus": _list(gpu_models), "since": since_us},
    )


# ---- SQL console ---------------------------------------------------------------------

EXAMPLES: dict[str, str] = {
    "Failures by class": "SELECT failure_class, count(*) AS failures, any_value(hint) AS hint\n"
    "FROM failure_context GROUP BY ALL ORDER BY failures DESC",
    "Instances still failing": "SELECT instance_id, status_detail, gpu_model, failures, last_seen\n"
    "FROM fleet WHERE status = 'failed' ORDER BY last_seen DESC LIMIT 100",
    "Lost or destroyed": "SELECT instance_id, status, status_detail, last_seen\n"
    "FROM fleet WHERE status IN ('lost', 'destroyed') ORDER BY last_seen DESC LIMIT 100",
    "Evidence not complete": "SELECT instance_id, state, incomplete_reason\n"
    "FROM fleet WHERE NOT coalesce(complete, false) ORDER BY instance_id LIMIT 100",
    "Throughput by GPU model": "SELECT * FROM gpu_throughput ORDER BY median_proofs_per_hour DESC",
    "Cheapest proofs": "SELECT instance_id, gpu_model, proofs_per_hour, price_per_hour, cost_per_proof\n"
    "FROM fleet WHERE cost_per_proof IS NOT NULL ORDER BY cost_per_proof LIMIT 20",
    "Slowest stages": "SELECT stage, count(*) AS runs, round(median(duration_s), 1) AS median_s,\n"
    "       round(max(duration_s), 1) AS max_s\nFROM stage_runs GROUP BY ALL ORDER BY median_s DESC",
}


def console(db: Db, sql: str, max_rows: int = MAX_CONSOLE_ROWS) -> tuple[pa.Table, bool]:
    """Run the console's read-only SQL; return at most ``max_rows`` rows and whether it was cut.

    On a file the statement is checked and run in a process of its own, bounded by the OS
    (flightrec.db.sandbox: ``CONSOLE_LIMITS``), never in the dashboard's or the materializer's; a
    SELECT is wrapped in a LIMIT so a huge result cannot exhaust memory.
    """
    import duckdb
    from flightrec.db.sandbox import ReadLimits

    text = sql.strip().rstrip(";").strip()
    try:
        statements = duckdb.extract_statements(text)
    except (duckdb.Error, ValueError) as exc:  # the check in the read's process says the same, with the reason
        statements = []
        log.debug("console: %s", exc)
    prelude = prelude_for(text, _kind_windows())  # every shared view it names, the money ones too
    limits = ReadLimits()
    if len(statements) == 1 and _is_select(statements[0]):  # the query DuckDB made of it (a PRAGMA: its SELECT)
        query = statements[0].query
        tokens = duckdb.tokenize(query)
        if tokens and tokens[-1][1] == duckdb.token_type.operator and query[tokens[-1][0]] == ";":
            query = query[: tokens[-1][0]]  # its closing ';' (a comment may follow it), by DuckDB's lexer
        t = run_query(db, f"SELECT * FROM (\n{query}\n) LIMIT {int(max_rows) + 1}", prelude=prelude, limits=limits)
    else:
        t = run_query(db, text, prelude=prelude, limits=limits)
    cut = t.num_rows > max_rows
    return (t.slice(0, max_rows) if cut else t), cut


def _is_select(statement: Any) -> bool:
    try:
        return bool(statement.type.name == "SELECT")
    except (AttributeError, ValueError):  # a statement type this duckdb package does not name
        return False


def data_freshness(db: Db) -> str:
    """How fresh what the pages read is: 'as of commit 1,234 (…), 0.4 s behind the materializer'."""
    fresh = freshness(run_query(db, "SELECT 1 AS one"))
    return fresh.line() if fresh is not None else ""


def catalog(db: Db) -> pa.Table:
    """Tables and views with their columns (every shared view), for the console's help."""
    return run_query(
        db,
        """
        SELECT DISTINCT table_name AS name, CASE WHEN table_type = 'VIEW' THEN 'view' ELSE 'table' END AS kind,
               (SELECT string_agg(column_name, ', ' ORDER BY ordinal_position)
                FROM information_schema.columns c
                WHERE c.table_name = t.table_name AND c.table_schema = t.table_schema) AS columns
        FROM information_schema.tables t
        WHERE table_schema IN ('main', 'temp')
          -- a lake reader's own copy of the lake (flightrec.db.lakecopy): its names again
          AND table_catalog <> 'memory'
        ORDER BY kind, name""",
        prelude=ALL_VIEWS,
    )
