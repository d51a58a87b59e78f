"""SQL views shared by the Streamlit app and `flightrec sql` (run as a trusted prelude)."""

from __future__ import annotations

import re

from flightrec.db.kinds import (
    EXAMPLES,
    KIND_DECISIONS,
    KIND_HEX,
    KIND_MERGED,
    KIND_MUTED,
    KIND_SPLIT,
    KIND_UNMERGED,
    KIND_UNMUTED,
    KindWindows,
)
from flightrec.db.money import MONEY_VIEW_NAMES, MONEY_VIEWS
from flightrec.db.status import INSTANCE_STATUS
from flightrec.schemas.limits import TS_MAX_US, TS_MIN_US

# Each entry is one `CREATE OR REPLACE TEMP VIEW ...` statement over the tables of
# db/schema.sql. `flightrec sql` and the app pass them to
# flightrec.db.query.run_query(prelude=VIEWS), so both speak the same names.
# Times: the tables hold microseconds since the epoch (UTC, `*_us`); the views add a
# TIMESTAMPTZ `*_at` next to every `*_us` (and the older readable names: first_seen, ts ...),
# so any DuckDB client can read and bucket them in its own time zone.
# A stored time outside the fold's sane window (a database written before the fold checked,
# or by another tool) reads as NULL there, so one absurd value cannot break a view for everyone.


def sane_us(expr: str) -> str:
    """``expr`` (µs since the epoch) when inside the sane window, else NULL."""
    return f"(CASE WHEN ({expr}) >= {TS_MIN_US} AND ({expr}) < {TS_MAX_US} THEN ({expr}) END)"


def ts(expr: str) -> str:
    """A TIMESTAMPTZ from ``expr`` (µs since the epoch), NULL when outside the sane window."""
    return f"make_timestamptz({sane_us(expr)})"


FLEET = f"""
CREATE OR REPLACE TEMP VIEW fleet AS
SELECT
    i.instance_id, i.state, i.stage, i.detail, nullif(i.gpu_model, '') AS gpu_model,  -- '' in files folded before
    nullif(i.gpu_count, 0) AS gpu_count, nullif(i.compute_capability, '') AS compute_capability,  -- facts were
    nullif(i.driver_version, '') AS driver_version, nullif(i.cuda_version, '') AS cuda_version,  -- NULL-not-''
    nullif(i.host, '') AS host, i.price_per_hour,
    {ts("i.first_event_us")} AS first_seen,
    {ts("i.last_event_us")} AS last_seen,
    round((epoch_us(now()) - {sane_us("i.first_event_us")}) / 3600e6, 2) AS age_hours,
    i.proofs_per_hour, i.min_rate, i.verdict,
    i.price_per_hour / nullif(i.proofs_per_hour, 0) AS cost_per_proof,
    coalesce(i.failures, 0) AS failures,
    i.events, i.sealed, i.complete, i.incomplete_reason, i.boot_id,
    i.first_event_us, i.last_event_us,
    {ts("i.first_event_us")} AS first_event_at, {ts("i.last_event_us")} AS last_event_at,
    i.gpu_probe_error,
    s.status, s.status_detail, s.failure_class, s.last_heartbeat_us, s.last_heartbeat_at, s.heartbeat_interval_s,
    s.silent_s, s.manager_kind, s.manager_detail,
    s.last_sign_us AS last_heard_us, s.last_sign_at AS last_heard_at, s.liveness_clock,
    s.clock_offset_s, s.clock_skewed
FROM instances i
LEFT JOIN instance_status s USING (instance_id)
WHERE s.status IS DISTINCT FROM 'forgotten'  -- `flightrec manager forget`: never should have existed
"""

