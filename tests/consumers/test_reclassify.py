"""A proposed rule's backtest (db/propose.py, through the readers' run_query) and the stored failures classed again
by a changed table (db/reclassify.py), on a database file built by the real fold and FileStore."""

from __future__ import annotations

from pathlib import Path

import duckdb
from flightrec.db.classify import load_rules, with_operator_rules
from flightrec.db.filestore import FileStore
from flightrec.db.fold import RawMessage, fold
from flightrec.db.propose import Backtest, backtest_sql, propose, rule_entry
from flightrec.db.query import run_query
from flightrec.db.reclassify import START, reclassify_step
from flightrec.schemas import Lifecycle, encode
from materializer_helpers import Boot

SHARD = "zorblax: shard {n} of /data/run-{n}/p.bin unreadable at offset {m}"
LEDGER = "zorblax ledger 0x{n:x}f turned away after {m}ms"
OOM = "CUDA error: out of memory"


def _failed(b: Boot, stage: str, line: str) -> None:
    b.add(Lifecycle, stage=stage, state="started")
    b.exit(stage, 3, stderr=[line])
    b.add(Lifecycle, stage=stage, state="failed", detail="exit code 3")


def _build(db: Path, healthy: list[str] = ()) -> None:
    boots = []
    for i in range(5):
        b = Boot()
        _failed(b, "params", SHARD.format(n=i + 1, m=1000 + i))
        _failed(b, "prove", LEDGER.format(n=i + 7, m=10 + i))
        if i == 0:
            _failed(b, "bench", OOM)
        b.stage_ok("tunnel", ["tunnel up", *healthy])
        boots.append(b)
    events = [e for b in boots for e in b.events]
    store = FileStore(db, group="t")
    try:
        store.commit(fold([RawMessage(e.topic, 0, n, e.instance_id.encode(), encode(e)) for n, e in enumerate(events)]))
    finally:
        store.close()


def _kind(db: Path, like: str) -> tuple[str, str]:
    con = duckdb.connect(str(db), read_only=True)
    try:
        return con.execute(
            "SELECT DISTINCT kind, kind_template FROM failures WHERE decisive_line LIKE ?", [like]
        ).fetchone()
    finally:
        con.close()


def _classes(db: Path) -> list[tuple]:
    con = duckdb.connect(str(db), read_only=True)
    try:
        return con.execute(
            "SELECT stage, failure_class, rule_id, rules_version, count(*) FROM failures GROUP BY ALL ORDER BY ALL"
        ).fetchall()
    finally:
        con.close()


def test_the_backtest_counts_the_kind_healthy_lines_and_explained_failures(tmp_path):
    db = tmp_path / "t.duckdb"
    _build(db, healthy=[LEDGER.format(n=99, m=5)])  # a healthy stage says what the ledger kind says
    shard_kind, shard_template = _kind(db, "%shard%")
    ledger_kind, ledger_template = _kind(db, "%ledger%")

    def backtest(rule):
        return Backtest(**run_query(db, backtest_sql(rule)).to_pylist()[0])

    shard = backtest(propose(shard_kind, shard_template, "zorblax_shard"))
    assert shard == Backtest(5, 5, 0, 0, 5, 0)
    assert shard.refusal() is None
    hostile = propose(shard_kind, shard_template + "'; DROP TABLE failures; --", "it's'); DROP TABLE failures; --")
    assert backtest(hostile) == Backtest(5, 0, 0, 0, 0, 0)  # literals, not statements: nothing matched, nothing gone
    assert backtest(propose(shard_kind, shard_template, "zorblax_shard")) == shard  # the table is whole
    ledger = backtest(propose(ledger_kind, ledger_template, "zorblax_ledger"))
    assert ledger == Backtest(5, 5, 0, 5, 5, 0)
    assert "5 healthy line(s)" in (ledger.refusal() or "")
    oom_kind, oom_template = _kind(db, "%out of memory%")
    oom = backtest(propose(oom_kind, oom_template, "oom_of_mine"))
    assert oom == Backtest(1, 1, 0, 0, 1, 1)
    assert "1 failure(s) a rule already explains" in (oom.refusal() or "")
    too_wide = propose(shard_kind, "zorblax", "zorblax_all")
    assert backtest(too_wide) == Backtest(5, 5, 5, 5, 10, 0)


def test_a_changed_table_classes_exactly_the_kinds_failures_again_in_steps(tmp_path):
    db = tmp_path / "t.duckdb"
    _build(db)
    base = load_rules()
    before = _classes(db)
    assert {(s, c, v) for s, c, _, v, _ in before} == {
        ("params", "unknown", base.version),
        ("prove", "unknown", base.version),
        ("bench", "cuda_out_of_memory", base.version),
    }, before
    shard_kind, shard_template = _kind(db, "%shard%")
    table = with_operator_rules(base, rule_entry(propose(shard_kind, shard_template, "zorblax_shard")), "ops.toml")
    con = duckdb.connect(str(db))
    try:
        steps, cursor = [], START
        while True:
            step = reclassify_step(con, table, cursor, limit=4)
            steps.append(step.rows)
            cursor = step.cursor
            if step.done:
                break
        assert steps == [4, 4, 3]  # 11 failures, 4 stages a transaction
        assert reclassify_step(con, table).rows == 0  # nothing left of another version
    finally:
        con.close()
    assert _classes(db) == sorted(
        [
            ("bench", "cuda_out_of_memory", before[0][2], table.version, 1),
            ("params", "zorblax_shard", f"kind-{shard_kind}", table.version, 5),
            ("prove", "unknown", "unknown", table.version, 5),
        ]
    )
    assert _kind(db, "%shard%") == (shard_kind, shard_template)  # the kind stays: the decisive line did
