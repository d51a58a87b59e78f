"""`flightrec demo` stops all it started (broker, materializer, dashboard, instances) on SIGINT, SIGTERM, SIGHUP."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from flightrec.broker.local import free_port

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


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP], ids=lambda s: s.name)
def test_the_demo_stops_everything_it_started_on(sig, tmp_path):
    home = tmp_path / "demo"
    out = tmp_path / "demo.out"
    with open(out, "wb") as f:
        demo = subprocess.Popen([sys.executable, "-m", "flightrec", "demo", "--instances", "2",
                                 "--port", str(free_port()), "--dashboard-port", str(free_port()), "--home", str(home), "--supervisor-seconds", "60"],
                                stdout=f, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONSAFEPATH": "1"})
    try:
        deadline = time.monotonic() + 240
        while "fleet:" not in out.read_text(errors="replace"):  # broker, materializer and fleet are up
            assert demo.poll() is None and time.monotonic() < deadline, out.read_text(errors="replace")[-3000:]
            time.sleep(0.5)
        time.sleep(2.0)
        started = _started_by(home)
        assert len(started) >= 5, "expected the broker, the materializer, the dashboard and the instances"
        assert any("dashboard" in p for p in started), started
        demo.send_signal(sig)
        demo.wait(timeout=150)
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.wait()
    text = out.read_text(errors="replace")
    assert "Traceback" not in text, text[-3000:]
    left = []
    for _ in range(20):  # the last children may take a moment to be reaped by init
        left = _started_by(home)
        if not left:
            break
        time.sleep(0.5)
    for line in left:  # never leave strays behind, even when the assertion below fails
        try:
            os.kill(int(line.split(":")[0]), signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert left == [], f"left running after {sig.name}:\n" + "\n".join(left)