# One row per run of a stage: started -> the next succeeded / failed / skipped of the
# same instance, boot and stage. A run with no end yet has outcome 'running'.
STAGE_RUNS = f"""
CREATE OR REPLACE TEMP VIEW stage_runs AS
WITH ev AS (
    SELECT instance_id, boot_id, stage, state, detail, {sane_us("ts_us")} AS ts_us, seq,
           CAST(sum(CASE WHEN state = 'started' THEN 1 ELSE 0 END)
               OVER (PARTITION BY instance_id, boot_id, stage ORDER BY seq
                     ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS BIGINT) AS run_no
    FROM lifecycle_events
    WHERE kind = 'lifecycle' AND stage IS NOT NULL AND state IN ('started', 'succeeded', 'failed', 'skipped')
)
SELECT
    instance_id, boot_id, stage, run_no,
    min(ts_us) AS started_us,
    min(ts_us) FILTER (WHERE state <> 'started') AS ended_us,
    make_timestamptz(min(ts_us)) AS started_at,
    make_timestamptz(min(ts_us) FILTER (WHERE state <> 'started')) AS ended_at,
    coalesce(arg_min(state, seq) FILTER (WHERE state <> 'started'), 'running') AS outcome,
    arg_min(detail, seq) FILTER (WHERE state <> 'started') AS detail,
    (min(ts_us) FILTER (WHERE state <> 'started') - min(ts_us)) / 1e6 AS duration_s
FROM ev
GROUP BY instance_id, boot_id, stage, run_no
"""

FAILURE_CONTEXT = f"""
CREATE OR REPLACE TEMP VIEW failure_context AS
SELECT
    f.failure_id, f.instance_id, f.boot_id, f.stage, {ts("f.ts_us")} AS failed_at,
    f.failure_class, f.hint, f.decisive_line, f.decisive_source, f.decisive_line_no, f.rule_id, f.rules_version,
    CASE
        WHEN f.signal IS NOT NULL AND f.signal <> 0
            THEN 'signal ' || coalesce(f.signal_name, CAST(f.signal AS VARCHAR))
        WHEN f.start_error IS NOT NULL AND f.start_error <> '' THEN 'did not start: ' || f.start_error
        WHEN f.exit_code IS NOT NULL THEN 'exit ' || CAST(f.exit_code AS VARCHAR)
        ELSE 'no exit'
    END AS outcome,
    f.exit_code, f.signal, f.signal_name, f.killed_by, f.killed_by_evidence, f.start_error, f.detail,
    f.stderr_tail, f.stdout_tail, f.file_tails, f.preceding_events, f.last_lines,
    coalesce(f.gpu_model, i.gpu_model) AS gpu_model,
    f.compute_capability, f.driver_version, f.cuda_version,
    f.proofs_per_hour, f.min_rate, i.host, i.price_per_hour, f.ts_us, {ts("f.ts_us")} AS ts_at
FROM failures f
LEFT JOIN instances i USING (instance_id)
"""

# Every log line with a readable time and the kind of its source (stdout, stderr, file).
LOG_VIEW = f"""
CREATE OR REPLACE TEMP VIEW log_view AS
SELECT
    instance_id, boot_id, stage, source,
    CASE WHEN source IN ('stdout', 'stderr') THEN source ELSE 'file' END AS source_kind,
    line_no, {ts("ts_us")} AS ts, text, truncated, invalid_utf8, coalesce(late, false) AS late,
    ts_us, {ts("ts_us")} AS ts_at,
    pid, seq
FROM log_lines
"""

# Every throughput row (kind 'sample': a Throughput event, 'result': a BenchmarkResult) with a
# readable time, the instance's GPU model and price, and the cost per proof.
THROUGHPUT_VIEW = f"""
CREATE OR REPLACE TEMP VIEW throughput_view AS
SELECT
    t.instance_id, t.boot_id, t.stage, t.kind, t.phase, {ts("t.ts_us")} AS ts,
    coalesce(i.gpu_model, t.device) AS gpu_model, t.backend, t.device,
    t.proofs, t.seconds, t.proofs_per_hour, coalesce(t.min_rate, i.min_rate) AS min_rate, t.verdict,
    i.price_per_hour, i.price_per_hour / nullif(t.proofs_per_hour, 0) AS cost_per_proof, t.ts_us,
    {ts("t.ts_us")} AS ts_at
FROM throughput t
LEFT JOIN instances i USING (instance_id)
"""

# The view's name before it was named for its concept (it holds results too); kept for old SQL.
THROUGHPUT_SAMPLES = "CREATE OR REPLACE TEMP VIEW throughput_samples AS SELECT * FROM throughput_view"

