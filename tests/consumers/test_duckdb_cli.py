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
