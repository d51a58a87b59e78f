"""A materialized file opens with the plain duckdb CLI from PyPI (a real binary) and with the Python client."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import duckdb
import pytest
from materializer_helpers import materialize, motivating_boot, publish

pytestmark = pytest.mark.integration


def _duckdb_cli() -> Path:
    exe = Path(sys.executable).with_name("duckdb")
    assert exe.exists(), "the duckdb CLI comes with the test extras (pip install -e '.[test]')"
    return exe


def test_the_duckdb_cli_and_the_python_client_read_a_materialized_file(kafka, db):
    b = motivating_boot()
    publish(kafka.bootstrap, b.events)
    materialize(kafka, db, idle=0.5)

    version = subprocess.run([str(_duckdb_cli()), "-version"], capture_output=True, text=True, timeout=60)
    assert version.stdout.startswith("v1.5."), version.stdout
    r = subprocess.run(
        [
            str(_duckdb_cli()),
            "-readonly",
            "-csv",
            str(db),
            "-c",
            f"SELECT instance_id, failures FROM instances WHERE instance_id = '{b.instance}'",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["instance_id,failures", f"{b.instance},1"]

    con = duckdb.connect(str(db), read_only=True)
    try:
        assert con.execute("SELECT failure_class FROM failures WHERE instance_id = ?", [b.instance]).fetchall() == [
            ("gpu_arch_unsupported",)
        ]
    finally:
        con.close()


def test_while_a_materializer_runs_the_duckdb_cli_reads_its_snapshot_and_flightrec_sql_reads(kafka, db, env_for):
    """What the README says where it says any client reads the file: DuckDB's lock refuses the plain CLI (even
    -readonly) on the file the materializer holds; the CLI reads the snapshot the materializer publishes (the copy
    `<db>.snapshots/current` names), and so does `flightrec sql`."""
    import json
    import time

    from materializer_helpers import flightrec, serving

    b = motivating_boot()
    publish(kafka.bootstrap, b.events)
    materialize(kafka, db, idle=0.5)
    env = env_for()
    proc = subprocess.Popen(
        [str(Path(sys.executable).with_name("flightrec")), "materialize", "--db", str(db)],
        env={**env, "PYTHONSAFEPATH": "1"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 60
        while not serving(db):
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1].decode()
            time.sleep(0.2)
        r = subprocess.run(
            [str(_duckdb_cli()), "-readonly", "-csv", str(db), "-c", "SELECT count(*) FROM instances"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert r.returncode != 0 and "lock" in (r.stdout + r.stderr).lower(), r
        folder = db.with_name(db.name + ".snapshots")
        copy = folder / json.loads((folder / "current").read_text())["copy"]
        r = subprocess.run(
            [str(_duckdb_cli()), "-readonly", "-csv", "-noheader", str(copy), "-c", "SELECT count(*) FROM instances"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert r.returncode == 0 and r.stdout.split() == ["1"], r
        out = flightrec("sql", "--db", str(db), "--csv", "SELECT count(*) AS n FROM instances", env=env)
        assert out.stdout.splitlines()[1:] == ["1"], out.stdout
    finally:
        proc.send_signal(2)
        proc.wait(timeout=60)
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    assert "**but not while a materializer runs**" in readme and "the snapshot the materializer publishes" in readme