# Latest proofs/hour per instance, summarised per GPU model against the minimum rate.
GPU_THROUGHPUT = """
CREATE OR REPLACE TEMP VIEW gpu_throughput AS
SELECT
    coalesce(nullif(gpu_model, ''), 'unknown') AS gpu_model,
    count(*) AS instances,
    round(quantile_cont(proofs_per_hour, 0.1), 1) AS p10_proofs_per_hour,
    round(median(proofs_per_hour), 1) AS median_proofs_per_hour,
    round(quantile_cont(proofs_per_hour, 0.9), 1) AS p90_proofs_per_hour,
    max(min_rate) AS min_rate,
    count(*) FILTER (WHERE proofs_per_hour < min_rate) AS below_min_rate,
    median(price_per_hour) AS median_price_per_hour,
    median(price_per_hour / nullif(proofs_per_hour, 0)) AS median_cost_per_proof
FROM instances
WHERE proofs_per_hour IS NOT NULL
GROUP BY ALL
"""

VIEWS: tuple[str, ...] = (
    INSTANCE_STATUS,
    FLEET,
    STAGE_RUNS,
    FAILURE_CONTEXT,
    LOG_VIEW,
    THROUGHPUT_VIEW,
    THROUGHPUT_SAMPLES,
    GPU_THROUGHPUT,
)

# The names the views define, for documentation and the SQL console's help.
VIEW_NAMES: tuple[str, ...] = (
    "instance_status",
    "fleet",
    "stage_runs",
    "failure_context",
    "log_view",
    "throughput_view",
    "throughput_samples",  # the old name of throughput_view
    "gpu_throughput",
)

# Who wrote each instance's events (db/trust.py): authenticated when a valid key tagged them, the events
# refused in its name (forged, revoked, untagged), and its own events kept unverified (delivered after its destroy).
# Needs schema version 3 (events_seen.key_id): kept out of VIEWS, which every page binds, so a reader of a file
# a materializer has not yet migrated still reads the rest.
INSTANCE_TRUST = """
CREATE OR REPLACE TEMP VIEW instance_trust AS
WITH tagged AS (
    SELECT instance_id, count(DISTINCT key_id) AS keys, arg_max(key_id, ts_us) AS key_id
    FROM events_seen WHERE key_id IS NOT NULL GROUP BY instance_id
), refused AS (
    SELECT instance_id, count(*) AS refused_events, arg_max(reason, "offset") AS last_refusal
    FROM dead_letters
    WHERE instance_id IS NOT NULL
      AND (reason LIKE 'forged:%' OR reason LIKE 'revoked:%' OR reason LIKE 'unauthenticated:%')
    GROUP BY instance_id
), unverified AS (
    SELECT instance_id, count(*) AS unverified_events
    FROM dead_letters WHERE instance_id IS NOT NULL AND starts_with(reason, 'unverified:') GROUP BY instance_id
), named AS (
    SELECT instance_id FROM instances UNION SELECT instance_id FROM refused UNION SELECT instance_id FROM unverified
)
SELECT n.instance_id, t.instance_id IS NOT NULL AS authenticated, t.key_id, coalesce(t.keys, 0) AS keys,
       coalesce(r.refused_events, 0) AS refused_events, r.last_refusal,
       coalesce(u.unverified_events, 0) AS unverified_events
FROM named n LEFT JOIN tagged t USING (instance_id) LEFT JOIN refused r USING (instance_id)
     LEFT JOIN unverified u USING (instance_id)
"""

# One row per failure kind (failures.kind, db/kinds.py), derived from failures and the operator's decisions (manager
# events: db/kinds.py), so lake members never write it and a replay rebuilds it. The decisions, the latest word on a
# kind winning by its own time (ts_us, seq, event id), never by order of arrival: a split first (a failure of kind K
# whose decisive line matches the split's RE2 pattern is of the split's kind, db.kinds.split_kind; an expression RE2
# refuses matches nothing), then merges (a kind merged into another counts as its target, followed up to
# MERGE_DEPTH merges; `merged_kinds` lists them; a later unmerge takes one back), then a mute (on the kind as
# shown; a later unmute takes it back). Its status, in this order:
# muted; regressed (a failure within the new window was classed otherwise than the latest failure a rule explained
# before it); explained (the latest failure's class is not 'unknown': a rule covers it); new (first seen within the
# new window); regressed (a failure within the new window came after the quiet window without one); else ongoing.
# The windows are the reader's settings (KindWindows). Needs schema version 8 (failures.kind): kept out of VIEWS,
# like instance_trust.
MERGE_DEPTH = 8  # merges followed from a kind to its target (a cycle stops there, the same way every time)


