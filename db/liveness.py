"""Liveness on the materializer side: the per-boot heartbeat summary (upsert) and heartbeat gaps (pure)."""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import duckdb
import pyarrow as pa
from flightrec.schemas import LOST_AFTER_INTERVALS

log = logging.getLogger(__name__)

# Reads ``_hb`` (the batch's heartbeat rows) and ``_hb_new`` (the event ids stored for the
# first time in this transaction), registered by merge_heartbeats. Each column merges order-independently (a sum,
# a min, a max, the value of the highest seq), so any batching of the same events agrees.
# MERGE INTO on the boot's key, not INSERT ... ON CONFLICT: a DuckLake has no keys, and one statement serves both.
MERGE_SQL = """
MERGE INTO heartbeats h USING (
    SELECT instance_id, boot_id, count(*) AS beats, min(ts_us) AS first_us, max(ts_us) AS last_us,
           max(seq) AS last_seq, arg_max(interval_s, seq) AS interval_s, arg_max(stage, seq) AS stage,
           max(recv_us) AS last_recv_us
    FROM _hb SEMI JOIN _hb_new USING (event_id)
    GROUP BY instance_id, boot_id) s
ON h.instance_id = s.instance_id AND h.boot_id = s.boot_id
WHEN MATCHED THEN UPDATE SET
    beats = h.beats + s.beats,
    first_us = least(h.first_us, s.first_us),
    last_us = greatest(h.last_us, s.last_us),
    last_recv_us = greatest(h.last_recv_us, s.last_recv_us),  -- greatest() skips a NULL
    interval_s = CASE WHEN s.last_seq > h.last_seq THEN s.interval_s ELSE h.interval_s END,
    stage = CASE WHEN s.last_seq > h.last_seq THEN s.stage ELSE h.stage END,
    last_seq = greatest(h.last_seq, s.last_seq)
WHEN NOT MATCHED THEN INSERT BY NAME
"""


RUNNING_SQL = """
WITH ls AS (
    SELECT l.instance_id, l.stage, arg_max(l.state, l.seq) AS last_state
    FROM lifecycle_events l JOIN instances i ON l.instance_id = i.instance_id AND l.boot_id = i.boot_id
    WHERE i.instance_id IN (SELECT instance_id FROM _running_inst) AND l.kind = 'lifecycle' AND l.stage IS NOT NULL
      AND l.state IN ('started', 'succeeded', 'failed', 'skipped')
    GROUP BY ALL)
SELECT i.instance_id, i.boot_id,
       (SELECT string_agg(stage, ', ' ORDER BY stage) FROM ls
        WHERE ls.instance_id = i.instance_id AND ls.last_state = 'started') AS stages
FROM instances i WHERE i.instance_id IN (SELECT instance_id FROM _running_inst)
"""


def running_rows(con: duckdb.DuckDBPyConnection, instances: pa.Table) -> pa.Table:
    """The running_stages rows (the stages in progress of the latest boot) of each instance in ``instances``, read
    after their instances rows are written."""
    con.register("_running_inst", instances)
    try:
        return con.sql(RUNNING_SQL).to_arrow_table()
    finally:
        con.unregister("_running_inst")


def merge_heartbeats(con: duckdb.DuckDBPyConnection, heartbeats: pa.Table, new: pa.Table) -> None:
    """Fold the heartbeats among ``new`` (event ids stored for the first time) into the per-boot summary
    (inside the store's transaction; a DuckDB file or a DuckLake)."""
    con.register("_hb", heartbeats)
    con.register("_hb_new", new)
    try:
        con.execute(MERGE_SQL)
    finally:
        con.unregister("_hb")
        con.unregister("_hb_new")


@dataclass(frozen=True, order=True)
class Gap:
    """A silence of a running stage: no heartbeat from ``since_us`` to ``until_us`` (None: still silent), placed on
    the instance's clock; ``silent_us`` is its length as measured on the receiver's clock (None: by the instance's),
    and for an open gap ``heard_us`` is when the receiver last heard of the boot, if known."""

    since_us: int
    until_us: int | None
    boot_id: str
    stage: str
    interval_s: float
    heard_us: int | None = None
    silent_us: int | None = None

    @property
    def length_us(self) -> int | None:
        """How long the closed gap lasted: on the receiver's clock when known (a jump of the instance's clock makes
        no gap), else on the instance's."""
        if self.silent_us is not None:
            return self.silent_us
        return None if self.until_us is None else self.until_us - self.since_us


def heartbeat_gaps(
    beats: Iterable[Mapping[str, object]],
    intervals: Mapping[str, float],
    now_us: int | None = None,
    sealed_boots: Iterable[str] = (),
    last_event_us: Mapping[str, int] | None = None,
    last_recv_us: Mapping[str, int | None] | None = None,
) -> list[Gap]:
    """Gaps longer than LOST_AFTER_INTERVALS intervals between heartbeats of one stage of one boot.

    ``beats`` are rows with boot_id, seq, ts_us, stage and, where known, recv_us (when Kafka received it: then the
    silence between two beats is measured on that clock, so a jump of the instance's clock makes no gap);
    ``intervals`` the interval per boot.
    With ``now_us`` (the receiver's clock), an unsealed boot silent for longer than that also
    gets an open gap (until_us None): contact lost, as the `lost` status says. Silent since
    when Kafka received its last event (``last_recv_us``, the broker's clock) where known,
    else (topics stamped CreateTime, rows from before) since its last heartbeat or last event
    of any kind (``last_event_us``) on the instance's own clock.
    """
    by_boot: dict[str, list[Mapping[str, object]]] = {}
    for b in beats:
        by_boot.setdefault(str(b["boot_id"]), []).append(b)
    sealed = set(sealed_boots)
    out: list[Gap] = []
    for boot, rows in by_boot.items():
        interval = float(intervals.get(boot) or 0)
        if interval <= 0:
            continue
        limit = LOST_AFTER_INTERVALS * interval * 1e6
        rows.sort(key=lambda r: (int(r["seq"]), int(r["ts_us"])))  # type: ignore[call-overload]  # the rows' values are the table's BIGINTs (typed object)
        for prev, cur in itertools.pairwise(rows):
            p, c = int(prev["ts_us"]), int(cur["ts_us"])  # type: ignore[call-overload]  # the rows' values are the table's BIGINTs (typed object)
            rp, rc = prev.get("recv_us"), cur.get("recv_us")
            silent = None if rp is None or rc is None else int(rc) - int(rp)  # type: ignore[call-overload]  # the rows' values are the table's BIGINTs (typed object)
            if prev["stage"] == cur["stage"] and (c - p if silent is None else silent) > limit:
                out.append(Gap(p, c, boot, str(cur["stage"]), interval, silent_us=silent))
        last = rows[-1]
        since = max(int(last["ts_us"]), int((last_event_us or {}).get(boot) or 0))  # type: ignore[call-overload]  # the rows' values are the table's BIGINTs (typed object)
        heard = (last_recv_us or {}).get(boot)
        if now_us is not None and boot not in sealed and now_us - (since if heard is None else heard) > limit:
            out.append(Gap(since, None, boot, str(last["stage"]), interval, heard))
    return sorted(out)


def ago(seconds: float) -> str:
    """A short human duration: '42 s', '4 min', '3 h', '2 d'."""
    s = max(0, int(seconds))
    if s < 120:
        return f"{s} s"
    if s < 7200:
        return f"{s // 60} min"
    if s < 172800:
        return f"{s // 3600} h"
    return f"{s // 86400} d"
