"""Retention by value: what the database keeps as it ages (``FLIGHTREC_KEEP_*``), enforced in small steps.

What goes and what stays (docs/retention.md):

- log lines expire ``lines_days`` after Kafka received their batch (the broker's clock, ``events_seen.recv_us``;
  the instance's own ``ts_us`` where a topic stamps CreateTime), **except the context of a failure**: every line
  of a failed stage (its ``failures`` row) and the lines of that boot in the ``context_minutes`` before the stage
  began, and the last ``context_minutes`` of every boot that never completed (lost, unsealed); that context is
  kept ``failures_days`` after its boot last spoke, or forever;
- throughput samples older than ``samples_days`` are merged into one row per stage and hour (proofs and seconds
  summed, the rate recomputed from them); benchmark results are kept;
- everything else is kept: instances, boots, failures (with their tails and last lines), exits, lifecycle,
  facts, manager events, heartbeats, dead letters and ``events_seen`` (the ledger completeness is proved from).

A step judges the log events received in one slice of time (at most ``max_events`` of them, oldest first) and
records how far it got in ``retention_marks``, in the caller's transaction: a step cut short leaves nothing
half done, and the next one starts where the last committed one ended. The same statements run on a file and on
a lake (on a lake the deleted rows leave the Parquet files at the next maintenance: ``db/lake.py``).
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.compute as pc
from flightrec.db.arrowviews import arrow_views
from flightrec.db.keep import DAY_US, Keep

MINUTE_US = 60_000_000
NEVER = -(2**62)  # the mark before any event
# A line belongs to its batch's time: the agent stamps a LogBatch after its lines (within its 0.1 s window; a
# spooled batch keeps its stamp). Lines further than this from their batch's ts_us are not looked for by a step
# (the bound lets DuckDB skip row groups by their ts_us range): such lines, which no agent writes, are kept.
LINE_SLACK_US = 3_600_000_000
MARKS_DDL = "CREATE TABLE IF NOT EXISTS retention_marks (what VARCHAR, until_us BIGINT, updated_us BIGINT)"


@dataclass(frozen=True)
class StepResult:
    """What one step did; ``done``: nothing is left to judge before the cutoffs (the next step may wait)."""

    lines_deleted: int = 0
    samples_merged: int = 0
    events_judged: int = 0
    done: bool = True

    def __add__(self, other: StepResult) -> StepResult:
        return StepResult(
            self.lines_deleted + other.lines_deleted,
            self.samples_merged + other.samples_merged,
            self.events_judged + other.events_judged,
            self.done and other.done,
        )


def _cutoff(now_us: int, days: float | None) -> int | None:
    return None if days is None else now_us - int(days * DAY_US)


def mark(con: duckdb.DuckDBPyConnection, what: str) -> int | None:
    """How far retention got for ``what`` (events received before it were judged); None: never ran."""
    try:
        row = con.execute("SELECT max(until_us) FROM retention_marks WHERE what = ?", [what]).fetchone()
    except duckdb.CatalogException:
        return None
    return None if row is None or row[0] is None else int(row[0])


def _ensure_marks(con: duckdb.DuckDBPyConnection) -> None:
    """``retention_marks``, made by the first step (a DDL only then: on a lake each one is a new snapshot)."""
    made = con.execute(
        "SELECT count(*) FROM duckdb_tables() WHERE table_name = 'retention_marks' "
        "AND database_name = current_database() AND schema_name = current_schema()"
    ).fetchall()[0][0]  # asked of the catalog: a failed statement would abort the caller's transaction
    if not made:
        con.execute(MARKS_DDL)


def _set_mark(con: duckdb.DuckDBPyConnection, what: str, until_us: int, now_us: int) -> None:
    con.execute("DELETE FROM retention_marks WHERE what = ?", [what])
    con.execute("INSERT INTO retention_marks VALUES (?, ?, ?)", [what, until_us, now_us])


# The context of every failure still kept: its failed stage whole, and the boot's lines from context_minutes
# before the stage's first lifecycle event to the failure; the last context_minutes of every boot that did not
# complete. Each kept failures_days after its boot last spoke (the broker's clock where known).
KEPT_STAGES_SQL = """
SELECT DISTINCT f.instance_id, f.boot_id, f.stage FROM failures f LEFT JOIN boots b USING (instance_id, boot_id)
WHERE coalesce(b.last_recv_us, b.last_event_us, f.ts_us) >= $since"""
KEPT_WINDOWS_SQL = """
WITH starts AS (
    SELECT instance_id, boot_id, stage, min(ts_us) AS started_us
    FROM lifecycle_events SEMI JOIN failures USING (instance_id, boot_id, stage) GROUP BY ALL)
