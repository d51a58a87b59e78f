"""The money views: what instances cost, what failures cost, and which offers to avoid (with a paste-able filter)."""

from __future__ import annotations

from flightrec.db.avoid import AVOID_RATE, MIN_INSTANCES, because_sql, wilson_sql
from flightrec.db.classify import deterministic_classes, load_rules

# Where the price comes from: the latest `rented` manager event's `price_per_hour` attribute
# (`flightrec manager event --instance ID --kind rented --attr price_per_hour=1.85`: the
# controller knows what it pays), else the instance facts' `price_per_hour` (FLIGHTREC_FACTS).
# A provider's host id comes from the same event's `host_id` attribute, else the facts' host.
#
# Paid time: from the first `rented` event or the instance's first event, whichever came first, to the first
# `destroyed`/`released` event, else to the last event when the boot is sealed, else to now (running, or lost: a machine
# we cannot hear is still billed until it is destroyed). Hours paid before a failure run from the same start to the
# failure. An instance counts once per breakdown: its cost up to its *first* failure is "lost" and that failure's class
# takes it.

INSTANCE_COST = """
CREATE OR REPLACE TEMP VIEW instance_cost AS
WITH mg AS (
    SELECT instance_id,
           min(ts_us) FILTER (WHERE kind = 'rented') AS rented_us,
           arg_max(TRY_CAST(attributes['price_per_hour'] AS DOUBLE), ts_us)
               FILTER (WHERE kind = 'rented' AND TRY_CAST(attributes['price_per_hour'] AS DOUBLE) IS NOT NULL)
               AS rented_price,
           arg_max(attributes['host_id'], ts_us)
               FILTER (WHERE kind = 'rented' AND coalesce(attributes['host_id'], '') <> '') AS host_id,
           min(ts_us) FILTER (WHERE kind IN ('destroyed', 'released')) AS gone_us
    FROM manager_events GROUP BY instance_id),
ff AS (
    SELECT instance_id, arg_min(failure_class, (ts_us, failure_id)) AS first_failure_class,
           min(ts_us) AS first_failure_us, count(*) AS failures,
           list_sort(list(DISTINCT coalesce(failure_class, 'unclassified'))) AS all_failure_classes
    FROM failures GROUP BY instance_id),
im AS (
    SELECT instance_id, arg_max(image, ts_us) FILTER (WHERE coalesce(image, '') <> '') AS image
    FROM instance_facts GROUP BY instance_id),
c AS (
    SELECT i.instance_id, nullif(i.gpu_model, '') AS gpu_model, nullif(i.host, '') AS host,
           coalesce(mg.host_id, nullif(i.host, '')) AS host_id, nullif(i.driver_version, '') AS driver_version,
           coalesce(mg.rented_price, i.price_per_hour) AS price_per_hour,
           CASE WHEN mg.rented_price IS NOT NULL THEN 'manager' WHEN i.price_per_hour IS NOT NULL THEN 'facts' END
               AS price_source,
           least(mg.rented_us, i.first_event_us) AS rented_us,  -- least() skips a NULL
           CASE WHEN mg.gone_us IS NOT NULL THEN mg.gone_us
                WHEN i.sealed THEN i.last_event_us
                ELSE epoch_us(now()) END AS ended_us,
           mg.gone_us IS NULL AND NOT i.sealed AS still_paid,
           ff.first_failure_class AS failure_class, ff.first_failure_us, coalesce(ff.failures, 0) AS failures,
           coalesce(ff.all_failure_classes, []::VARCHAR[]) AS all_failure_classes, im.image
    FROM instances i
    LEFT JOIN mg USING (instance_id)
    LEFT JOIN ff USING (instance_id)
    LEFT JOIN im USING (instance_id))
SELECT instance_id, gpu_model, host, host_id, driver_version, image, price_per_hour, price_source, failure_class,
       all_failure_classes, failures, failures > 0 AS failed, still_paid,
       rented_us, make_timestamptz(rented_us) AS rented_at, ended_us, make_timestamptz(ended_us) AS ended_at,
       first_failure_us, make_timestamptz(first_failure_us) AS first_failure_at,
       greatest(ended_us - rented_us, 0) / 3600e6 AS hours_paid,
       price_per_hour * greatest(ended_us - rented_us, 0) / 3600e6 AS dollars_paid,
       CASE WHEN first_failure_us IS NOT NULL THEN greatest(first_failure_us - rented_us, 0) / 3600e6 END
           AS hours_before_failure,
       CASE WHEN first_failure_us IS NOT NULL THEN price_per_hour * greatest(first_failure_us - rented_us, 0) / 3600e6
       END AS dollars_lost
FROM c
"""

