"""The demo's healthy instance ships each line of the daemon's log once, though benchmark and supervisor both follow
it."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from flightrec.db.query import run_query
from materializer_helpers import materialize

pytestmark = pytest.mark.integration
ENTRYPOINT = Path(__file__).resolve().parents[2] / "examples" / "entrypoint.sh"


def _run_entrypoint(kafka, work: Path, instance: str, **cmds: str) -> None:
    bin_dir = Path(sys.executable).parent
    env = kafka.env(
        PATH=f"{bin_dir}:{os.environ['PATH']}",
        FLIGHTREC_INSTANCE=instance,
        FLIGHTREC_SPOOL=str(work / "spool"),
        FLIGHTREC=str(bin_dir / "flightrec"),
        WORK=str(work),
        MANAGER_TOKEN="demo-secret-token",
        FLIGHTREC_LOG_LEVEL="WARNING",
        PYTHONSAFEPATH="1",
        **cmds,
    )
    p = subprocess.run(["bash", str(ENTRYPOINT)], env=env, capture_output=True, timeout=300)
    assert p.returncode == 0, p.stderr.decode()[-3000:]


def _daemon_lines(db: Path, instance: str, log: Path) -> list[dict]:
    return run_query(
        db,
        "SELECT text, count(*) AS n, string_agg(stage, ',' ORDER BY stage) AS stages FROM log_lines "
        "WHERE instance_id = ? AND source = ? GROUP BY text ORDER BY min(ts_us)",
        [instance, str(log)],
    ).to_pylist()


def test_the_demo_healthy_instance_ships_the_daemon_log_once(kafka, db, tmp_path):
    """The demo's stand-ins: the daemon runs through the benchmark, the supervisor follows the same file."""
    instance, work = f"healthy-{uuid.uuid4().hex[:8]}", tmp_path / "work"
    log = work / "prover-daemon.log"
    fleet = f"{sys.executable} -m flightrec.demo.fleet"
    _run_entrypoint(
        kafka,
        work,
        instance,
        DAEMON_LOG=str(log),
        MIN_RATE="1",
        TUNNEL_CMD=f"{fleet} tunnel",
        REGISTER_CMD=f"{fleet} register",
        PARAMS_CMD=f"{fleet} params",
        BENCHMARK_CMD=f"{fleet} benchmark --log {log} --k 6 --proofs 1 --min-rate 1",
        SUPERVISOR_CMD=f"{fleet} supervisor --seconds 2",
    )
    materialize(kafka, db, idle=1.0)
    lines = _daemon_lines(db, instance, log)
    assert any("ready: listening" in r["text"] for r in lines), lines
    assert [r for r in lines if r["n"] > 1] == []
    shipped = [r["text"] for r in lines]
    written = log.read_text().splitlines()
    assert sorted(shipped) == sorted(written)  # every line of the file, each once


def test_a_daemon_outliving_the_benchmark_is_shipped_once(kafka, db, tmp_path):
    """A daemon that goes on writing while the supervisor runs: the benchmark's late lines and the supervisor's
    own following must not both ship the same line."""
    instance, work = f"daemon-{uuid.uuid4().hex[:8]}", tmp_path / "work"
    log = work / "daemon.log"
    daemon = tmp_path / "daemon.sh"
    daemon.write_text(
        f'#!/bin/sh\nfor i in 1 2 3 4 5 6 7 8 9 10 11 12; do echo "daemon line $i" >> {log}; sleep 0.25; done\n'
    )
    bench = tmp_path / "bench.sh"
    bench.write_text(f"#!/bin/sh\nsh {daemon} </dev/null >/dev/null 2>&1 &\nsleep 0.6\necho benchmark done\n")
    sup = tmp_path / "sup.sh"
    sup.write_text("#!/bin/sh\nsleep 3.5\necho supervisor done\n")
    _run_entrypoint(kafka, work, instance, DAEMON_LOG=str(log), BENCHMARK_CMD=f"sh {bench}", SUPERVISOR_CMD=f"sh {sup}")
    materialize(kafka, db, idle=1.0)
    lines = _daemon_lines(db, instance, log)
    assert [r for r in lines if r["n"] > 1] == [], lines
    assert sorted(r["text"] for r in lines) == sorted(f"daemon line {i}" for i in range(1, 13))
