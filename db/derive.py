"""Derived tables (boots, failures, instances) recomputed from the stored events of the affected keys.

Run inside the store's transaction after the new events' rows are in. Each
derived row is a function of the stored event set only (never of arrival
order or wall-clock time), so a replay reproduces it exactly. The keys a batch
touched come in as :class:`AffectedKeys` (:func:`affected_keys`); each step registers
what it reads under its own names (:func:`arrow_views`) and drops them after.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.compute as pc
from flightrec.db.arrowviews import arrow_views
from flightrec.db.classify import RuleTable
from flightrec.db.failures import TAIL_LINES, build_failure
from flightrec.db.fold import BOOL, F64, FILE_TAILS, I32, I64, STR, STRLIST
from flightrec.db.lastlines import LAST_LINES_TYPE, last_lines
from flightrec.db.liveness import running_rows

FAILURES = pa.schema(
    [
        ("failure_id", STR),
        ("instance_id", STR),
        ("boot_id", STR),
        ("stage", STR),
        ("ts_us", I64),
        ("exit_code", I32),
        ("signal", I32),
        ("signal_name", STR),
        ("start_error", STR),
        ("detail", STR),
        ("stderr_tail", STRLIST),
        ("stdout_tail", STRLIST),
        ("file_tails", FILE_TAILS),
        ("preceding_events", STRLIST),
        ("gpu_model", STR),
        ("compute_capability", STR),
        ("driver_version", STR),
        ("cuda_version", STR),
        ("proofs_per_hour", F64),
        ("min_rate", F64),
        ("failure_class", STR),
        ("hint", STR),
        ("matched_line", STR),
        ("killed_by", STR),
        ("killed_by_evidence", STR),
        ("last_lines", LAST_LINES_TYPE),
        ("decisive_line", STR),
        ("decisive_source", STR),
        ("decisive_line_no", I32),
        ("rule_id", STR),
        ("rules_version", STR),
        ("kind", STR),
        ("kind_template", STR),
    ]
)
BOOTS = pa.schema(
    [
        ("instance_id", STR),
        ("boot_id", STR),
        ("events", I64),
        ("max_seq", I64),
        ("sealed_count", I64),
        ("first_event_us", I64),
        ("last_event_us", I64),
        ("complete", BOOL),
        ("incomplete_reason", STR),
        ("dropped_events", I64),
        ("first_recv_us", I64),
        ("last_recv_us", I64),
        ("clock_offset_us", I64),
    ]
)
MAX_RANGES = 5  # missing-seq ranges spelled out in incomplete_reason
# The clock offset of a boot is the median of sent_us - recv_us over its latest OFFSET_EVENTS events that carry a
# send time (by seq, then event id: a function of the event set): when the sender sent each one by the instance's
# clock (its send-time header, schemas/sendtime.py) against when Kafka appended it, so an event that waited in a
# spool while the network was cut says nothing about the clock (its own ts_us is when it happened). The median
# ignores a few sends Kafka took late (a retry) and a few stamped across a clock jump; the latest ones follow a
# clock that was set right during the boot within OFFSET_EVENTS / 2 events. Events sent without the header (older
# agents) give no offset.
OFFSET_EVENTS = 32


class Rewrite:
    """Where derived rows go: the rows of some keys replaced in one table of each name (a file, one shard of a lake).

    The derivation reads the tables by their plain names and writes only through :meth:`replace`, so a store can
    spread the rows over tables of its own (lakestore's rewrite over a commit's shards) and read them back through
    views of the same names."""

    def replace(self, con: duckdb.DuckDBPyConnection, table: str, keys: pa.Table, rows: Sequence[pa.Table]) -> None:
        """Delete the rows of ``table`` matching ``keys`` (every column of it), then insert ``rows``."""
        replace_rows(con, table, keys, rows)


def replace_rows(con: duckdb.DuckDBPyConnection, target: str, keys: pa.Table, rows: Sequence[pa.Table]) -> None:
    """Delete the rows of ``target`` (a table, possibly qualified) matching ``keys`` and insert ``rows``."""
    if keys.num_rows:
        on = " AND ".join(f"t.{c} = k.{c}" for c in keys.column_names)
        with arrow_views(con, _rw_keys=keys):
            con.execute(f"DELETE FROM {target} AS t USING _rw_keys k WHERE {on}")
    for part in rows:
        if part.num_rows:
            with arrow_views(con, _rw_rows=part):
                con.execute(f"INSERT INTO {target} BY NAME SELECT * FROM _rw_rows")


# Kinds of event whose only effect on the derived tables is through their boot's counts (boots, and the
# instances columns taken from the latest boot) and, for log lines, the tails of a failure already shown:
# they never make a stage show a failure, nor change a state, a stage, facts or throughput.
BOOT_ONLY_KINDS: tuple[str, ...] = ("log", "heartbeat", "dropped")


@dataclass(frozen=True)
class AffectedKeys:
    """The keys one batch's new events touch: what the derived tables recompute."""

    boots: pa.Table  # (instance_id, boot_id)
    instances: pa.Table  # (instance_id)
    stages: pa.Table  # (instance_id, boot_id, stage), failure rows' outside dependencies included
    boot_only: pa.Table  # (instance_id) of the instances whose new events are all of BOOT_ONLY_KINDS


