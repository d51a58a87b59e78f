"""The seed's failure exactly as it happens: the daemon's decisive line comes seconds after the script exited.

The benchmark script starts the proving daemon in the background and exits 1 at once; the daemon writes
"starting", loads for a while, then writes the line that explains everything to its own log (followed with
``--tail``) and exits. The entrypoint's exit trap seals the boot right after the agent returns; the manager
waits on the destroy gate (``flightrec wait-sealed``) and destroys the instance. Every step is the real CLI,
through the real broker and a live materializer."""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from flightrec.db.query import run_query

pytestmark = pytest.mark.integration

EXE = str(Path(sys.executable).with_name("flightrec"))
DECISIVE = "daemon: CUDA error: no kernel image is available for execution on the device"
# the daemon: started, quiet while it "loads the parameters" for $2 s, then the decisive line, exit 1
DAEMON = f"""echo "daemon: starting on GPU 0" >> "$1"
sleep "$2"
echo "{DECISIVE}" >> "$1"
exit 1
"""
# the benchmark: the daemon in the background (each way scripts start one), then a failure at once
LAUNCH = {
    "amp": '"$DAEMON" "$LOG" "$DELAY" &',
    "setsid": 'setsid "$DAEMON" "$LOG" "$DELAY" &',
    "nohup": 'nohup "$DAEMON" "$LOG" "$DELAY" > /dev/null 2>&1 &',
    "double-fork": '( "$DAEMON" "$LOG" "$DELAY" & ) &',
}
BENCHMARK = """{launch}
echo "benchmark: 0 proofs completed"
echo "benchmark exited with error" >&2
exit 1
"""