SELECT f.instance_id, f.boot_id, coalesce(s.started_us, f.ts_us) - $before AS from_us, f.ts_us AS to_us
FROM failures f LEFT JOIN starts s USING (instance_id, boot_id, stage) LEFT JOIN boots b USING (instance_id, boot_id)
WHERE coalesce(b.last_recv_us, b.last_event_us, f.ts_us) >= $since
UNION ALL
SELECT instance_id, boot_id, last_event_us - $before, last_event_us FROM boots
WHERE NOT coalesce(complete, false) AND coalesce(last_recv_us, last_event_us) >= $since"""

# A step judges log events by one clock at a time, as a range of that column alone, so that DuckDB reads only the row
# groups of events_seen whose range overlaps the slice (rows lie in commit order, close to receive order): the events
# Kafka stamped with its own time by ``recv_us`` (mark ``lines``), those of CreateTime topics by their ``ts_us``
# (mark ``lines-createtime``).
CLOCKS: tuple[tuple[str, str], ...] = (("lines", "recv_us"), ("lines-createtime", "ts_us"))
IN_CLOCK = {"recv_us": "recv_us IS NOT NULL", "ts_us": "recv_us IS NULL"}
EXPIRE_SQL = """
DELETE FROM log_lines l
WHERE l.ts_us BETWEEN $ts_lo AND $ts_hi
  AND l.event_id IN (SELECT event_id FROM _expiring)
  AND NOT EXISTS (SELECT 1 FROM _keep_stages k
                  WHERE k.instance_id = l.instance_id AND k.boot_id = l.boot_id AND k.stage = l.stage)
  AND NOT EXISTS (SELECT 1 FROM _keep_windows w
                  WHERE w.instance_id = l.instance_id AND w.boot_id = l.boot_id
                    AND l.ts_us BETWEEN w.from_us AND w.to_us)
"""


def _slice(
    con: duckdb.DuckDBPyConnection, clock: str, lo: int, cutoff: int, max_events: int
) -> tuple[int, pa.Table, bool]:
    """The next slice of about ``max_events`` log events whose ``clock`` lies in [lo, cutoff): (its end, inclusive;
    their event_id and ts_us; whether it reaches the cutoff)."""
    where = f"{clock} >= $lo AND {clock} < $cutoff AND kind = 'log' AND {IN_CLOCK[clock]}"
    row = con.execute(
        f"SELECT {clock} FROM events_seen WHERE {where} ORDER BY {clock} LIMIT 1 OFFSET $skip",
        {"lo": lo, "cutoff": cutoff, "skip": max_events - 1},
    ).fetchone()
    hi, last = (int(row[0]), False) if row else (cutoff - 1, True)
    events = con.execute(
        f"SELECT event_id, ts_us FROM events_seen WHERE {where}", {"lo": lo, "cutoff": hi + 1}
    ).to_arrow_table()
    return hi, events, last


def kept_context(
    con: duckdb.DuckDBPyConnection, keep: Keep, now_us: int
) -> tuple[pa.Table, pa.Table]:  # (stages, windows)
    """The failures' context still kept: the failed stages, and the windows of time of each boot."""
    since = _cutoff(now_us, keep.failures_days)
    params = {"since": NEVER if since is None else since}
    stages = con.execute(KEPT_STAGES_SQL, params).to_arrow_table()
    windows = con.execute(
        KEPT_WINDOWS_SQL, {**params, "before": int(keep.context_minutes * MINUTE_US)}
    ).to_arrow_table()
    return stages, windows