def _kind_decisions() -> str:
    """The CTEs of the operator's decisions: `splits` (of_kind, pattern, new_kind, said), `target` (of_kind ->
    into_kind, merges followed) and `muted` (of_kind)."""
    return f"""d AS (
    SELECT kind AS decision, attributes['failure_kind'] AS of_kind, attributes['into'] AS into_kind,
           attributes['pattern'] AS pattern, (ts_us, seq, event_id) AS said
    FROM manager_events
    WHERE kind IN {KIND_DECISIONS!r} AND coalesce(attributes['failure_kind'], '') <> ''
), splits AS (
    SELECT of_kind, pattern, left(sha256(of_kind || chr(31) || pattern), {KIND_HEX}) AS new_kind, said
    FROM d WHERE decision = '{KIND_SPLIT}' AND coalesce(pattern, '') <> ''
), merges AS (
    SELECT of_kind, into_kind FROM d
    WHERE decision = '{KIND_UNMERGED}' OR (decision = '{KIND_MERGED}' AND coalesce(into_kind, '') <> '')
    QUALIFY row_number() OVER (PARTITION BY of_kind ORDER BY said DESC) = 1 AND decision = '{KIND_MERGED}'
), chain AS (
    SELECT of_kind, into_kind, 1 AS depth FROM merges
    UNION ALL
    SELECT c.of_kind, m.into_kind, c.depth + 1 FROM chain c JOIN merges m ON m.of_kind = c.into_kind
    WHERE c.depth < {MERGE_DEPTH}
), target AS (
    SELECT of_kind, arg_max(into_kind, depth) AS into_kind FROM chain GROUP BY of_kind
), muted AS (
    SELECT of_kind FROM d WHERE decision IN ('{KIND_MUTED}', '{KIND_UNMUTED}')
    QUALIFY row_number() OVER (PARTITION BY of_kind ORDER BY said DESC) = 1 AND decision = '{KIND_MUTED}'
)"""


def failure_kinds_view(windows: KindWindows | None = None) -> str:
    """The failure_kinds view with the statuses' windows given (see above; None: the defaults)."""
    windows = windows or KindWindows()
    new_since = f"epoch_us(now()) - {int(windows.new_us)}"
    return f"""
CREATE OR REPLACE TEMP VIEW failure_kinds AS
WITH RECURSIVE {_kind_decisions()}, f0 AS (
    SELECT f.kind AS found_kind, f.kind_template, f.failure_id, f.instance_id, f.failure_class, f.decisive_line,
           {sane_us("f.ts_us")} AS ts_us,
           coalesce(f.gpu_model, nullif(i.gpu_model, '')) AS gpu_model, nullif(i.host, '') AS host
    FROM failures f LEFT JOIN instances i USING (instance_id)
    WHERE f.kind IS NOT NULL
), f1 AS (
    SELECT f0.*, coalesce((
        SELECT arg_max(s.new_kind, s.said) FROM splits s
        WHERE s.of_kind = f0.found_kind AND coalesce(try(regexp_matches(f0.decisive_line, s.pattern)), false)
    ), found_kind) AS split_kind
    FROM f0
), f2 AS (
    SELECT f1.*, coalesce(t.into_kind, f1.split_kind) AS kind FROM f1 LEFT JOIN target t ON t.of_kind = f1.split_kind
), f AS (
    SELECT *, ts_us - lag(ts_us) OVER w AS quiet_us,
           last_value(nullif(failure_class, 'unknown') IGNORE NULLS) OVER (
               w ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS explained_before
    FROM f2 WINDOW w AS (PARTITION BY kind ORDER BY ts_us, failure_id)
), k AS (
    SELECT kind, coalesce(min(kind_template) FILTER (WHERE split_kind = kind), min(kind_template)) AS template,
           min(ts_us) AS first_us, max(ts_us) AS last_us,
           count(*) AS failures, count(DISTINCT instance_id) AS instances, count(DISTINCT host) AS hosts,
           list(DISTINCT gpu_model ORDER BY gpu_model) FILTER (WHERE gpu_model IS NOT NULL) AS gpu_models,
           (list(failure_id ORDER BY ts_us DESC NULLS LAST, failure_id DESC))[1:{EXAMPLES}] AS example_failure_ids,
           (list(failure_class ORDER BY ts_us DESC NULLS LAST, failure_id DESC))[1] AS failure_class,
           coalesce(max(quiet_us) FILTER (WHERE ts_us >= {new_since}), 0) AS recent_quiet_us,
           coalesce(bool_or(explained_before IS NOT NULL AND failure_class IS DISTINCT FROM explained_before)
                    FILTER (WHERE ts_us >= {new_since}), false) AS class_changed,
           list(DISTINCT split_kind ORDER BY split_kind) FILTER (WHERE split_kind <> kind) AS merged_kinds
    FROM f GROUP BY kind
)
SELECT kind, template,
       CASE WHEN kind IN (SELECT of_kind FROM muted) THEN 'muted'
            WHEN class_changed THEN 'regressed'
            WHEN coalesce(failure_class, 'unknown') <> 'unknown' THEN 'explained'
            WHEN first_us >= {new_since} THEN 'new'
            WHEN recent_quiet_us >= {int(windows.quiet_us)} THEN 'regressed'
            ELSE 'ongoing' END AS status,
       {ts("first_us")} AS first_seen, {ts("last_us")} AS last_seen, failures, instances, hosts, gpu_models,
       example_failure_ids, failure_class, first_us, last_us, {ts("first_us")} AS first_at, {ts("last_us")} AS last_at,
       merged_kinds
FROM k
"""