def affected_keys(con: duckdb.DuckDBPyConnection, new: pa.Table) -> AffectedKeys:
    """The keys touched by ``new`` (instance_id, boot_id, stage, event_id, kind of each newly stored event).

    A failure row also depends on events outside its stage: new facts touch every failure
    of their instance (a boot without facts of its own shows the instance's latest ones),
    and a new lifecycle event of any stage touches every failure of its boot (it may
    belong in preceding_events). A stage touched only by events of BOOT_ONLY_KINDS is
    recomputed only when it already shows a failure (new lines may change its tails; they
    never make or unmake a failure). Read before the failures are recomputed; the stored
    failures are read once, and only when the batch has events that need them.
    """
    light = ", ".join(f"'{k}'" for k in BOOT_ONLY_KINDS)
    kinds = set(new.column("kind").to_pylist())
    with arrow_views(con, _aff_new=new):
        boots = con.sql("SELECT DISTINCT instance_id, boot_id FROM _aff_new").to_arrow_table()
        instances = con.sql("SELECT DISTINCT instance_id FROM _aff_new").to_arrow_table()
        boot_only = con.sql(f"""SELECT instance_id FROM _aff_new GROUP BY instance_id
                                HAVING bool_and(kind IN ({light}))""").to_arrow_table()
        parts = [
            f"SELECT DISTINCT instance_id, boot_id, stage FROM _aff_new WHERE stage IS NOT NULL "
            f"AND kind NOT IN ({light})"
        ]
        if kinds & {"facts", "lifecycle", *BOOT_ONLY_KINDS}:
            parts += [
                f"""SELECT instance_id, boot_id, stage FROM _aff_fail
                          SEMI JOIN (SELECT instance_id, boot_id, stage FROM _aff_new WHERE kind IN ({light}))
                          USING (instance_id, boot_id, stage)""",
                """SELECT instance_id, boot_id, stage FROM _aff_fail
                         SEMI JOIN (SELECT instance_id FROM _aff_new WHERE kind = 'facts') USING (instance_id)""",
                """SELECT instance_id, boot_id, stage FROM _aff_fail
                         SEMI JOIN (SELECT instance_id, boot_id FROM _aff_new WHERE kind = 'lifecycle')
                         USING (instance_id, boot_id)""",
            ]
            stored = con.sql(
                "SELECT instance_id, boot_id, stage FROM failures SEMI JOIN "
                "(SELECT DISTINCT instance_id FROM _aff_new) USING (instance_id)"
            ).to_arrow_table()
        else:
            stored = pa.table(
                {"instance_id": pa.array([], STR), "boot_id": pa.array([], STR), "stage": pa.array([], STR)}
            )
        with arrow_views(con, _aff_fail=stored):
            stages = con.sql(" UNION ".join(parts)).to_arrow_table()
    return AffectedKeys(boots=boots, instances=instances, stages=stages, boot_only=boot_only)


def _rows(con: duckdb.DuckDBPyConnection, sql: str) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = con.sql(sql).to_arrow_table().to_pylist()
    return rows


def missing_ranges(seqs: list[int], upto: int | None) -> list[tuple[int, int]]:
    """Gaps in sorted distinct ``seqs`` from 0, up to ``upto`` (inclusive) when given."""
    gaps, expect = [], 0
    for s in seqs:
        if upto is not None and s > upto:
            break
        if s > expect:
            gaps.append((expect, s - 1))
        expect = max(expect, s + 1)
    if upto is not None and expect <= upto:
        gaps.append((expect, upto))
    return gaps


