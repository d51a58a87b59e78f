"""Fixtures for the dashboard tests: a database written as Arrow rows into the schema.sql tables."""

from __future__ import annotations

import importlib.resources
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any, Iterator

import duckdb
import pyarrow as pa
import pytest

BASE_US = 1_748_779_200_000_000  # 2025-06-01 12:00:00 UTC
MIN = 60_000_000
NO_KERNEL = "CUDA error: no kernel image is available for execution on the device"
DAEMON_LOG = "/var/log/prover/daemon.log"
STAGES = ("tunnel", "register", "fetch_params", "benchmark", "supervisor")

FILE_TAIL = pa.struct([("path", pa.string()), ("lines", pa.list_(pa.string())), ("exists", pa.bool_())])


def schema_sql() -> str:
    """The materialized tables' DDL, as shipped in the package."""
    return importlib.resources.files("flightrec.consumers").joinpath("schema.sql").read_text()


def insert(con: duckdb.DuckDBPyConnection, table: str, rows: list[dict[str, Any]],
           schema: pa.Schema | None = None) -> None:
    """Insert rows into a schema.sql table as one Arrow batch (columns by name)."""
    data = pa.Table.from_pylist(rows, schema=schema)
    con.register("arrow_rows", data)
    con.execute(f"INSERT INTO {table} BY NAME SELECT * FROM arrow_rows")
    con.unregister("arrow_rows")


def _instance(iid: str, **kw: Any) -> dict[str, Any]:
    row = dict(instance_id=iid, boot_id=f"boot-{iid}", gpu_count=1, driver_version="570.86",
               cuda_version="12.8", host=f"host-{iid}", first_event_us=BASE_US, events=0, sealed=True,
               complete=True, failures=0, min_rate=1000.0)
    row.update(kw)
    return row


def _lifecycle(iid: str, plan: list[tuple[str, str, str]], start_us: int) -> list[dict[str, Any]]:
    rows = []
    for n, (stage, state, detail) in enumerate(plan):
        rows.append(dict(event_id=f"{iid}-lc-{n}", instance_id=iid, boot_id=f"boot-{iid}", seq=n,
                         ts_us=start_us + n * MIN, kind="lifecycle", stage=stage, state=state, detail=detail))
    return rows


def _ok_plan(last_stage: str, last_states: list[tuple[str, str]]) -> list[tuple[str, str, str]]:
    plan: list[tuple[str, str, str]] = []
    for stage in STAGES:
        if stage == last_stage:
            plan += [(stage, s, d) for s, d in last_states]
            break
        plan += [(stage, "started", ""), (stage, "succeeded", "")]
    return plan


