"""The Cost page's queries over the money views (db/money.py), each one read through flightrec.db.query."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
from flightrec.db.query import run_query
from flightrec.db.views import prelude_for


def _q(db: str | Path, sql: str) -> pa.Table:
    return run_query(db, sql, prelude=prelude_for(sql))  # only the views this query reads


def totals(db: str | Path) -> pa.Table:
    """One row: instances, failed instances, dollars paid, dollars lost before failures, instances with no price."""
    return _q(
        db,
        """
        SELECT count(*) AS instances, count(*) FILTER (WHERE failed) AS failed_instances,
               coalesce(sum(dollars_paid), 0) AS dollars_paid, coalesce(sum(dollars_lost), 0) AS dollars_lost,
               coalesce(sum(hours_before_failure), 0) AS hours_lost,
               count(*) FILTER (WHERE price_per_hour IS NULL) AS unpriced
        FROM instance_cost""",
    )


def by_class(db: str | Path) -> pa.Table:
    """Dollars lost per failure class (each failed instance once)."""
    return _q(db, "SELECT failure_class, instances, failures, hours_lost, dollars_lost FROM cost_by_class")


def by_gpu(db: str | Path) -> pa.Table:
    """Per GPU model: instances, failure rate, dollars paid and lost."""
    return _q(
        db,
        """SELECT gpu_model, instances, failed_instances, failure_rate, dollars_paid, dollars_lost,
                            failure_classes FROM cost_by_gpu""",
    )


def by_host(db: str | Path, limit: int = 200) -> pa.Table:
    """Per host (the provider's host id where the manager gave one): the same, those that lost most first."""
    return _q(
        db,
        f"""SELECT host, instances, failed_instances, failure_rate, dollars_paid, dollars_lost,
                             failure_classes FROM cost_by_host
                      ORDER BY dollars_lost DESC, failure_rate DESC, host LIMIT {int(limit)}""",
    )


def avoid(db: str | Path) -> pa.Table:
    """The ranked avoid list: each item's counts, interval, verdict and why, and its own offer-filter clause."""
    return _q(
        db,
        """SELECT rank, dimension, value, banned, failed_instances, instances, rate_low, rate_high, why,
                  failure_classes, dollars_lost, in_filter, offer_filter FROM avoid_list ORDER BY rank LIMIT 200""",
    )


def offer_filter(db: str | Path) -> pa.Table:
    """One row: the whole filter to paste into the provider's offer search."""
    return _q(db, "SELECT syntax, offer_filter, items FROM avoid_filter")


def failures(db: str | Path, limit: int = 500) -> pa.Table:
    """The latest failures with the hours and dollars paid before each."""
    return _q(
        db,
        f"""SELECT failed_at, instance_id, failure_class, gpu_model, host_id AS host, price_per_hour,
                             hours_before_failure, dollars_before_failure, failure_id
                      FROM failure_cost ORDER BY failed_us DESC LIMIT {int(limit)}""",
    )