def _times(n: int) -> str:
    return "twice" if n == 2 else f"{n} times"


def incomplete_reason(
    sealed_count: int | None,
    gaps: list[tuple[int, int]],
    seal_seq: int | None = None,
    duplicates: Sequence[tuple[int, int]] = (),
    after: int = 0,
) -> str:
    """Why a boot's evidence is not complete, e.g. 'not sealed', 'missing seq 17..19',
    'seal count 0 below seal seq 10', 'seq 4 twice', '3 events after the seal'."""
    parts = []
    if sealed_count is None:
        parts.append("not sealed")
    elif seal_seq is not None and sealed_count <= seal_seq:
        parts.append(f"seal count {sealed_count} below seal seq {seal_seq}")
    if gaps:
        shown = ", ".join(f"{a}" if a == b else f"{a}..{b}" for a, b in gaps[:MAX_RANGES])
        more = f" and {len(gaps) - MAX_RANGES} more ranges" if len(gaps) > MAX_RANGES else ""
        parts.append(f"missing seq {shown}{more}")
    if duplicates:
        shown = ", ".join(f"seq {s} {_times(n)}" for s, n in duplicates[:MAX_RANGES])
        more = (
            f" and {len(duplicates) - MAX_RANGES} more seqs seen more than once" if len(duplicates) > MAX_RANGES else ""
        )
        parts.append(shown + more)
    if after:
        parts.append(f"{after} event{'s' if after != 1 else ''} after the seal")
    return "; ".join(parts) or "incomplete"


def judge_boot(seq_counts: Sequence[tuple[int, int]], seal_seq: int | None, sealed_count: int | None) -> str | None:
    """None when the boot is complete, else why not. Pure.

    ``seq_counts`` holds (seq, distinct events with that seq), sorted by seq. Complete means
    exactly: a seal (the one with the highest seq) whose count covers every seq of the boot,
    its own included (count > seal seq), every seq 0..count-1 present exactly once, and
    nothing at or above the count.
    """
    seqs = [s for s, _ in seq_counts]
    if sealed_count is None:
        upto: int | None = None
    else:
        upto = max(sealed_count - 1, seal_seq if seal_seq is not None else -1)
    gaps = missing_ranges(seqs, upto)
    dups = [(s, n) for s, n in seq_counts if n > 1 and (upto is None or s <= upto)]
    after = 0
    if sealed_count is not None:
        floor = max(sealed_count, (seal_seq if seal_seq is not None else -1) + 1)
        after = sum(n for s, n in seq_counts if s >= floor)
    below = sealed_count is not None and seal_seq is not None and sealed_count <= seal_seq
    if sealed_count is not None and not (gaps or dups or after or below):
        return None
    return incomplete_reason(sealed_count, gaps, seal_seq, dups, after)


def recompute_boots(con: duckdb.DuckDBPyConnection, boots: pa.Table, out: Rewrite | None = None) -> None:
    """Events, seq coverage and completeness (:func:`judge_boot`) of every boot in ``boots``."""
    with arrow_views(con, _aff_boot=boots):
        rows = _boot_rows(con)
    (out or Rewrite()).replace(con, "boots", boots, [pa.Table.from_pylist(rows, schema=BOOTS)])