def _near(windows: pa.Table, lo: int, hi: int) -> pa.Table:
    """The windows that overlap [lo, hi] (a step's lines lie there): the anti-join checks those only."""
    if not windows.num_rows:
        return windows
    return windows.filter(pc.and_(pc.greater_equal(windows["to_us"], lo), pc.less_equal(windows["from_us"], hi)))


def expire_lines(
    con: duckdb.DuckDBPyConnection,
    keep: Keep,
    now_us: int,
    max_events: int,
    context: tuple[pa.Table, pa.Table] | None = None,
) -> StepResult:
    """Delete the expired lines of the next slice of log events (by each clock) and move the marks past it, in the
    caller's transaction; the failures' context (``kept_context``, read here when not given) stays."""
    cutoff = _cutoff(now_us, keep.lines_days)
    if cutoff is None:
        return StepResult()
    _ensure_marks(con)
    total = StepResult()
    for what, clock in CLOCKS:
        lo = mark(con, what)
        lo = NEVER if lo is None else lo
        if lo >= cutoff:
            continue
        hi, events, last = _slice(con, clock, lo, cutoff, max(1, max_events))
        deleted = 0
        if events.num_rows:
            ts_lo = int(pc.min(events["ts_us"]).as_py()) - LINE_SLACK_US
            ts_hi = int(pc.max(events["ts_us"]).as_py()) + LINE_SLACK_US
            stages, windows = kept_context(con, keep, now_us) if context is None else (context)
            context = (stages, windows)
            near = _near(windows, ts_lo, ts_hi)
            with arrow_views(con, _expiring=events.select(["event_id"]), _keep_stages=stages, _keep_windows=near):
                deleted = int(con.execute(EXPIRE_SQL, {"ts_lo": ts_lo, "ts_hi": ts_hi}).fetchall()[0][0])
        _set_mark(con, what, hi + 1, now_us)
        total += StepResult(lines_deleted=deleted, events_judged=events.num_rows, done=last)
    return total


GONE_BOOTS_SQL = """
SELECT instance_id, boot_id, coalesce(last_recv_us, last_event_us) AS at_us FROM boots
WHERE coalesce(last_recv_us, last_event_us) >= $lo AND coalesce(last_recv_us, last_event_us) < $cutoff
ORDER BY at_us LIMIT $n"""
EXPIRE_CONTEXT_SQL = """
DELETE FROM log_lines l
WHERE EXISTS (SELECT 1 FROM _gone_boots g WHERE g.instance_id = l.instance_id AND g.boot_id = l.boot_id)
  AND l.event_id IN (SELECT event_id FROM events_seen SEMI JOIN _gone_boots USING (instance_id, boot_id)
                     WHERE kind = 'log' AND (recv_us < $judged OR (recv_us IS NULL AND ts_us < $judged_ts)))"""


def expire_context(con: duckdb.DuckDBPyConnection, keep: Keep, now_us: int, max_boots: int) -> StepResult:
    """Delete what is left of the boots that last spoke ``failures_days`` ago (at least ``lines_days``): their
    lines a step judged already (received before the lines' mark) were kept as a failure's context."""
    lines_cut = _cutoff(now_us, keep.lines_days)
    days = keep.failures_days
    if lines_cut is None or days is None:
        return StepResult()
    cutoff = min(lines_cut, now_us - int(days * DAY_US))
    _ensure_marks(con)
    lo, judged, judged_ts = mark(con, "context"), mark(con, "lines"), mark(con, "lines-createtime")
    lo = NEVER if lo is None else lo
    if judged is None or lo >= cutoff:
        return StepResult()
    boots = con.execute(GONE_BOOTS_SQL, {"lo": lo, "cutoff": cutoff, "n": max_boots}).to_arrow_table()
    full = boots.num_rows >= max_boots
    hi = int(pc.max(boots["at_us"]).as_py()) if full else cutoff - 1
    if full:  # every boot of the last instant, so that the mark passes them all
        boots = con.execute(GONE_BOOTS_SQL, {"lo": lo, "cutoff": hi + 1, "n": 2**62}).to_arrow_table()
    deleted = 0
    if boots.num_rows:
        with arrow_views(con, _gone_boots=boots.select(["instance_id", "boot_id"])):
            judged_by = {"judged": judged, "judged_ts": NEVER if judged_ts is None else judged_ts}
            deleted = int(con.execute(EXPIRE_CONTEXT_SQL, judged_by).fetchall()[0][0])
    _set_mark(con, "context", hi + 1, now_us)
    return StepResult(lines_deleted=deleted, done=not full)