# One row per failure: the hours and dollars paid for its instance before it happened.
FAILURE_COST = """
CREATE OR REPLACE TEMP VIEW failure_cost AS
SELECT f.failure_id, f.instance_id, f.boot_id, f.stage, coalesce(f.failure_class, 'unclassified') AS failure_class,
       f.hint, coalesce(f.gpu_model, c.gpu_model) AS gpu_model, c.host, c.host_id,
       coalesce(f.driver_version, c.driver_version) AS driver_version, c.price_per_hour, c.price_source,
       c.rented_us, c.rented_at, f.ts_us AS failed_us, make_timestamptz(f.ts_us) AS failed_at,
       greatest(f.ts_us - c.rented_us, 0) / 3600e6 AS hours_before_failure,
       c.price_per_hour * greatest(f.ts_us - c.rented_us, 0) / 3600e6 AS dollars_before_failure,
       row_number() OVER (PARTITION BY f.instance_id ORDER BY f.ts_us, f.failure_id) = 1 AS first_of_instance
FROM failures f LEFT JOIN instance_cost c USING (instance_id)
"""

# Dollars lost per failure class: each failed instance once, under the class of its first failure.
COST_BY_CLASS = """
CREATE OR REPLACE TEMP VIEW cost_by_class AS
SELECT failure_class, count(*) AS instances, sum(hours_before_failure) AS hours_lost,
       sum(dollars_before_failure) AS dollars_lost,
       (SELECT count(*) FROM failure_cost a WHERE a.failure_class = f.failure_class) AS failures
FROM failure_cost f WHERE first_of_instance
GROUP BY failure_class
ORDER BY dollars_lost DESC NULLS LAST, instances DESC
"""

# Per GPU model, host, driver version and image: how many failed, what was paid and what was lost, and how many
# failed with a class deterministic for that dimension (db/rules.toml's `deterministic`).
_DETERMINISTIC = deterministic_classes(load_rules())


def _det(dimension: str) -> str:
    """SQL: the instance's failure classes that are deterministic for ``dimension``."""
    classes = ", ".join("'" + c.replace("'", "''") + "'" for c in _DETERMINISTIC.get(dimension, ()))
    return f"list_filter(all_failure_classes, c -> list_contains([{classes}]::VARCHAR[], c))"


COST_BREAKDOWN = f"""
CREATE OR REPLACE TEMP VIEW cost_breakdown AS
WITH d AS (
    SELECT 'gpu_model' AS dimension, gpu_model AS value, {_det("gpu_model")} AS det, * FROM instance_cost
    UNION ALL SELECT 'host', host_id, {_det("host")}, * FROM instance_cost
    UNION ALL SELECT 'driver_version', driver_version, {_det("driver_version")}, * FROM instance_cost
    UNION ALL SELECT 'image', image, {_det("image")}, * FROM instance_cost)
SELECT dimension, value, count(*) AS instances, count(*) FILTER (WHERE failed) AS failed_instances,
       count(*) FILTER (WHERE failed) / count(*) AS failure_rate,
       sum(hours_paid) AS hours_paid, sum(dollars_paid) AS dollars_paid,
       coalesce(sum(dollars_lost) FILTER (WHERE failed), 0) AS dollars_lost,
       string_agg(DISTINCT failure_class, ', ' ORDER BY failure_class) FILTER (WHERE failed) AS failure_classes,
       count(*) FILTER (WHERE len(det) > 0) AS deterministic_failed,
       array_to_string(list_sort(list_distinct(flatten(list(det)))), ', ') AS deterministic_classes
FROM d WHERE value IS NOT NULL
GROUP BY dimension, value
"""

COST_BY_GPU = """
CREATE OR REPLACE TEMP VIEW cost_by_gpu AS
SELECT value AS gpu_model, * EXCLUDE (dimension, value) FROM cost_breakdown WHERE dimension = 'gpu_model'
ORDER BY dollars_lost DESC, failure_rate DESC
"""

COST_BY_HOST = """
CREATE OR REPLACE TEMP VIEW cost_by_host AS
SELECT value AS host, * EXCLUDE (dimension, value) FROM cost_breakdown WHERE dimension = 'host'
ORDER BY dollars_lost DESC, failure_rate DESC
"""

# vast.ai's offer search syntax (`vastai search offers '<query>'`): `field op value`, joined by
# spaces; `gpu_name` writes spaces as underscores and drops nvidia-smi's "NVIDIA "/"GeForce ".
AVOID_TOP = 10  # at most this many of each kind, those that lost the most, go into the filter (it stays paste-able)


