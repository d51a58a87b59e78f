"""The shared SQL: views over schema.sql tables, the pages' queries, and `flightrec sql` speaking the same names."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from flightrec.analytics import queries
from flightrec.db.query import run_query
from flightrec.db.views import ALL_VIEW_NAMES, ALL_VIEWS, VIEW_NAMES, VIEWS, prelude_for

from flightrec.errors import QueryError


def test_every_view_is_a_temp_view_and_answers(arrow_db):
    db, _ = arrow_db
    assert len(VIEWS) == len(VIEW_NAMES)
    for stmt, name in zip(VIEWS, VIEW_NAMES, strict=True):
        assert stmt.strip().startswith(f"CREATE OR REPLACE TEMP VIEW {name} AS")
        assert run_query(db, f"SELECT count(*) AS n FROM {name}", prelude=VIEWS).column("n")[0].as_py() > 0


def test_stage_runs_pair_starts_with_outcomes(arrow_db):
    db, ids = arrow_db
    runs = run_query(
        db,
        "SELECT stage, outcome, duration_s FROM stage_runs WHERE instance_id = $id ORDER BY started_us",
        {"id": ids["ok"]},
        prelude=VIEWS,
    ).to_pylist()
    assert [(r["stage"], r["outcome"]) for r in runs] == [
        ("tunnel", "succeeded"),
        ("register", "succeeded"),
        ("fetch_params", "succeeded"),
        ("benchmark", "succeeded"),
        ("supervisor", "running"),
    ]
    assert runs[0]["duration_s"] == 60.0 and runs[-1]["duration_s"] is None


def test_cost_per_proof_is_price_over_rate(arrow_db):
    db, ids = arrow_db
    row = queries.fleet_row(db, ids["ok"]).to_pylist()[0]
    assert row["cost_per_proof"] == pytest.approx(2.49 / 1500)
    zero = queries.fleet_row(db, ids["no_kernel"]).to_pylist()[0]
    assert zero["cost_per_proof"] is None  # 0 proofs/hour: no cost per proof rather than a division error


def test_console_refuses_what_is_not_one_read(arrow_db):
    db, _ = arrow_db
    for bad in (
        "INSERT INTO instances (instance_id) VALUES ('x')",
        "ATTACH '/tmp/x.duckdb' AS x",
        "SELECT 1; SELECT 2",
        "SELECT * FROM '/etc/passwd'",
    ):
        with pytest.raises(QueryError):
            queries.console(db, bad)
    table, cut = queries.console(db, "SELECT * FROM fleet;", max_rows=2)
    assert table.num_rows == 2 and cut


def test_flightrec_sql_offers_the_same_views(arrow_db):
    db, ids = arrow_db
    exe = str(Path(sys.executable).with_name("flightrec"))
    done = subprocess.run(
        [exe, "sql", "--db", str(db), "SELECT instance_id, failure_class FROM failure_context ORDER BY instance_id"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert ids["no_kernel"] in done.stdout and "gpu_arch_unsupported" in done.stdout


def _rows(db: Path, sql: str) -> list[dict]:
    return run_query(db, sql, prelude=prelude_for(sql)).to_pylist()


def test_every_money_view_answers_with_only_the_views_it_reads(arrow_db):
    db, _ = arrow_db
    assert ALL_VIEWS[: len(VIEWS)] == VIEWS and len(ALL_VIEWS) == len(ALL_VIEW_NAMES)
    for name in ALL_VIEW_NAMES:
        sql = f"SELECT count(*) AS n FROM {name}"
        assert run_query(db, sql, prelude=prelude_for(sql)).column("n")[0].as_py() > 0, name
    assert [s.split(" AS", 1)[0].split()[-1] for s in prelude_for("FROM avoid_filter")] == [
        "instance_cost",
        "cost_breakdown",
        "avoid_list",
        "avoid_filter",
    ]
    assert prelude_for("SELECT 1") == () and len(prelude_for("from fleet")) == 2


def test_what_each_instance_and_failure_cost(money_db):
    cost = {r["instance_id"]: r for r in _rows(money_db, "FROM instance_cost")}
    a, b, c = cost["a"], cost["b"], cost["c"]
    assert (a["price_per_hour"], a["price_source"], a["host_id"]) == (0.40, "manager", "123")
    assert (b["price_per_hour"], b["price_source"], b["host_id"]) == (0.50, "facts", "456")
    assert a["hours_paid"] == pytest.approx(2.0) and a["dollars_paid"] == pytest.approx(0.80)  # sealed at 2 h
    assert b["hours_paid"] == pytest.approx(3.0) and b["dollars_paid"] == pytest.approx(1.50)  # destroyed at 3 h
    assert c["dollars_paid"] == pytest.approx(8.0) and not c["failed"] and c["dollars_lost"] is None
    assert a["dollars_lost"] == pytest.approx(0.40) and b["dollars_lost"] == pytest.approx(0.25)  # up to 1st failure
    assert (
        a["rented_at"].isoformat().startswith("2025-06-01T12:00:00") and a["rented_at"].utcoffset().total_seconds() == 0
    )

    per_failure = {r["failure_id"]: r for r in _rows(money_db, "FROM failure_cost")}
    assert per_failure["fb2"]["hours_before_failure"] == pytest.approx(1.0)
    assert per_failure["fb2"]["dollars_before_failure"] == pytest.approx(0.50)
    assert [k for k, r in sorted(per_failure.items()) if r["first_of_instance"]] == ["fa", "fb1"]


def test_dollars_by_class_gpu_and_host_count_each_instance_once(money_db):
    by_class = {r["failure_class"]: r for r in _rows(money_db, "FROM cost_by_class")}
    assert set(by_class) == {"gpu_arch_unsupported", "cuda_out_of_memory"}  # not b's later below_min_rate
    assert by_class["gpu_arch_unsupported"]["dollars_lost"] == pytest.approx(0.40)
    assert by_class["cuda_out_of_memory"]["dollars_lost"] == pytest.approx(0.25)
    by_gpu = {r["gpu_model"]: r for r in _rows(money_db, "FROM cost_by_gpu")}
    rtx = by_gpu["NVIDIA GeForce RTX 4090"]
    assert (rtx["instances"], rtx["failed_instances"], rtx["failure_rate"]) == (2, 2, 1.0)
    assert rtx["dollars_lost"] == pytest.approx(0.65) and rtx["dollars_paid"] == pytest.approx(2.30)
    assert by_gpu["NVIDIA H100 80GB HBM3"]["failed_instances"] == 0
    assert {r["host"] for r in _rows(money_db, "FROM cost_by_host")} == {"123", "456", "h-c"}


def test_a_host_whose_gpu_fell_off_the_bus_is_banned_at_once(tmp_path):
    """gpu_hardware_error is deterministic for the host (rules.toml): one Xid 79 bans that host, not its GPU model."""
    from dashdata import BASE_US, HOUR, MIN, Boot, _money_facts, commit, manager_events
    from flightrec.schemas import Lifecycle

    b = Boot("x79", BASE_US)
    _money_facts(b, "NVIDIA GeForce RTX 4090", "h-x", "570.86", 0.5)
    b.add(Lifecycle, BASE_US + MIN, stage="benchmark", state="started")
    b.lines("benchmark", "/var/log/kern.log", ["NVRM: Xid (PCI:0000:01:00): 79, GPU has fallen off the bus."])
    b.add(Lifecycle, BASE_US + HOUR, stage="benchmark", state="failed", detail="benchmark exited with error")
    db = tmp_path / "x79.duckdb"
    commit(db, [b, manager_events("x79", ("rented", BASE_US, {"price_per_hour": "0.5", "host_id": "789"}))])
    got = {(r["dimension"], r["value"]): (r["banned"], r["because"]) for r in _rows(db, "FROM avoid_list")}
    assert got[("host", "789")] == (True, "deterministic")
    assert got[("gpu_model", "NVIDIA GeForce RTX 4090")] == (False, "too_few")


@pytest.mark.slow  # ~3 s
def test_avoid_list_bans_on_a_deterministic_class_or_a_confident_rate_and_says_why(money_db):
    """RTX 4090: a gpu_arch_unsupported (deterministic for the GPU model) bans it; a driver, hosts with 1 or 2
    flaky failures are listed with their counts and interval, not banned (db/avoid.py's rule)."""
    ranked = _rows(money_db, "FROM avoid_list ORDER BY rank")
    got = {r["offer_filter"]: (r["banned"], r["because"], r["failed_instances"], r["instances"]) for r in ranked}
    assert got == {
        "gpu_name!=RTX_4090": (True, "deterministic", 2, 2),
        "driver_version!=570.86": (False, "too_few", 2, 2),
        "host_id!=123": (False, "too_few", 1, 1),
        "host_id!=456": (False, "too_few", 1, 1),
    }
    assert ranked[0]["offer_filter"] == "gpu_name!=RTX_4090" and ranked[0]["in_filter"]
    assert ranked[0]["why"] == (
        "2 of 2 failed (95 % interval 34–100 %): gpu_arch_unsupported is deterministic for the gpu model "
        "(1 failed so), one is enough"
    )
    host = next(r for r in ranked if r["value"] == "123")
    assert host["rate_low"] == pytest.approx(0.2065, abs=1e-3) and host["rate_high"] == 1.0
    assert host["why"].startswith("1 of 1 failed (95 % interval 21–100 %): too few to judge")
    assert not any(r["value"] == "NVIDIA H100 80GB HBM3" for r in ranked)
    (f,) = _rows(money_db, "FROM avoid_filter")
    assert f["offer_filter"] == "gpu_name!=RTX_4090"
    exe = str(Path(sys.executable).with_name("flightrec"))
    done = subprocess.run(
        [exe, "sql", "--db", str(money_db), "SELECT offer_filter FROM avoid_filter"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "gpu_name!=RTX_4090" in done.stdout


def test_flightrec_readers_give_times_in_utc_whatever_the_machine_zone(money_db):
    """The dashboard says "Times are UTC": the TIMESTAMPTZ columns reach it in UTC even on a Tokyo machine."""
    code = (
        "from flightrec.db.query import run_query\nfrom flightrec.db.views import ALL_VIEWS\n"
        f"t = run_query({str(money_db)!r}, 'SELECT rented_at FROM instance_cost ORDER BY instance_id LIMIT 1', "
        "prelude=ALL_VIEWS)\nprint(t.schema.field('rented_at').type.tz, t.column(0)[0].as_py().hour)\n"
    )
    import os

    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "TZ": "Asia/Tokyo", "PYTHONSAFEPATH": "1"},
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["UTC", "12"]  # 2025-06-01 12:00 UTC, not 21:00 Tokyo


@pytest.mark.parametrize("since", [None, 0, 2**62])
def test_the_fleet_summary_is_what_the_fleet_view_gives_grouped(glance_db, since):
    db, _ = glance_db
    row = queries.fleet_summary(db, since).to_pylist()[0]
    heard = "WHERE $since IS NULL OR last_event_us >= $since"
    for column in ("status", "gpu_model"):
        grouped = run_query(
            db,
            f"""SELECT coalesce(nullif({column}, ''), 'unknown') AS {column}, count(*) AS instances FROM fleet {heard}
                GROUP BY ALL ORDER BY instances DESC, {column}""",
            {"since": since},
            prelude=VIEWS,
        ).to_pylist()
        assert row[f"by_{column}"] == grouped
    totals = run_query(
        db, f"SELECT count(*) AS n, sum(failures) AS f FROM fleet {heard}", {"since": since}, prelude=VIEWS
    )
    assert (row["instances"], row["failures"]) == (totals["n"][0].as_py(), totals["f"][0].as_py() or 0)
    assert row["instances"] == (0 if since else 4)
    every = run_query(db, "SELECT list(DISTINCT status ORDER BY status) AS s FROM fleet", prelude=VIEWS)
    assert row["statuses"] == every["s"][0].as_py()  # the filters offer every instance's, whatever the time range
    assert queries.fleet_filter_options(db).to_pylist()[0]["statuses"] == row["statuses"]
    assert queries.fleet_counts(db, since).column_names == list(queries.FLEET_COUNTS)