def build_arrow_db(path: Path) -> dict[str, Any]:
    """Three instances: one proving (H100), the motivating no-kernel-image case (RTX 5090), one too slow (A100).

    Returns the ids the tests look for.
    """
    ok, nok, slow = "i-h100-ok", "i-5090-nokernel", "i-a100-slow"
    con = duckdb.connect(str(path))
    con.execute(schema_sql())
    fail_ts = BASE_US + 7 * MIN
    insert(con, "instances", [
        _instance(ok, stage="supervisor", state="started", gpu_model="NVIDIA H100 80GB HBM3", compute_capability="9.0",
                  price_per_hour=2.49, last_event_us=BASE_US + 9 * MIN, proofs_per_hour=1500.0, verdict="pass",
                  sealed=False, complete=False, incomplete_reason="not sealed", events=10),
        _instance(nok, stage="benchmark", state="failed", gpu_model="NVIDIA GeForce RTX 5090",
                  compute_capability="12.0", price_per_hour=0.89, last_event_us=fail_ts, proofs_per_hour=0.0,
                  verdict="error", failures=1, events=9),
        _instance(slow, stage="benchmark", state="failed", gpu_model="NVIDIA A100-SXM4-40GB",
                  compute_capability="8.0", price_per_hour=1.2, last_event_us=fail_ts, proofs_per_hour=640.0,
                  verdict="fail", failures=1, events=9),
    ])
    lc = (_lifecycle(ok, _ok_plan("supervisor", [("started", "")]) + [], BASE_US)
          + _lifecycle(nok, _ok_plan("benchmark", [("started", ""), ("failed", "benchmark exited with error")]), BASE_US)
          + _lifecycle(slow, _ok_plan("benchmark", [("started", ""), ("failed", "640.0 proofs/hour < MIN_RATE 1000")]),
                       BASE_US))
    insert(con, "lifecycle_events", lc)

    logs: list[dict[str, Any]] = []

    def add(iid: str, stage: str, source: str, texts: list[str], start_us: int) -> None:
        for n, text in enumerate(texts):
            logs.append(dict(instance_id=iid, boot_id=f"boot-{iid}", event_id=f"{iid}-{stage}-{source}", seq=100,
                             stage=stage, source=source, pid=42, line_no=n + 1, ts_us=start_us + n * 1_000_000,
                             text=text, truncated=False, invalid_utf8=False))

    for iid in (ok, nok, slow):
        add(iid, "fetch_params", "stdout", ["downloading params 100% done_ok"], BASE_US + 4 * MIN)
        add(iid, "benchmark", "stdout", ["starting prover daemon", "warm-up proof 1/3"], BASE_US + 6 * MIN)
    add(nok, "benchmark", "stderr", ["benchmark exited with error"], BASE_US + 6 * MIN + 30_000_000)
    add(nok, "benchmark", DAEMON_LOG, ["daemon: device 0 NVIDIA GeForce RTX 5090 sm_120", NO_KERNEL,
                                       "daemon: shutting down"], BASE_US + 6 * MIN + 10_000_000)
    add(ok, "supervisor", "stdout", [f"proof {n} done" for n in range(50)], BASE_US + 8 * MIN)
    insert(con, "log_lines", logs)

    insert(con, "process_exits", [
        dict(event_id=f"{nok}-exit", instance_id=nok, boot_id=f"boot-{nok}", seq=8, ts_us=fail_ts - 1, stage="benchmark",
             argv=["bench.sh", "--min-rate", "1000"], pid=42, exit_code=1, started_us=BASE_US + 6 * MIN,
             ended_us=fail_ts - 1, duration_s=60.0, timed_out=False, stderr_tail=["benchmark exited with error"],
             stdout_tail=["starting prover daemon", "warm-up proof 1/3"],
             file_tails=[{"path": DAEMON_LOG, "lines": ["daemon: device 0 NVIDIA GeForce RTX 5090 sm_120", NO_KERNEL,
                                                        "daemon: shutting down"], "exists": True}]),
    ])
    insert(con, "throughput", [
        dict(event_id=f"{ok}-tp-{n}", instance_id=ok, boot_id=f"boot-{ok}", seq=20 + n, ts_us=BASE_US + (6 + n) * MIN,
             kind="sample", stage="benchmark", backend="cuda", device="H100", phase="measured", proofs=25,
             seconds=60.0, proofs_per_hour=1400.0 + 50 * n)
        for n in range(3)
    ] + [
        dict(event_id=f"{ok}-result", instance_id=ok, boot_id=f"boot-{ok}", seq=30, ts_us=BASE_US + 7 * MIN,
             kind="result", stage="benchmark", proofs_per_hour=1500.0, min_rate=1000.0, verdict="pass"),
        dict(event_id=f"{slow}-result", instance_id=slow, boot_id=f"boot-{slow}", seq=30, ts_us=fail_ts - 1,
             kind="result", stage="benchmark", proofs_per_hour=640.0, min_rate=1000.0, verdict="fail"),
    ])
    insert(con, "failures", [
        dict(failure_id=f"{nok}-exit", instance_id=nok, boot_id=f"boot-{nok}", stage="benchmark", ts_us=fail_ts,
             exit_code=1, detail="benchmark exited with error", stderr_tail=["benchmark exited with error"],
             stdout_tail=["starting prover daemon", "warm-up proof 1/3"],
             file_tails=[{"path": DAEMON_LOG, "lines": ["daemon: device 0 NVIDIA GeForce RTX 5090 sm_120", NO_KERNEL,
                                                        "daemon: shutting down"], "exists": True}],
             preceding_events=["fetch_params succeeded", "benchmark started", "benchmark failed benchmark exited with error"],
             gpu_model="NVIDIA GeForce RTX 5090", compute_capability="12.0", driver_version="570.86",
             cuda_version="12.8", proofs_per_hour=0.0, min_rate=1000.0, failure_class="gpu_arch_unsupported",
             hint="The binary has no kernel for this GPU's architecture (compute capability).",
             matched_line=NO_KERNEL),
        dict(failure_id=f"{slow}-result", instance_id=slow, boot_id=f"boot-{slow}", stage="benchmark",
             ts_us=fail_ts - MIN, exit_code=0, detail="640.0 proofs/hour < MIN_RATE 1000", stderr_tail=[],
             stdout_tail=["measured 640.0 proofs/hour"], file_tails=[],
             preceding_events=["benchmark started"], gpu_model="NVIDIA A100-SXM4-40GB", compute_capability="8.0",
             proofs_per_hour=640.0, min_rate=1000.0, failure_class="below_min_rate",
             hint="The benchmark ran but measured fewer proofs/hour than MIN_RATE.", matched_line=None),
    ])
    con.close()
    return {"ok": ok, "no_kernel": nok, "slow": slow, "no_kernel_failure": f"{nok}-exit",
            "slow_failure": f"{slow}-result"}


