"""The shared SQL: views over schema.sql tables, the pages' queries, and `flightrec sql` speaking the same names."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from flightrec.analytics import queries
from flightrec.analytics.views import VIEW_NAMES, VIEWS
from flightrec.errors import QueryError
from flightrec.query import run_query


def test_every_view_is_a_temp_view_and_answers(arrow_db):
    db, _ = arrow_db
    assert len(VIEWS) == len(VIEW_NAMES)
    for stmt, name in zip(VIEWS, VIEW_NAMES):
        assert stmt.strip().startswith(f"CREATE OR REPLACE TEMP VIEW {name} AS")
        assert run_query(db, f"SELECT count(*) AS n FROM {name}", prelude=VIEWS).column("n")[0].as_py() > 0


def test_stage_runs_pair_starts_with_outcomes(arrow_db):
    db, ids = arrow_db
    runs = run_query(db, "SELECT stage, outcome, duration_s FROM stage_runs WHERE instance_id = $id ORDER BY started_us",
                     {"id": ids["ok"]}, prelude=VIEWS).to_pylist()
    assert [(r["stage"], r["outcome"]) for r in runs] == [
        ("tunnel", "succeeded"), ("register", "succeeded"), ("fetch_params", "succeeded"),
        ("benchmark", "succeeded"), ("supervisor", "running")]
    assert runs[0]["duration_s"] == 60.0 and runs[-1]["duration_s"] is None


def test_cost_per_proof_is_price_over_rate(arrow_db):
    db, ids = arrow_db
    row = queries.instance_facts(db, ids["ok"]).to_pylist()[0]
    assert row["cost_per_proof"] == pytest.approx(2.49 / 1500)
    zero = queries.instance_facts(db, ids["no_kernel"]).to_pylist()[0]
    assert zero["cost_per_proof"] is None  # 0 proofs/hour: no cost per proof rather than a division error


def test_console_refuses_what_is_not_one_read(arrow_db):
    db, _ = arrow_db
    for bad in ("INSERT INTO instances (instance_id) VALUES ('x')", "ATTACH '/tmp/x.duckdb' AS x",
                "SELECT 1; SELECT 2", "SELECT * FROM '/etc/passwd'"):
        with pytest.raises(QueryError):
            queries.console(db, bad)
    table, cut = queries.console(db, "SELECT * FROM fleet;", max_rows=2)
    assert table.num_rows == 2 and cut


def test_flightrec_sql_offers_the_same_views(arrow_db):
    db, ids = arrow_db
    exe = str(Path(sys.executable).with_name("flightrec"))
    done = subprocess.run([exe, "sql", "--db", str(db),
                           "SELECT instance_id, failure_class FROM failure_context ORDER BY instance_id"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert ids["no_kernel"] in done.stdout and "gpu_arch_unsupported" in done.stdout