def _live_materializer(kafka: Any, db: Path, env: dict[str, str]) -> subprocess.Popen:
    kafka.seed_at_mark(db)
    return subprocess.Popen(
        [EXE, "materialize", "--db", str(db)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )


def _scene(tmp: Path, env: dict[str, str], db: Path, delay: float, launch: str, late_wait: float) -> dict[str, Any]:
    """One instance's failed benchmark, seal, gate and destroy; what each step said and when."""
    instance = f"seed-{launch}-{delay:g}-{uuid.uuid4().hex[:6]}"
    work = tmp / instance
    work.mkdir()
    daemon = work / "daemon.sh"
    daemon.write_text(DAEMON)
    daemon.chmod(0o755)
    log = work / "daemon.log"
    env = dict(
        env,
        FLIGHTREC_INSTANCE=instance,
        FLIGHTREC_SPOOL=str(tmp / "spool"),
        FLIGHTREC_FACTS="",
        FLIGHTREC_LATE_WAIT=str(late_wait),
        DAEMON=str(daemon),
        LOG=str(log),
        DELAY=str(delay),
    )
    started = time.monotonic()
    with open(work / "out", "wb") as o, open(work / "err", "wb") as e:  # files, as a container's log: the
        # late-output process passes the daemon's output on to them, and a pipe would wait for it
        run = subprocess.run(
            [
                EXE,
                "agent",
                "run",
                "--stage",
                "benchmark",
                "--tail",
                str(log),
                "--",
                "sh",
                "-c",
                BENCHMARK.format(launch=LAUNCH[launch]),
            ],
            env=env,
            stdout=o,
            stderr=e,
            timeout=120,
        )
    exited = time.monotonic()
    out: dict[str, Any] = {"instance": instance, "run": run, "run_s": exited - started}
    if delay >= 8:  # while the seal waits: the gate is not open, and says what it waits for
        gate = subprocess.Popen(
            [EXE, "wait-sealed", instance, "--db", str(db), "--timeout", str(delay / 2), "--poll", "0.2"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
    seal = subprocess.run(
        [EXE, "agent", "seal", "--reason", "entrypoint exited with 1"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    out.update(seal=seal, seal_s=time.monotonic() - exited)
    if delay >= 8:
        out["gate_done_before_seal"] = gate.poll() is not None
        out["early_gate"] = gate.communicate(timeout=60)
        out["early_gate_rc"] = gate.returncode
    gate_run = subprocess.run(
        [EXE, "wait-sealed", instance, "--db", str(db), "--timeout", "90", "--poll", "0.2"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    # right when the gate opened: the decisive line is in the database (or the seal said it stopped waiting)
    out["at_open"] = run_query(
        db, "SELECT count(*) AS n FROM log_lines WHERE instance_id = ? AND text = ?", [instance, DECISIVE]
    ).to_pylist()[0]["n"]
    out["gate"] = gate_run
    out["destroy"] = subprocess.run(
        [EXE, "manager", "event", "--instance", instance, "--kind", "destroyed"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return out


def _wait_status(db: Path, instance: str, want: str, within: float = 60.0) -> dict[str, Any]:
    deadline = time.monotonic() + within
    while True:
        rows = run_query(
            db, "SELECT status, status_detail FROM fleet WHERE instance_id = ?", [instance], prelude=_views()
        ).to_pylist()
        if rows and rows[0]["status"] == want or time.monotonic() > deadline:
            assert rows and rows[0]["status"] == want, rows
            return rows[0]
        time.sleep(0.3)


def _views() -> str:
    from flightrec.db.views import VIEWS

    return VIEWS


SCENES = [(8.0, "amp"), (4.0, "amp"), (4.0, "setsid"), (4.0, "nohup"), (4.0, "double-fork"), (2.0, "amp"), (0.5, "amp")]


def test_the_decisive_line_late_by_seconds_is_recorded_before_the_gate_opens(kafka, tmp_path: Path) -> None:
    db = tmp_path / "fr.duckdb"
    env = kafka.env(PYTHONSAFEPATH="1", FLIGHTREC_LOG_LEVEL="WARNING")
    mat = _live_materializer(kafka, db, env)
    try:
        with ThreadPoolExecutor(3) as pool:
            scenes = list(pool.map(lambda sc: _scene(tmp_path, env, db, sc[0], sc[1], late_wait=60), SCENES))
        for (delay, launch), s in zip(SCENES, scenes, strict=True):
            i, what = s["instance"], f"line {delay}s late, daemon started with {launch}"
            assert s["run"].returncode == 1, (tmp_path / i / "err").read_text()[-2000:]
            assert s["seal"].returncode == 0, s["seal"].stderr
            assert s["seal_s"] < delay + 10, f"the seal took {s['seal_s']:.1f}s ({what})"
            assert "still" not in s["seal"].stdout + s["seal"].stderr, (what, s["seal"])
            if "early_gate" in s:  # the gate during the seal's wait: not open, and it says why
                _out, err = s["early_gate"]
                assert s["early_gate_rc"] == 3, (
                    s["early_gate"],
                    what,
                    s["run_s"],
                    s["seal_s"],
                    s["gate_done_before_seal"],
                )
                assert "late output of stage benchmark" in err, (err, what)
            assert s["gate"].returncode == 0, (s["gate"].stderr, what)
            assert "complete" in s["gate"].stdout
            assert s["at_open"] == 1, f"the gate opened before the decisive line was stored ({what})"
            assert s["destroy"].returncode == 0, s["destroy"].stderr
            rows = run_query(
                db,
                """SELECT stage, source, late, seq FROM log_lines
                                    WHERE instance_id = ? AND text = ?""",
                [i, DECISIVE],
            ).to_pylist()
            log = str(tmp_path / i / "daemon.log")
            assert [(r["stage"], r["source"], r["late"]) for r in rows] == [("benchmark", log, True)], (rows, what)
            (sealed,) = run_query(
                db, "SELECT seq FROM lifecycle_events WHERE instance_id = ? AND kind = 'sealed'", [i]
            ).to_pylist()
            assert rows[0]["seq"] < sealed["seq"]  # inside the sealed count: the gate could not open without it
            (f,) = run_query(db, "SELECT stage, failure_class FROM failures WHERE instance_id = ?", [i]).to_pylist()
            assert f == {"stage": "benchmark", "failure_class": "gpu_arch_unsupported"}, (f, what)
            _wait_status(db, i, "destroyed")
    finally:
        mat.terminate()
        mat.wait(60)


def test_a_line_later_than_the_bound_is_named_by_the_seal_and_the_gate(kafka, tmp_path: Path) -> None:
    db = tmp_path / "fr.duckdb"
    env = kafka.env(PYTHONSAFEPATH="1", FLIGHTREC_LOG_LEVEL="WARNING")
    mat = _live_materializer(kafka, db, env)
    late_wait = 2.0
    try:
        s = _scene(tmp_path, env, db, 2 * late_wait, "amp", late_wait=late_wait)
    finally:
        mat.terminate()
        mat.wait(60)
    assert s["seal"].returncode == 0
    assert late_wait - 0.5 <= s["seal_s"] < late_wait + 5, s["seal_s"]
    said = s["seal"].stderr
    assert "still running when sealed" in said and "stage benchmark" in said and "daemon.sh" in said, said
    assert s["gate"].returncode == 0 and "stage benchmark" in s["gate"].stdout, s["gate"].stdout
    assert "daemon.sh" in s["gate"].stdout and "not recorded" in s["gate"].stdout, s["gate"].stdout
    assert s["at_open"] == 0