def _boot_rows(con: duckdb.DuckDBPyConnection) -> list[dict[str, Any]]:
    """The boots rows of ``_aff_boot``: counted in SQL, judged here where the seqs are not exactly 0..n-1."""
    rows = _rows(
        con,
        f"""
        WITH s AS (
            SELECT instance_id, boot_id, arg_max(event_count, seq) AS sealed_count, max(seq) AS seal_seq
            FROM lifecycle_events SEMI JOIN _aff_boot USING (instance_id, boot_id)
            WHERE kind = 'sealed' GROUP BY ALL)
        SELECT e.instance_id, e.boot_id, count(*) AS events, max(e.seq) AS max_seq, min(e.seq) AS min_seq,
               any_value(s.sealed_count) AS sealed_count, any_value(s.seal_seq) AS seal_seq,
               min(e.ts_us) AS first_event_us, max(e.ts_us) AS last_event_us,
               count(DISTINCT e.seq) AS distinct_seq,
               count(*) FILTER (WHERE e.kind = 'dropped') AS dropped_events,
               min(e.recv_us) AS first_recv_us, max(e.recv_us) AS last_recv_us,
               CAST(round(list_median(arg_max(e.sent_us - e.recv_us, (e.seq, e.event_id), {OFFSET_EVENTS})
                                      FILTER (WHERE e.recv_us IS NOT NULL AND e.sent_us IS NOT NULL)))
                    AS BIGINT) AS clock_offset_us
        FROM events_seen e JOIN _aff_boot b USING (instance_id, boot_id)
        LEFT JOIN s USING (instance_id, boot_id)
        GROUP BY ALL ORDER BY e.instance_id, e.boot_id""",
    )
    need_seqs = []
    for r in rows:  # the common cases, judged without reading every seq
        sealed, n = r["sealed_count"], r["events"]
        exact = r["min_seq"] == 0 and r["distinct_seq"] == n and r["max_seq"] == n - 1  # seqs 0..n-1, each once
        if sealed is None and exact:
            r["complete"], r["incomplete_reason"] = False, incomplete_reason(None, [])
        elif sealed is not None and exact and sealed == n and r["seal_seq"] < sealed:
            r["complete"], r["incomplete_reason"] = True, None
        else:
            need_seqs.append((r["instance_id"], r["boot_id"]))
    if need_seqs:
        counts = _seq_counts(con, need_seqs)
        wanted = set(need_seqs)
        for r in rows:
            key = (r["instance_id"], r["boot_id"])
            if key in wanted:
                reason = judge_boot(counts.get(key, []), r["seal_seq"], r["sealed_count"])
                r["complete"], r["incomplete_reason"] = reason is None, reason
    return rows


def _seq_counts(
    con: duckdb.DuckDBPyConnection, boots: list[tuple[str, str]]
) -> dict[tuple[str, str], list[tuple[int, int]]]:
    """(seq, distinct events with that seq) per boot, sorted by seq."""
    counts: dict[tuple[str, str], list[tuple[int, int]]] = defaultdict(list)
    keys = pa.table({"instance_id": [k[0] for k in boots], "boot_id": [k[1] for k in boots]})
    with arrow_views(con, _gap_boots=keys):
        for g in _rows(
            con,
            """SELECT instance_id, boot_id, seq,
                                      -- a LogBatch the deliverer split for the topic's limit: its parts share one
                                      -- seq and carry the original event id before '/part-' (producer/deliver.py)
                                      count(DISTINCT split_part(event_id, '/part-', 1)) AS n
                               FROM events_seen
                               SEMI JOIN _gap_boots USING (instance_id, boot_id) GROUP BY ALL ORDER BY ALL""",
        ):
            counts[(g["instance_id"], g["boot_id"])].append((g["seq"], g["n"]))
    return counts


FAILURE_KEYS_SQL = """
SELECT DISTINCT instance_id, boot_id, stage FROM (
    SELECT instance_id, boot_id, stage FROM lifecycle_events SEMI JOIN _aff_stage USING (instance_id, boot_id, stage)
    WHERE kind = 'lifecycle' AND state = 'failed' AND NOT map_contains(attributes, 'failed_stage')
    UNION ALL
    SELECT instance_id, boot_id, stage FROM process_exits SEMI JOIN _aff_stage USING (instance_id, boot_id, stage)
    WHERE coalesce(exit_code, 0) <> 0 OR signal IS NOT NULL OR coalesce(start_error, '') <> '' OR timed_out
    UNION ALL
    SELECT instance_id, boot_id, stage FROM throughput SEMI JOIN _aff_stage USING (instance_id, boot_id, stage)
    WHERE kind = 'result' AND verdict IN ('fail', 'error'))
ORDER BY ALL"""

# The last TAIL_LINES lines per source of each failed stage in _fail_keys; {where} narrows the lines.
_TAILS_SQL = """
SELECT instance_id, boot_id, stage, source, text FROM (
    SELECT l.*, row_number() OVER (PARTITION BY instance_id, boot_id, stage, source
                                   ORDER BY seq DESC, line_no DESC) AS rn
    FROM log_lines l SEMI JOIN {keys} USING (instance_id, boot_id, stage) {where})
WHERE rn <= {n} ORDER BY instance_id, boot_id, stage, source, seq, line_no"""