FAILURE_KINDS = failure_kinds_view()

# Every shared view, the money too (db/money.py). Binding a view costs a few ms and
# the money views nest several deep, so a reader passes only what its statement names
# (``prelude_for``); the pages' queries pass VIEWS, which they all use.
ALL_VIEWS: tuple[str, ...] = VIEWS + MONEY_VIEWS + (INSTANCE_TRUST, FAILURE_KINDS)
ALL_VIEW_NAMES: tuple[str, ...] = VIEW_NAMES + MONEY_VIEW_NAMES + ("instance_trust", "failure_kinds")


def _named(name: str, text: str) -> bool:
    return re.search(rf"(?<![\w.]){re.escape(name)}(?!\w)", text, re.IGNORECASE) is not None


# For each view, the other views its statement reads.
_DEPENDS: dict[str, tuple[str, ...]] = {
    name: tuple(other for other in ALL_VIEW_NAMES if other != name and _named(other, stmt.split(" AS", 1)[1]))
    for name, stmt in zip(ALL_VIEW_NAMES, ALL_VIEWS, strict=True)
}


def prelude_for(sql: str, windows: KindWindows | None = None) -> tuple[str, ...]:
    """The view statements ``sql`` needs: the views it names and those they read, in definition order
    (``windows``: the failure kinds' status windows, the reader's settings; the defaults when None)."""
    wanted = {n for n in ALL_VIEW_NAMES if _named(n, sql)}
    todo = list(wanted)
    while todo:
        for dep in _DEPENDS[todo.pop()]:
            if dep not in wanted:
                wanted.add(dep)
                todo.append(dep)
    return tuple(_with(windows, stmt) for name, stmt in zip(ALL_VIEW_NAMES, ALL_VIEWS, strict=True) if name in wanted)


def _with(windows: KindWindows | None, stmt: str) -> str:
    """``stmt``, or the failure_kinds view built for ``windows`` when ``stmt`` is that view and they are given."""
    return failure_kinds_view(windows) if windows is not None and stmt is FAILURE_KINDS else stmt


_TEMP = "CREATE OR REPLACE TEMP VIEW "


def stored_views(windows: KindWindows | None = None) -> tuple[str, ...]:
    """Every shared view as a ``CREATE OR REPLACE VIEW`` statement, for the materializer to keep in the file.

    Readers still run theirs (temp views shadow stored ones), so a file written before
    the views were stored, or by an older materializer, reads the same.
    """
    out = []
    for stmt in ALL_VIEWS:
        body = _with(windows, stmt).strip()
        if not body.startswith(_TEMP):
            raise ValueError(f"not a temp view: {body[:60]!r}")
        out.append("CREATE OR REPLACE VIEW " + body[len(_TEMP) :])
    return tuple(out)