@pytest.fixture(scope="session")
def arrow_db(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, dict[str, Any]]]:
    """A database of three instances written as Arrow rows (path, ids)."""
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
        (0, "agent", "run", "--instance", nok, "--stage", "fetch_params", "--", "echo", "downloading params 100% done_ok"),
        (1, "agent", "run", "--instance", nok, "--stage", "benchmark", "--tail", str(daemon_log), "--",
         "sh", str(script), str(daemon_log)),
        (0, "agent", "run", "--instance", ok, "--stage", "fetch_params", "--", "echo", "params ok"),
        (0, "agent", "run", "--instance", ok, "--stage", "benchmark", "--", "echo", "benchmark ok"),
        (0, "prove", "bench", "--instance", ok, "--backend", "cpu", "--k", "10", "--width", "4", "--warmup", "1",
         "--proofs", "2", "--min-rate", "1"),
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
        row = con.execute("SELECT failure_id FROM failures WHERE instance_id = ? ORDER BY ts_us DESC LIMIT 1",
                          [ids["no_kernel"]]).fetchone()
    finally:
        con.close()
    assert row, f"the materializer recorded no failure for {ids['no_kernel']}"
    ids["no_kernel_failure"] = row[0]
    return ids["db"], ids


@pytest.fixture(scope="session")
def acceptance_db(pipeline_db: tuple[Path, dict[str, Any]]) -> tuple[Path, dict[str, Any]]:
    """The database the acceptance tests read: materialized from real events."""
    return pipeline_db


@pytest.fixture
def open_page(monkeypatch: pytest.MonkeyPatch):
    """``open_page(db, page=None, **params)``: run the app on ``db``, switch to ``page_<page>.py`` with
    query parameters, and return it rendered (no exception allowed on the way)."""
    from streamlit.testing.v1 import AppTest

    from flightrec.analytics import ENTRY_SCRIPT

    def open_(db: Path, page: str | None = None, **params: str) -> AppTest:
        monkeypatch.setenv("FLIGHTREC_DB", str(db))
        at = AppTest.from_file(str(ENTRY_SCRIPT), default_timeout=120)  # a cap for a loaded machine, not a speed test
        at.run()
        assert not at.exception, at.exception
        if page:
            for k, v in params.items():
                at.query_params[k] = v
            at.switch_page(f"page_{page}.py").run()
            assert not at.exception, at.exception
        return at

    return open_


HOUR = 3_600_000_000


@pytest.fixture(scope="session")
def money_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Three instances with known prices, paid time and failures (the money views' and Cost page's tests)."""
    path = tmp_path_factory.mktemp("money") / "fleet.duckdb"
    con = duckdb.connect(str(path))
    con.execute(schema_sql())
    inst = dict(gpu_count=1, cuda_version="12.8", first_event_us=BASE_US, events=5, complete=True)
    insert(con, "instances", [
        # a: the manager rented it at $0.40/h (the facts say 0.50), failed after 1 h, sealed at 2 h
        dict(inst, instance_id="a", boot_id="ba", gpu_model="NVIDIA GeForce RTX 4090", host="h-a",
             driver_version="570.86", price_per_hour=0.50, last_event_us=BASE_US + 2 * HOUR, sealed=True, failures=1),
        # b: facts price $0.50/h, cuda_oom at 0.5 h then below_min_rate at 1 h, destroyed at 3 h (not sealed)
        dict(inst, instance_id="b", boot_id="bb", gpu_model="NVIDIA GeForce RTX 4090", host="h-b",
             driver_version="570.86", price_per_hour=0.50, last_event_us=BASE_US + HOUR, sealed=False, failures=2),
        # c: healthy H100 at $2/h, sealed at 4 h
        dict(inst, instance_id="c", boot_id="bc", gpu_model="NVIDIA H100 80GB HBM3", host="h-c",
             driver_version="550.54", price_per_hour=2.0, last_event_us=BASE_US + 4 * HOUR, sealed=True, failures=0),
    ])
    insert(con, "manager_events", [
        dict(event_id="m1", instance_id="a", boot_id="mgr", seq=0, ts_us=BASE_US, source_id="manager@ctl",
             kind="rented", detail="", attributes=[("price_per_hour", "0.40"), ("host_id", "123")]),
        dict(event_id="m2", instance_id="b", boot_id="mgr", seq=1, ts_us=BASE_US, source_id="manager@ctl",
             kind="rented", detail="", attributes=[("host_id", "456")]),
        dict(event_id="m3", instance_id="b", boot_id="mgr", seq=2, ts_us=BASE_US + 3 * HOUR, source_id="manager@ctl",
             kind="destroyed", detail="", attributes=[]),
    ], schema=pa.schema([("event_id", pa.string()), ("instance_id", pa.string()), ("boot_id", pa.string()),
                         ("seq", pa.int64()), ("ts_us", pa.int64()), ("source_id", pa.string()), ("kind", pa.string()),
                         ("detail", pa.string()), ("attributes", pa.map_(pa.string(), pa.string()))]))
    fail = dict(stage="benchmark", stderr_tail=[], stdout_tail=[], file_tails=[], preceding_events=[])
    insert(con, "failures", [
        dict(fail, failure_id="fa", instance_id="a", boot_id="ba", ts_us=BASE_US + HOUR,
             failure_class="gpu_arch_unsupported"),
        dict(fail, failure_id="fb1", instance_id="b", boot_id="bb", ts_us=BASE_US + HOUR // 2, failure_class="cuda_oom"),
        dict(fail, failure_id="fb2", instance_id="b", boot_id="bb", ts_us=BASE_US + HOUR,
             failure_class="below_min_rate"),
    ])
    con.close()
    return path
