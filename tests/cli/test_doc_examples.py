"""The shell examples of the README and docs/kafka.md run as written (on a free port instead of the one shown)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from flightrec.broker.local import free_port

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


def block(doc: str, first_line: str) -> str:
    """The ```sh block of ``doc`` whose first line starts with ``first_line``."""
    for text in re.findall(r"```sh\n(.*?)```", (ROOT / doc).read_text(), re.S):
        if text.startswith(first_line):
            return text
    raise AssertionError(f"{doc} has no sh block starting with {first_line!r}")


def run_block(text: str, shown_port: int, cwd: Path) -> subprocess.CompletedProcess:
    port = free_port()
    script = "set -euo pipefail\n" + text.replace(f"--port {shown_port}", f"--port {port}")
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
        "PYTHONSAFEPATH": "1",
        "FLIGHTREC_HOME": str(cwd / ".flightrec"),
        "FLIGHTREC_SPOOL": str(cwd / "spool"),
    }
    return subprocess.run(["bash", "-c", script], cwd=cwd, env=env, capture_output=True, text=True, timeout=400)


def test_the_sasl_ssl_example_runs_as_written(tmp_path):
    """docs/kafka.md: a SCRAM-over-TLS broker, a stage through the agent, materialized and read back (on main the
    stage was `./benchmark.sh`, which does not exist: exit 127)."""
    text = block("docs/kafka.md", "flightrec broker start --port 9094 --data .flightrec/secure --security sasl_ssl")
    r = run_block(text, 9094, tmp_path)
    try:
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        assert "benchmark" in r.stdout and "throughput" in r.stdout, r.stdout[-3000:]
        assert re.search(r"Kafka on localhost:\d+ stopped", r.stdout), r.stdout[-2000:]
    finally:
        subprocess.run(
            [sys.executable, "-m", "flightrec", "broker", "stop", "--data", str(tmp_path / ".flightrec/secure")],
            capture_output=True,
            timeout=120,
        )


def test_the_readme_local_broker_example_runs_as_written(tmp_path):
    """README: start with --data, then status and stop with --port only (they find the broker by its port)."""
    text = block("README.md", "flightrec broker start --port 9092 --data .flightrec/broker-9092")
    r = run_block(text, 9092, tmp_path)
    try:
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        assert "running and answering" in r.stdout and "stopped" in r.stdout, r.stdout
    finally:
        subprocess.run(
            [sys.executable, "-m", "flightrec", "broker", "stop", "--data", str(tmp_path / ".flightrec/broker-9092")],
            capture_output=True,
            timeout=120,
        )
