"""Historical alerts: what Kafka received long before the materializer first saw it is recorded, not posted.

A new database built from old topics, or a materializer restarted after hours, finds failures, incomplete boots and
silences that are history: each alertable row whose evidence Kafka appended more than ``max_age`` seconds before
the materializer first saw it (``FLIGHTREC_ALERT_MAX_AGE``) goes into the outbox as not to be sent
(``sent_us`` = 0, ``outcome`` = 'historical', the age in ``error``). When a row "happened" is:

- a failure or an incomplete boot: the newest append time of its boot's events (``boots.last_recv_us``: one
  row per boot, no scan of the events);
- a lost instance: when its silence passed the `lost` limit (its last sign plus LOST_AFTER_INTERVALS intervals);
- a new or regressed failure kind: the newest append time over the boots of all its failures (history only when
  all of its evidence is).

Rows without any receive time (CreateTime topics) are not judged: they alert as before. Refused events carry no
append time in dead_letters and are not judged here either.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import duckdb
import pyarrow as pa
from flightrec.schemas import LOST_AFTER_INTERVALS

OUTCOME = "historical"

# The newest append time of the boot of each row among _failed_keys.
_BOOT_APPENDED = """
SELECT k.alert_id, b.last_recv_us AS appended_us
FROM _failed_keys k JOIN boots b ON b.instance_id = k.instance_id AND b.boot_id = k.boot_id"""


# The newest append time over every failure of each kind among _kind_keys (a kind's alert is history when all of its
# evidence is).
_KIND_APPENDED = """
SELECT k.alert_id, max(b.last_recv_us) AS appended_us
FROM _kind_keys k JOIN failures f ON f.kind = k.kind
JOIN boots b ON b.instance_id = f.instance_id AND b.boot_id = f.boot_id
GROUP BY k.alert_id"""


def _kinds_appended(con: duckdb.DuckDBPyConnection, rows: list[dict[str, Any]]) -> dict[str, int]:
    chosen = [r for r in rows if r["kind"] == "failure_kind"]
    if not chosen:
        return {}
    keys = pa.table(
        {
            "alert_id": pa.array([str(r["failure_id"]) for r in chosen], pa.string()),
            "kind": pa.array([str(r["failure_kind"]) for r in chosen], pa.string()),
        }
    )
    con.register("_kind_keys", keys)
    try:
        return {a: int(t) for a, t in con.execute(_KIND_APPENDED).fetchall() if t is not None}
    finally:
        con.unregister("_kind_keys")


def _keys(rows: Iterable[Mapping[str, Any]]) -> pa.Table:
    rows = list(rows)
    return pa.table(
        {
            "alert_id": pa.array([str(r["failure_id"]) for r in rows], pa.string()),
            "instance_id": pa.array([r["instance_id"] for r in rows], pa.string()),
            "boot_id": pa.array([r.get("boot_id") for r in rows], pa.string()),
            "stage": pa.array([r.get("stage") for r in rows], pa.string()),
        }
    )


def appended(con: duckdb.DuckDBPyConnection, rows: list[dict[str, Any]]) -> dict[str, int]:
    """When Kafka appended the evidence of each alertable row (alert id -> µs), where it says."""
    out: dict[str, int] = {}
    chosen = [r for r in rows if r["kind"] in ("failed", "below_min_rate", "incomplete")]
    if chosen:
        con.register("_failed_keys", _keys(chosen))
        try:
            out.update({a: int(t) for a, t in con.execute(_BOOT_APPENDED).fetchall() if t is not None})
        finally:
            con.unregister("_failed_keys")
    out.update(_kinds_appended(con, rows))
    for r in rows:
        if r["kind"] == "lost" and r.get("liveness_clock", "receiver") == "receiver":
            interval = r.get("heartbeat_interval_s") or 0
            if r.get("last_sign_us") is not None and interval:
                out[str(r["failure_id"])] = int(r["last_sign_us"] + LOST_AFTER_INTERVALS * interval * 1e6)
    return out


def historical(
    con: duckdb.DuckDBPyConnection, rows: list[dict[str, Any]], now_us: int, max_age_s: float
) -> dict[str, str]:
    """The rows (alert id -> why) whose evidence is older than ``max_age_s`` at first sight: recorded, not sent."""
    if max_age_s <= 0 or not rows:
        return {}
    out = {}
    for alert_id, when_us in appended(con, rows).items():
        age = (now_us - when_us) / 1e6
        if age > max_age_s:
            out[alert_id] = (
                f"historical: Kafka received it {age:.0f} s before the materializer first saw it (more than "
                f"FLIGHTREC_ALERT_MAX_AGE={max_age_s:g} s); recorded, not sent"
            )
    return out


def mark(con: duckdb.DuckDBPyConnection, why: Mapping[str, str]) -> None:
    """Say in the outbox why these rows (recorded with sent_us = 0) were not sent."""
    if not why:
        return
    con.register(
        "_historical",
        pa.table({"alert_id": pa.array(list(why), pa.string()), "why": pa.array(list(why.values()), pa.string())}),
    )
    try:
        con.execute(
            f"""UPDATE alerts SET outcome = '{OUTCOME}', error = h.why FROM _historical h
                WHERE alerts.alert_id = h.alert_id AND alerts.sent_us = 0 AND alerts.outcome IS NULL"""
        )
    finally:
        con.unregister("_historical")
