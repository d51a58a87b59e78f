"""`flightrec demo` stops all it started (broker, materializer, dashboard, instances) on SIGINT, SIGTERM, SIGHUP."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from flightrec.broker.local import free_port
from signal_helpers import signals_lost

pytestmark = pytest.mark.integration


def _started_by(home: Path) -> list[str]:
    """Every live process whose working directory, command line or environment points into ``home``."""
    mark = str(home)
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cwd = os.readlink(f"/proc/{pid}/cwd")
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            env = Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace")
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z" and (cwd.startswith(mark) or mark in cmd or mark in env):
            found.append(f"{pid}: {cmd[:200]}")
    return found


def _kill_all(home: Path) -> list[str]:
    """SIGKILL every process started for ``home`` (the demo's own and its children); what was running."""
    left: list[str] = []
    for _ in range(20):  # the last children may take a moment to be reaped by init
        left = _started_by(home)
        if not left:
            break
        time.sleep(0.5)
    for line in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(line.split(":")[0]), signal.SIGKILL)
    return left


def _signal_the_demo(tmp_path: Path, sig: signal.Signals, when: str, after: float) -> tuple[str, list[str]]:
    """Start the demo, send ``sig`` ``after`` seconds after it prints ``when``; its output and what it left running.

    Whatever happens (the demo ignoring the signal, an assertion), nothing it started outlives the test.
    """
    home = tmp_path / "demo"
    out = tmp_path / "demo.out"
    with open(out, "wb") as f:
        demo = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "flightrec",
                "demo",
                "--instances",
                "2",
                "--port",
                str(free_port()),
                "--dashboard-port",
                str(free_port()),
                "--home",
                str(home),
                "--supervisor-seconds",
                "60",
            ],
            stdout=f,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONSAFEPATH": "1"},
        )
    try:
        deadline = time.monotonic() + 240
        while when not in out.read_text(errors="replace"):
            assert demo.poll() is None and time.monotonic() < deadline, out.read_text(errors="replace")[-3000:]
            time.sleep(0.05)
        time.sleep(after)
        if when == "fleet:":  # broker, materializer, dashboard and fleet are up
            started = _started_by(home)
            assert len(started) >= 5, "expected the broker, the materializer, the dashboard and the instances"
            assert any("dashboard" in p for p in started), started
        demo.send_signal(sig)
        try:
            demo.wait(timeout=150)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the demo did not stop within 150 s of {sig.name}:\n{out.read_text(errors='replace')[-3000:]}")
        left = _kill_all(home)
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.wait()
        _kill_all(home)  # never leave strays behind, whatever failed above
    return out.read_text(errors="replace"), left


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP], ids=lambda s: s.name)
def test_the_demo_stops_everything_it_started_on(sig, tmp_path):
    text, left = _signal_the_demo(tmp_path, sig, "fleet:", 2.0)
    assert "Traceback" not in text, text[-3000:]
    assert f"stopping ({sig.name})" in text, text[-3000:]
    assert left == [], f"left running after {sig.name}:\n" + "\n".join(left)


@pytest.mark.parametrize(
    ("when", "after"),
    [("broker:", 0.0), ("broker:", 1.0), ("materializer:", 0.0)],
    ids=["broker-up", "materializer-starting", "materializer-up"],
)
def test_ctrl_c_while_the_demo_starts_stops_what_it_started(when, after, tmp_path):
    """SIGINT as soon as the broker is up, while the materializer starts (reads on the file: DuckDB's
    own interrupt handling) and as soon as it is up stops the demo and everything it started too."""
    text, left = _signal_the_demo(tmp_path, signal.SIGINT, when, after)
    assert "Traceback" not in text, text[-3000:]
    assert "stopping (SIGINT)" in text, text[-3000:]
    assert left == [], "left running after SIGINT:\n" + "\n".join(left)


# The demo's main thread polling the materializer (progress, wait_materialized), with the demo's stop
# handling; every stop signal that reaches it says so on a line of its own.
READER = """
import sys
from flightrec.demo.system import StopSignals
from flightrec.db.query import run_query
run_query(sys.argv[1], "SELECT 1")  # imports done (a signal in a lazy import breaks the module, not the demo's point)
with StopSignals() as stops:
    print("reading", flush=True)
    stopped = None
    while True:
        try:  # the line is written inside the try: the next signal, sent once it is read, lands in here too
            while True:
                if stopped is not None:
                    print("stopped", stopped, flush=True)
                    stopped = stops.received = None
                run_query(sys.argv[1], "SELECT count(*) AS n FROM instances")
        except KeyboardInterrupt as exc:
            stopped = exc
"""


def test_no_stop_signal_is_lost_while_the_demo_reads_the_snapshot(tmp_path):
    """SIGINT/SIGTERM arriving during a read of the materializer's snapshot always reach the demo's handler.

    One that lands inside a DuckDB query comes back as "Query interrupted" (flightrec.db.query makes it a stop);
    before, through Arrow Flight, pyarrow's own handler dropped one that landed as the read ended. Each signal
    here waits for its "stopped" line before the next is sent.
    """
    lost = signals_lost(tmp_path / "flightrec.duckdb", READER, 500, 7, (b"stopped",))
    assert lost == [], f"{len(lost)} of 500 stop signals never reached the handler: {lost}"