SAMPLE_BUCKETS_SQL = """
SELECT arg_max(event_id, (ts_us, event_id)) AS event_id, list(event_id) AS ids,
       CAST(sum(proofs) AS INTEGER) AS proofs, sum(seconds) AS seconds
FROM throughput WHERE kind = 'sample' AND ts_us < $cutoff
GROUP BY instance_id, boot_id, stage, phase, backend, device, ts_us // $bucket HAVING count(*) > 1
ORDER BY min(ts_us) LIMIT $n"""


def downsample_samples(con: duckdb.DuckDBPyConnection, keep: Keep, now_us: int, max_buckets: int) -> StepResult:
    """Merge the throughput samples older than ``samples_days`` into one row per stage and hour: the latest sample
    of the hour stays, with the hour's proofs and seconds summed and its rate recomputed from them."""
    cutoff = _cutoff(now_us, keep.samples_days)
    if cutoff is None:
        return StepResult()
    buckets = con.execute(
        SAMPLE_BUCKETS_SQL, {"cutoff": cutoff, "bucket": keep.sample_bucket_s * 1_000_000, "n": max_buckets}
    ).to_arrow_table()
    if not buckets.num_rows:
        return StepResult()
    kept = set(buckets.column("event_id").to_pylist())
    gone = [i for ids in buckets.column("ids").to_pylist() for i in ids if i not in kept]
    merged = buckets.select(["event_id", "proofs", "seconds"])
    with arrow_views(con, _gone=pa.table({"event_id": pa.array(gone, pa.string())}), _merged=merged):
        con.execute("DELETE FROM throughput WHERE event_id IN (SELECT event_id FROM _gone)")
        con.execute("""UPDATE throughput SET proofs = m.proofs, seconds = m.seconds,
                              proofs_per_hour = CASE WHEN m.seconds > 0 THEN m.proofs * 3600.0 / m.seconds END
                       FROM _merged m WHERE throughput.event_id = m.event_id""")
    return StepResult(samples_merged=len(gone), done=buckets.num_rows < max_buckets)


def step(
    con: duckdb.DuckDBPyConnection,
    keep: Keep,
    now_us: int | None = None,
    max_events: int = 2000,
    max_buckets: int = 500,
    context: tuple[pa.Table, pa.Table] | None = None,
) -> StepResult:
    """One small step of retention (inside the caller's transaction): the next slice of log lines, then the next
    throughput samples to merge."""
    now_us = time.time_ns() // 1000 if now_us is None else now_us
    lines = expire_lines(con, keep, now_us, max_events, context)
    gone = expire_context(con, keep, now_us, max_buckets)
    return lines + gone + downsample_samples(con, keep, now_us, max_buckets)


def run_step(con: duckdb.DuckDBPyConnection, keep: Keep, **kwargs: Any) -> StepResult:
    """:func:`step` in a transaction of its own (a file's writer); nothing of it stays when it fails."""
    con.execute("BEGIN TRANSACTION")
    try:
        result = step(con, keep, **kwargs)
        con.execute("COMMIT")
    except BaseException:
        with contextlib.suppress(duckdb.Error):
            con.execute("ROLLBACK")
        raise
    return result


def oldest_line_us(con: duckdb.DuckDBPyConnection) -> int | None:
    """The oldest kept line's time (its ts_us, the instance's clock), None without lines."""
    row = con.execute("SELECT min(ts_us) FROM log_lines").fetchone()
    return None if row is None or row[0] is None else int(row[0])
