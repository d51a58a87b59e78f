"""Fixtures for the dashboard tests: databases folded from events by the materializer's own fold() and FileStore."""

from __future__ import annotations

import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import pytest

sys.path.insert(0, str(Path(__file__).parent))  # tests/analytics only, for dashdata

from dashdata import (
    BASE_US,
    HOSTILE,
    NO_KERNEL,
    SEGV,
    build_arrow_db,
    commit,
    first_failure_id,
    hostile_boot,
    kind_boots,
    manager_events,
    money_boots,
    segv_boot,
)


@pytest.fixture(scope="session")
def glance_db(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """The three instances of arrow_db plus a daemon that died of SIGSEGV 40 minutes later (path, ids)."""
    path = tmp_path_factory.mktemp("glancedb") / "fleet.duckdb"
    ids = build_arrow_db(path)
    commit(path, [segv_boot()])
    ids.update(segv=SEGV, segv_failure=first_failure_id(path, SEGV))
    return path, ids


@pytest.fixture
def live_db(arrow_db: tuple[Path, dict[str, Any]], tmp_path: Path) -> tuple[Path, dict[str, Any]]:
    """A private copy of arrow_db that a test may append to (path, ids)."""
    src, ids = arrow_db
    dst = tmp_path / "live.duckdb"
    shutil.copyfile(src, dst)
    return dst, dict(ids)


@pytest.fixture(scope="session")
def arrow_db(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, dict[str, Any]]]:
    """A database of three instances folded from events (path, ids)."""
    path = tmp_path_factory.mktemp("arrowdb") / "fleet.duckdb"
    ids = build_arrow_db(path)
    yield path, ids


BENCH_SCRIPT = """\
#!/bin/sh
# A fake benchmark: its daemon writes the CUDA error only to its own log file.
log="$1"
echo "starting prover daemon"
echo "daemon: device 0 NVIDIA GeForce RTX 5090 sm_120" >> "$log"
echo "{no_kernel}" >> "$log"
echo "daemon: exiting" >> "$log"
sleep 1
echo "benchmark exited with error" >&2
exit 1
"""


def _flightrec(*args: str, env: dict[str, str], timeout: float = 180) -> subprocess.CompletedProcess:
    exe = str(Path(sys.executable).with_name("flightrec"))
    return subprocess.run([exe, *args], env=env, capture_output=True, text=True, timeout=timeout)


def build_pipeline_db(kafka: Any, work: Path) -> dict[str, Any]:
    """Real events: the agent runs stages against the broker, then `flightrec materialize` folds them.

    Instance ids are unique per call (the session broker is shared with other tests).
    """
    tag = uuid.uuid4().hex[:8]
    nok, ok = f"i-5090-nokernel-{tag}", f"i-h100-ok-{tag}"
    env = kafka.env(FLIGHTREC_SPOOL=str(work / "spool"), PYTHONSAFEPATH="1")
    script = work / "bench.sh"
    script.write_text(BENCH_SCRIPT.format(no_kernel=NO_KERNEL))
    daemon_log = work / "daemon.log"
    daemon_log.write_text("")
    steps = [
        (
            0,
            "agent",
            "run",
            "--instance",
            nok,
            "--stage",
            "fetch_params",
            "--",
            "echo",
            "downloading params 100% done_ok",
        ),
        (
            1,
            "agent",
            "run",
            "--instance",
            nok,
            "--stage",
            "benchmark",
            "--tail",
            str(daemon_log),
            "--",
            "sh",
            str(script),
            str(daemon_log),
        ),
        (0, "agent", "run", "--instance", ok, "--stage", "fetch_params", "--", "echo", "params ok"),
        (0, "agent", "run", "--instance", ok, "--stage", "benchmark", "--", "echo", "benchmark ok"),
        (
            0,
            "prove",
            "bench",
            "--instance",
            ok,
            "--backend",
            "cpu",
            "--k",
            "10",
            "--width",
            "4",
            "--warmup",
            "1",
            "--proofs",
            "2",
            "--min-rate",
            "1",
        ),
    ]
    for expected, *args in steps:
        done = _flightrec(*args, env=env)
        assert done.returncode == expected, f"flightrec {' '.join(args)} -> {done.returncode}: {done.stderr}"
    db = work / "fleet.duckdb"
    done = _flightrec("materialize", "--db", str(db), "--until-idle", "2", "--group", f"dash-{tag}", env=env)
    assert done.returncode == 0, f"flightrec materialize -> {done.returncode}: {done.stderr}"
    return {"no_kernel": nok, "ok": ok, "db": db, "daemon_log": str(daemon_log)}


@pytest.fixture(scope="session")
def pipeline_db(kafka: Any, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """A database materialized from real events (agent -> broker -> materializer): (path, ids)."""
    work = tmp_path_factory.mktemp("pipeline")
    ids = build_pipeline_db(kafka, work)
    con = duckdb.connect(str(ids["db"]), read_only=True)
    try:
        row = con.execute(
            "SELECT failure_id FROM failures WHERE instance_id = ? ORDER BY ts_us DESC LIMIT 1", [ids["no_kernel"]]
        ).fetchone()
    finally:
        con.close()
    assert row, f"the materializer recorded no failure for {ids['no_kernel']}"
    ids["no_kernel_failure"] = row[0]
    return ids["db"], ids


@pytest.fixture(scope="session")
def acceptance_db(pipeline_db: tuple[Path, dict[str, Any]]) -> tuple[Path, dict[str, Any]]:
    """The database the acceptance tests read: materialized from real events."""
    return pipeline_db


@pytest.fixture(scope="session")
def money_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Three instances with known prices, paid time and failures (the money views' and Cost page's tests).

    Folded from events like every other test database; the failures' ids are fa, fb1 and fb2.
    """
    path = tmp_path_factory.mktemp("money") / "fleet.duckdb"
    commit(path, money_boots())
    return path


@pytest.fixture(scope="session")
def kinds_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """money_db's instances (their kinds explained by rules, in 2025) and kind_boots' two new kinds, an hour old."""
    import time

    path = tmp_path_factory.mktemp("kinds") / "fleet.duckdb"
    commit(path, money_boots() + kind_boots(time.time_ns() // 1000))
    return path


@pytest.fixture(scope="session")
def hostile_db(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """One instance whose id and lines carry quotes, %, markdown, LaTeX, unicode and 10,000-character lines."""
    path = tmp_path_factory.mktemp("hostile") / "fleet.duckdb"
    commit(path, [hostile_boot()])
    return path, {"id": HOSTILE, "failure": first_failure_id(path, HOSTILE)}


@pytest.fixture(scope="session")
def manager_only_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A database holding only manager events: instance m-1 was rented, its agent never spoke."""
    path = tmp_path_factory.mktemp("manageronly") / "fleet.duckdb"
    commit(path, [manager_events("m-1", ("rented", BASE_US, {"price_per_hour": "0.50", "host_id": "9"}))])
    return path


@pytest.fixture(scope="session")
def empty_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A database the materializer created and never wrote a row into."""
    from flightrec.db.filestore import FileStore

    path = tmp_path_factory.mktemp("empty") / "fleet.duckdb"
    FileStore(path, group="dashboard-tests").close()
    return path
