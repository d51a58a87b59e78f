"""`flightrec broker start|status|stop` as a user runs them: real processes, real broker."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from flightrec.broker.local import free_port

pytestmark = pytest.mark.integration


def flightrec(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "flightrec", *args],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONSAFEPATH": "1", **(env or {})},
        timeout=180,
    )


def test_start_status_stop_round_trip(tmp_path):
    port, data = str(free_port()), str(tmp_path / "b")
    try:
        r = flightrec("broker", "start", "--port", port, "--data", data)
        assert r.returncode == 0, r.stderr
        assert f"started on localhost:{port}" in r.stdout
        r = flightrec("broker", "start", "--port", port, "--data", data)
        assert r.returncode == 0 and "already running" in r.stdout
        r = flightrec("broker", "status", "--port", port, "--data", data)
        assert r.returncode == 0 and "running and answering" in r.stdout
        r = flightrec("topics", "create", "--bootstrap", f"localhost:{port}")
        assert r.returncode == 0 and "all topics exist" in r.stdout
    finally:
        r = flightrec("broker", "stop", "--port", port, "--data", data)
    assert r.returncode == 0 and "stopped" in r.stdout
    r = flightrec("broker", "status", "--port", port, "--data", data)
    assert r.returncode == 3 and "no broker running" in r.stdout
    r = flightrec("broker", "stop", "--port", port, "--data", data)
    assert r.returncode == 0 and "no broker running" in r.stdout


def test_fetch_reports_the_cached_jars():
    r = flightrec("broker", "fetch")
    assert r.returncode == 0 and "Kafka jars in" in r.stdout
    libs = r.stdout.split("Kafka jars in", 1)[1].strip()
    assert any(name.startswith("kafka_2.13-") for name in os.listdir(libs))


def test_a_broker_error_is_one_line_on_stderr_and_exit_1(tmp_path):
    r = flightrec("broker", "start", "--port", "9", "--data", str(tmp_path / "b"), env={"PATH": str(tmp_path)})
    assert r.returncode == 1
    assert r.stderr.startswith("flightrec broker: Java not found")
    assert "Traceback" not in r.stderr


def test_unknown_command_is_a_usage_error():
    r = flightrec("frobnicate")
    assert r.returncode == 2 and "invalid choice" in r.stderr