StageKey = tuple[str, str, str]


@dataclass(frozen=True)
class FailureInputs:
    """What :func:`build_failure` needs for every key of ``_fail_keys``, grouped by key."""

    lifecycle: dict[tuple[str, str], list[dict[str, Any]]]  # per boot
    exits: dict[StageKey, list[dict[str, Any]]]
    results: dict[StageKey, list[dict[str, Any]]]
    facts: dict[tuple[str, str | None], dict[str, Any]]  # per boot, and per instance (boot None): the latest
    tails: dict[StageKey, dict[str, list[str]]]  # stages without a ProcessExit
    late: dict[StageKey, dict[str, list[str]]]  # late lines of every stage
    last: dict[StageKey, list[dict[str, Any]]]  # the last LAST_LINES lines of every stage, all sources


def _group(rows: list[dict[str, Any]], *key: str) -> dict[Any, list[dict[str, Any]]]:
    out: dict[Any, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        out[tuple(r[k] for k in key)].append(r)
    return out


def _tails_by_source(rows: list[dict[str, Any]]) -> dict[StageKey, dict[str, list[str]]]:
    out: dict[StageKey, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    for t in rows:
        out[(t["instance_id"], t["boot_id"], t["stage"])][t["source"]].append(t["text"])
    return out


def _failure_inputs(con: duckdb.DuckDBPyConnection, new_lines: str | None = None) -> FailureInputs:
    """Read the stored events of the stages in ``_fail_keys`` (one query per table; ``new_lines``: _last_lines)."""
    life = _rows(
        con,
        """SELECT instance_id, boot_id, event_id, seq, ts_us, kind, stage, state, detail, attributes
                         FROM lifecycle_events SEMI JOIN (SELECT DISTINCT instance_id, boot_id FROM _fail_keys)
                         USING (instance_id, boot_id) WHERE kind = 'lifecycle'""",
    )
    exits = _rows(con, "SELECT * FROM process_exits SEMI JOIN _fail_keys USING (instance_id, boot_id, stage)")
    results = _rows(
        con,
        """SELECT * FROM throughput SEMI JOIN _fail_keys USING (instance_id, boot_id, stage)
                            WHERE kind = 'result'""",
    )
    facts = _rows(
        con,
        """SELECT * FROM instance_facts SEMI JOIN (SELECT DISTINCT instance_id FROM _fail_keys)
                          USING (instance_id) ORDER BY ts_us, seq, event_id""",
    )
    tails = _rows(
        con,
        _TAILS_SQL.format(
            keys="(SELECT * FROM _fail_keys k ANTI JOIN process_exits x USING (instance_id, boot_id, stage))",
            where="",
            n=TAIL_LINES,
        ),
    )
    late = _rows(con, _TAILS_SQL.format(keys="_fail_keys", where="WHERE l.late", n=TAIL_LINES))
    last = {
        (r["instance_id"], r["boot_id"], r["stage"]): r["last_lines"] for r in last_lines(con, new_lines).to_pylist()
    }
    facts_of: dict[tuple[str, str | None], dict[str, Any]] = {}
    for f in facts:  # ascending: the latest wins, per boot and per instance
        facts_of[(f["instance_id"], f["boot_id"])] = f
        facts_of[(f["instance_id"], None)] = f
    return FailureInputs(
        lifecycle=_group(life, "instance_id", "boot_id"),
        exits=_group(exits, "instance_id", "boot_id", "stage"),
        results=_group(results, "instance_id", "boot_id", "stage"),
        facts=facts_of,
        tails=_tails_by_source(tails),
        late=_tails_by_source(late),
        last=last,
    )


def _failure_rows(keys: pa.Table, inputs: FailureInputs, rules: RuleTable) -> list[dict[str, Any]]:
    """The failures row of every key that shows a failure. Pure."""
    out = []
    for k in keys.to_pylist():
        key = (k["instance_id"], k["boot_id"], k["stage"])
        row = build_failure(
            *key,
            lifecycle=inputs.lifecycle.get(key[:2], []),
            exits=inputs.exits.get(key, []),
            results=inputs.results.get(key, []),
            facts=inputs.facts.get(key[:2]) or inputs.facts.get((key[0], None)),
            log_tails=inputs.tails.get(key, {}),
            rules=rules,
            late_tails=inputs.late.get(key),
        )
        if row is not None:
            out.append({**row, "last_lines": inputs.last.get(key, [])})
    return out


def recompute_failures(
    con: duckdb.DuckDBPyConnection,
    rules: RuleTable,
    stages: pa.Table,
    out: Rewrite | None = None,
    new_lines: str | None = None,
) -> int:
    """One failures row per stage in ``stages`` that shows a failure; returns rows written. ``new_lines``: a relation
    of the lines this commit stored (their events new), which spares a stage with a failures row a scan of
    log_lines for its last lines (db/lastlines.py)."""
    with arrow_views(con, _aff_stage=stages):
        keys = con.sql(FAILURE_KEYS_SQL).to_arrow_table()
    if keys.num_rows == 0:
        return 0
    with arrow_views(con, _fail_keys=keys):
        rows = _failure_rows(keys, _failure_inputs(con, new_lines), rules)
    (out or Rewrite()).replace(con, "failures", keys, [pa.Table.from_pylist(rows, schema=FAILURES)])
    return len(rows)


INSTANCES_SQL = """
WITH lb AS (
    SELECT * FROM (SELECT b.*, row_number() OVER (PARTITION BY b.instance_id
                                                  ORDER BY coalesce(b.first_recv_us, b.first_event_us) DESC,
                                                           b.boot_id DESC) AS rn
                   FROM boots b SEMI JOIN _aff_inst USING (instance_id)) WHERE rn = 1),
span AS (
    SELECT instance_id, min(first_event_us) AS first_event_us, max(last_event_us) AS last_event_us,
           max(last_recv_us) AS last_recv_us
    FROM boots SEMI JOIN _aff_inst USING (instance_id) GROUP BY instance_id),
st AS (
    SELECT * FROM (SELECT l.instance_id, l.state, l.detail,
                          row_number() OVER (PARTITION BY l.instance_id ORDER BY l.seq DESC, l.event_id DESC) AS rn
                   FROM lifecycle_events l JOIN lb USING (instance_id, boot_id)
                   WHERE l.kind IN ('lifecycle', 'sealed')) WHERE rn = 1),
sg AS (
    SELECT * FROM (SELECT l.instance_id, l.stage,
                          row_number() OVER (PARTITION BY l.instance_id ORDER BY l.seq DESC, l.event_id DESC) AS rn
                   FROM lifecycle_events l JOIN lb USING (instance_id, boot_id)
                   WHERE l.kind = 'lifecycle') WHERE rn = 1),
fa AS (
    SELECT * FROM (SELECT f.*, row_number() OVER (PARTITION BY f.instance_id
                                                  ORDER BY f.ts_us DESC, f.seq DESC, f.event_id DESC) AS rn
                   FROM instance_facts f SEMI JOIN _aff_inst USING (instance_id)) WHERE rn = 1),
re AS (
    SELECT * FROM (SELECT t.instance_id, t.min_rate, t.verdict,
                          row_number() OVER (PARTITION BY t.instance_id
                                             ORDER BY t.ts_us DESC, t.seq DESC, t.event_id DESC) AS rn
                   FROM throughput t SEMI JOIN _aff_inst USING (instance_id) WHERE t.kind = 'result') WHERE rn = 1),
rate AS (
    SELECT * FROM (SELECT t.instance_id, t.proofs_per_hour,
                          row_number() OVER (PARTITION BY t.instance_id
                                             ORDER BY t.ts_us DESC, t.seq DESC, t.event_id DESC) AS rn
                   FROM throughput t SEMI JOIN _aff_inst USING (instance_id)
                   WHERE t.kind = 'result' OR t.phase = 'measured') WHERE rn = 1),
fc AS (SELECT instance_id, count(*) AS n FROM failures SEMI JOIN _aff_inst USING (instance_id) GROUP BY instance_id)
SELECT a.instance_id, lb.boot_id, sg.stage, st.state, st.detail,
       fa.gpu_model, fa.gpu_count, fa.gpu_memory_mib, fa.driver_version, fa.cuda_version, fa.compute_capability,
       fa.gpu_probe_error, fa.host, fa.price_per_hour,
       span.first_event_us, span.last_event_us,
       rate.proofs_per_hour, re.min_rate, re.verdict,
       coalesce(fc.n, 0)::INTEGER AS failures,
       coalesce(lb.events, 0) AS events,
       lb.sealed_count IS NOT NULL AS sealed,
       coalesce(lb.complete, false) AS complete,
       lb.incomplete_reason,
       coalesce(lb.dropped_events, 0) AS dropped_events,
       span.last_recv_us, lb.clock_offset_us
FROM _aff_inst a
LEFT JOIN lb USING (instance_id) LEFT JOIN span USING (instance_id) LEFT JOIN st USING (instance_id)
LEFT JOIN sg USING (instance_id) LEFT JOIN fa USING (instance_id) LEFT JOIN re USING (instance_id)
LEFT JOIN rate USING (instance_id) LEFT JOIN fc USING (instance_id)
"""


# The instances row of an instance whose new events are all of BOOT_ONLY_KINDS and whose latest boot is still the
# one its stored row names: only the columns taken from the boots change (the same expressions as INSTANCES_SQL);
# state, stage, facts, throughput and the failure count cannot. Reads the boots and the stored rows only.
BOOT_ONLY_INSTANCES_SQL = """
WITH b AS (
    SELECT instance_id, arg_max(b, (coalesce(first_recv_us, first_event_us), boot_id)) AS lb,
           min(first_event_us) AS first_event_us, max(last_event_us) AS last_event_us,
           max(last_recv_us) AS last_recv_us
    FROM boots b SEMI JOIN _boot_only USING (instance_id) GROUP BY instance_id)
SELECT i.* REPLACE (b.first_event_us AS first_event_us, b.last_event_us AS last_event_us,
                    b.last_recv_us AS last_recv_us, b.lb.clock_offset_us AS clock_offset_us,
                    coalesce(b.lb.events, 0) AS events, b.lb.sealed_count IS NOT NULL AS sealed,
                    coalesce(b.lb.complete, false) AS complete, b.lb.incomplete_reason AS incomplete_reason,
                    coalesce(b.lb.dropped_events, 0) AS dropped_events)
FROM instances i JOIN b ON i.instance_id = b.instance_id AND i.boot_id = b.lb.boot_id
"""


def recompute_instances(
    con: duckdb.DuckDBPyConnection, instances: pa.Table, boot_only: pa.Table | None = None, out: Rewrite | None = None
) -> pa.Table:
    """The instances row of every instance in ``instances`` (after boots and failures); returns the instances
    recomputed in full. Those of ``boot_only`` (see AffectedKeys) whose latest boot did not change take their
    stored row with the boots' columns updated (BOOT_ONLY_INSTANCES_SQL): the same row, fewer tables read."""
    fast = None
    if boot_only is not None and boot_only.num_rows:
        with arrow_views(con, _boot_only=boot_only):
            fast = con.sql(BOOT_ONLY_INSTANCES_SQL).to_arrow_table()
    full = instances
    if fast is not None and fast.num_rows:
        full = instances.filter(pc.invert(pc.is_in(instances.column("instance_id"), fast.column("instance_id"))))
    rows = [fast] if fast is not None else []
    if full.num_rows:
        with arrow_views(con, _aff_inst=full):
            rows.append(con.sql(INSTANCES_SQL).to_arrow_table())
    (out or Rewrite()).replace(con, "instances", instances.select(["instance_id"]), rows)
    return full


def recompute(
    con: duckdb.DuckDBPyConnection,
    rules: RuleTable,
    keys: AffectedKeys,
    out: Rewrite | None = None,
    new_lines: str | None = None,
) -> int:
    """Boots, then failures, then instances, then running stages, for the affected keys; returns failure rows
    written (through ``out``: by default the tables of those names). Each step reads what the ones before it
    wrote. Running stages depend on the latest boot and its lifecycle events only, so an instance whose row kept
    its boot and got only BOOT_ONLY_KINDS events keeps them."""
    out = out or Rewrite()
    recompute_boots(con, keys.boots, out)
    n = recompute_failures(con, rules, keys.stages, out, new_lines) if keys.stages.num_rows else 0
    full = recompute_instances(con, keys.instances, keys.boot_only, out)
    if full.num_rows:
        out.replace(con, "running_stages", full.select(["instance_id"]), [running_rows(con, full)])
    return n
