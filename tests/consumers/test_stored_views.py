"""The shared views live in the database file: any DuckDB client (the PyPI duckdb CLI binary) queries them."""

from __future__ import annotations

import csv
import io
import subprocess
import sys
from pathlib import Path

import pytest
from flightrec.db.views import ALL_VIEW_NAMES
from flightrec.schemas import Lifecycle
from materializer_helpers import Boot, flightrec, motivating_boot, publish

pytestmark = pytest.mark.integration


def _cli(db: Path, sql: str) -> list[dict[str, str]]:
    exe = Path(sys.executable).with_name("duckdb")
    r = subprocess.run([str(exe), "-readonly", "-csv", str(db), "-c", sql], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return list(csv.DictReader(io.StringIO(r.stdout)))


def _boots() -> tuple[Boot, Boot, Boot]:
    failed = motivating_boot()
    probe_failed = Boot()  # nvidia-smi failed: the agent sends '' / 0 for every GPU fact
    probe_failed.facts(
        gpu_model="",
        gpu_count=0,
        gpu_memory_mib=0,
        driver_version="",
        cuda_version="",
        compute_capability="",
        gpu_probe_error="nvidia-smi not found on PATH",
    )
    probe_failed.stage_ok("tunnel", ["up"])
    probe_failed.seal()
    no_facts = Boot()  # no InstanceFacts event at all
    no_facts.add(Lifecycle, stage="tunnel", state="started")
    no_facts.seal()
    return failed, probe_failed, no_facts


def test_views_are_in_the_file_with_timestamptz_and_null_facts(kafka, db, env_for, tmp_path):
    failed, probe_failed, no_facts = _boots()
    publish(kafka.bootstrap, failed.events + probe_failed.events + no_facts.events)
    kafka.seed_at_mark(db)
    flightrec("materialize", "--db", str(db), "--until-idle", "1", "--no-serve", env=env_for())

    # `duckdb fleet.duckdb -c "from fleet"` works: every view the readers share is stored in the file
    stored = {r["view_name"] for r in _cli(db, "SELECT view_name FROM duckdb_views() WHERE NOT internal")}
    assert set(ALL_VIEW_NAMES) <= stored, set(ALL_VIEW_NAMES) - stored
    for name in ALL_VIEW_NAMES:
        _cli(db, f"FROM {name} LIMIT 1")
    rows = {r["instance_id"]: r for r in _cli(db, "FROM fleet")}
    assert rows[failed.instance]["status"] == "failed"
    (fc,) = _cli(db, f"SELECT failure_class, failed_at FROM failure_context WHERE instance_id = '{failed.instance}'")
    assert fc["failure_class"] == "gpu_arch_unsupported" and fc["failed_at"].startswith("2025-06-15")
    assert _cli(db, f"SELECT count(*) AS n FROM log_view WHERE instance_id = '{failed.instance}'")[0]["n"] == "10"

    # times: a TIMESTAMPTZ `*_at` next to every raw `*_us`
    cols = _cli(
        db,
        "SELECT table_name, column_name, data_type FROM duckdb_columns() "
        "WHERE table_name IN (SELECT view_name FROM duckdb_views() WHERE NOT internal)",
    )
    types = {(c["table_name"], c["column_name"]): c["data_type"] for c in cols}
    for (view, col), _ in types.items():
        if view in ALL_VIEW_NAMES and col.endswith("_us"):
            at = (view, col[: -len("_us")] + "_at")
            assert types.get(at) == "TIMESTAMP WITH TIME ZONE", (at, types.get(at))

    # missing facts are NULL, never '': a failed probe and no facts at all group together
    groups = _cli(
        db,
        f"SELECT gpu_model IS NULL AS missing, count(*) AS n FROM fleet "
        f"WHERE instance_id IN ('{probe_failed.instance}', '{no_facts.instance}') GROUP BY ALL",
    )
    assert groups == [{"missing": "true", "n": "2"}]
    (pf,) = _cli(
        db,
        f"SELECT gpu_model, driver_version, gpu_count, gpu_probe_error FROM fleet "
        f"WHERE instance_id = '{probe_failed.instance}'",
    )
    assert pf["gpu_model"] == pf["driver_version"] == pf["gpu_count"] == "NULL"  # how the CLI prints NULL
    assert (
        _cli(
            db,
            f"SELECT count(*) AS n FROM instances WHERE instance_id = '{probe_failed.instance}' "
            "AND gpu_model IS NULL AND driver_version IS NULL AND gpu_count IS NULL",
        )[0]["n"]
        == "1"
    )
    assert pf["gpu_probe_error"] == "nvidia-smi not found on PATH"

    # the Python client reads them too, times as aware datetimes (duckdb needs pytz for that: a dependency)
    import duckdb

    con = duckdb.connect(str(db), read_only=True)
    try:
        (first,) = con.execute("SELECT first_event_at FROM fleet WHERE instance_id = ?", [failed.instance]).fetchone()
    finally:
        con.close()
    assert first.utcoffset() is not None and first.year == 2025

    # a replay stores the same views
    again = tmp_path / "replayed.duckdb"
    flightrec("replay", "--db", str(again), "--instance", failed.instance, env=env_for())
    (row,) = _cli(again, "SELECT instance_id, status FROM fleet")
    assert row == {"instance_id": failed.instance, "status": "failed"}


def test_the_price_the_manager_sends_is_what_the_cost_views_count(kafka, db, env_for, tmp_path):
    b = motivating_boot()  # its facts say $0.35/hour; the controller knows it pays $1.85
    publish(kafka.bootstrap, b.events)
    flightrec(
        "manager",
        "event",
        "--instance",
        b.instance,
        "--kind",
        "rented",
        "--attr",
        "price_per_hour=1.85",
        "--attr",
        "host_id=41007",
        "--spool",
        str(tmp_path / "spool"),
        env=env_for(),
    )
    kafka.seed_at_mark(db)
    flightrec("materialize", "--db", str(db), "--until-idle", "1", "--no-serve", env=env_for())
    (row,) = _cli(
        db,
        f"SELECT price_per_hour, price_source, host_id, failure_class, "
        f"round(dollars_lost / hours_before_failure, 2) AS per_hour, "
        f"year(rented_at) = 2025 AND first_failure_at - rented_at < INTERVAL 1 SECOND "
        f"AS paid_from_first_event "
        f"FROM instance_cost WHERE instance_id = '{b.instance}'",
    )
    # the boot's events carry a fixed 2025 clock, the manager's event today's: paid from the earlier
    assert row == {
        "price_per_hour": "1.85",
        "price_source": "manager",
        "host_id": "41007",
        "failure_class": "gpu_arch_unsupported",
        "per_hour": "1.85",
        "paid_from_first_event": "true",
    }
    (f,) = _cli(db, "SELECT value, offer_filter FROM avoid_list WHERE dimension = 'host' AND value = '41007'")
    assert f["offer_filter"] == "host_id!=41007"