def vast_value(dimension_expr: str, value_expr: str) -> str:
    """SQL: the value as vast.ai's query syntax writes it for that dimension."""
    return (
        f"CASE {dimension_expr} WHEN 'gpu_model' THEN replace(regexp_replace({value_expr}, "
        f"'^NVIDIA\\s+(GeForce\\s+)?', ''), ' ', '_') ELSE replace({value_expr}, ' ', '_') END"
    )


def vast_field(dimension_expr: str) -> str:
    """SQL: vast.ai's field name for a breakdown dimension (NULL for an image: the offer does not choose it)."""
    return (
        f"CASE {dimension_expr} WHEN 'gpu_model' THEN 'gpu_name' WHEN 'host' THEN 'host_id' "
        "WHEN 'driver_version' THEN 'driver_version' END"
    )


def _pct(expr: str) -> str:
    return f"round(100 * ({expr}))::INTEGER"


# Every GPU model, host, driver and image with a failure, judged by db/avoid.py's rule (`because`, `banned`),
# with the Wilson interval of its failure rate and a sentence saying why it is or is not banned.
AVOID_LIST = f"""
CREATE OR REPLACE TEMP VIEW avoid_list AS
WITH w AS (
    SELECT *, {wilson_sql("failed_instances", "instances", -1)} AS rate_low,
           {wilson_sql("failed_instances", "instances", 1)} AS rate_high
    FROM cost_breakdown WHERE failed_instances > 0),
j AS (
    SELECT *, {because_sql("instances", "failed_instances", "deterministic_failed", "rate_low")} AS because,
           printf('%d of %d failed (95 %% interval %d–%d %%)', failed_instances, instances,
                  {_pct("rate_low")}, {_pct("rate_high")}) AS counted
    FROM w),
b AS (SELECT *, because IN ('deterministic', 'rate') AS banned FROM j)
SELECT row_number() OVER (ORDER BY banned DESC, dollars_lost DESC, failure_rate DESC, failed_instances DESC,
                                   dimension, value) AS rank,
       dimension, value, banned,
       CASE because
           WHEN 'deterministic' THEN printf('%s: %s is deterministic for the %s (%d failed so), one is enough',
                                            counted, deterministic_classes, replace(dimension, '_', ' '),
                                            deterministic_failed)
           WHEN 'rate' THEN
               printf('%s: the rate is at least %d %% with 95 %% confidence (ban at {round(AVOID_RATE * 100)} %%)',
                      counted, {_pct("rate_low")})
           WHEN 'too_few' THEN printf('%s: too few to judge, a ban on a flaky class needs {MIN_INSTANCES} rentals',
                                      counted)
           ELSE printf('%s: the rate may be as low as %d %% (ban at {round(AVOID_RATE * 100)} %%)', counted,
                       {_pct("rate_low")})
       END AS why,
       because, instances, failed_instances, failure_rate, rate_low, rate_high, deterministic_failed,
       deterministic_classes, dollars_lost, dollars_paid, failure_classes,
       banned AND dimension <> 'image'
           AND row_number() OVER (PARTITION BY dimension, banned
                                  ORDER BY dollars_lost DESC, failure_rate DESC, failed_instances DESC, value)
               <= {AVOID_TOP} AS in_filter,
       {vast_field("dimension")} || '!=' || {vast_value("dimension", "value")} AS offer_filter
FROM b
ORDER BY rank
"""

# The whole list as one expression to paste into the provider's search.
AVOID_FILTER = f"""
CREATE OR REPLACE TEMP VIEW avoid_filter AS
WITH a AS (
    SELECT {vast_field("dimension")} AS field, {vast_value("dimension", "value")} AS v, rank
    FROM avoid_list WHERE in_filter),
g AS (SELECT field, CASE WHEN count(*) = 1 THEN field || '!=' || min(v)
                         ELSE field || ' notin [' || string_agg(v, ',' ORDER BY rank) || ']' END AS clause
      FROM a GROUP BY field)
SELECT 'vast.ai' AS syntax,
       coalesce(string_agg(clause, ' ' ORDER BY CASE field WHEN 'gpu_name' THEN 1 WHEN 'host_id' THEN 2 ELSE 3 END),
                '') AS offer_filter,
       (SELECT count(*) FROM a) AS items
FROM g
"""

MONEY_VIEWS: tuple[str, ...] = (
    INSTANCE_COST,
    FAILURE_COST,
    COST_BY_CLASS,
    COST_BREAKDOWN,
    COST_BY_GPU,
    COST_BY_HOST,
    AVOID_LIST,
    AVOID_FILTER,
)
MONEY_VIEW_NAMES: tuple[str, ...] = (
    "instance_cost",
    "failure_cost",
    "cost_by_class",
    "cost_breakdown",
    "cost_by_gpu",
    "cost_by_host",
    "avoid_list",
    "avoid_filter",
)
