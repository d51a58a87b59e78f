"""Failures classed again by a changed rule table, in place (no replay): the rows of the failures a table of
another version classed are built again from their stored events, a few stages per transaction, in key order.

The materializer runs a step at a time in its writer thread, between its commits (consumers/rulewatch.py); a lake's
member runs them shard by shard on the shards it owns, each step with the check of its claim (LakeStore.reclassify). A
failure's stored last lines are kept (its lines may have expired since), everything else is built as a replay
would build it: class, hint, rule id, rules version, decisive line, kind.
"""

from __future__ import annotations

from dataclasses import dataclass

import duckdb
from flightrec.db.classify import RuleTable
from flightrec.db.derive import recompute_failures

STEP_STAGES = 50  # failed stages built again per transaction: a step holds the next commit ~0.15 s (2.5 ms a stage)

# The stages whose failures row another table classed, after the cursor, in key order.
_STALE_SQL = """
SELECT DISTINCT instance_id, boot_id, stage FROM failures
WHERE rules_version IS DISTINCT FROM $version AND (instance_id, boot_id, stage) > ($i, $b, $s)
ORDER BY ALL LIMIT $n
"""
# No new lines: a failure's stored last lines stay as they are (derive.recompute_failures' new_lines).
_NO_LINES = (
    "(SELECT NULL::VARCHAR AS instance_id, NULL::VARCHAR AS boot_id, NULL::VARCHAR AS stage, NULL::BIGINT AS seq, "
    "NULL::BIGINT AS line_no, NULL::VARCHAR AS source, NULL::VARCHAR AS text WHERE false)"
)


@dataclass(frozen=True)
class Step:
    """One step's outcome: rows built again, the key it got to (the next step's cursor), whether none is left."""

    rows: int
    cursor: tuple[str, str, str]
    done: bool
    stages: int = 0  # stages looked at (a stage whose events no longer show a failure lost its row: rows < stages)


START = ("", "", "")  # before every key


def reclassify_step(
    con: duckdb.DuckDBPyConnection, rules: RuleTable, cursor: tuple[str, str, str] = START, limit: int = STEP_STAGES
) -> Step:
    """Build again, in one transaction, the failures rows of up to ``limit`` stages after ``cursor`` whose rules
    version is not ``rules``'; a stage whose events no longer show a failure loses its row, as in a replay."""
    con.execute("BEGIN TRANSACTION")
    try:
        step = reclassify_stages(con, rules, cursor, limit)
        con.execute("COMMIT")
    except BaseException:
        con.execute("ROLLBACK")
        raise
    return step


def reclassify_stages(
    con: duckdb.DuckDBPyConnection, rules: RuleTable, cursor: tuple[str, str, str] = START, limit: int = STEP_STAGES
) -> Step:
    """A step's work inside the caller's transaction, on the tables named ``failures``... that ``con`` finds (a file's,
    or a lake shard's through its search path: LakeStore.reclassify)."""
    stages = con.execute(
        _STALE_SQL, {"version": rules.version, "i": cursor[0], "b": cursor[1], "s": cursor[2], "n": limit}
    ).to_arrow_table()
    if not stages.num_rows:
        return Step(0, cursor, True)
    rows = recompute_failures(con, rules, stages, new_lines=_NO_LINES)
    last = stages.slice(stages.num_rows - 1).to_pylist()[0]
    return Step(rows, (last["instance_id"], last["boot_id"], last["stage"]), stages.num_rows < limit, stages.num_rows)
