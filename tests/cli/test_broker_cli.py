"""`flightrec broker start|status|stop` as a user runs them: real processes, real broker."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from flightrec.broker.local import free_port

from flightrec.localservice import pid_alive

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


def test_stop_and_status_by_port_find_a_broker_started_with_its_data_elsewhere(tmp_path):
    """`broker start --port P --data DIR`, then `status --port P` and `stop --port P` without --data: they find
    DIR from the running broker, report and stop it (on main: "no broker running", exit 0, the broker kept on)."""
    port, data = str(free_port()), tmp_path / "elsewhere"
    r = flightrec("broker", "start", "--port", port, "--data", str(data))
    assert r.returncode == 0, r.stderr
    pid = int((data / "broker.pid").read_text())
    try:
        r = flightrec("broker", "status", "--port", port, env={"FLIGHTREC_HOME": str(tmp_path / "home")})
        assert r.returncode == 0 and "running and answering" in r.stdout and str(data) in r.stdout, r
        r = flightrec("broker", "stop", "--port", port, env={"FLIGHTREC_HOME": str(tmp_path / "home")})
        assert r.returncode == 0 and "stopped" in r.stdout and str(data) in r.stdout, r
        assert not pid_alive(pid), "the broker still runs"
        r = flightrec("broker", "status", "--port", port, env={"FLIGHTREC_HOME": str(tmp_path / "home")})
        assert r.returncode == 3 and "no broker running" in r.stdout, r
    finally:
        flightrec("broker", "stop", "--port", port, "--data", str(data))


def test_stop_by_port_refuses_when_another_process_holds_the_port(tmp_path):
    """A port held by something that is no broker of ours: stop and status say so and ask for --data, exit != 0."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = str(s.getsockname()[1])
        env = {"FLIGHTREC_HOME": str(tmp_path / "home")}
        r = flightrec("broker", "stop", "--port", port, env=env)
        assert r.returncode == 1 and "--data" in r.stderr and f"port {port}" in r.stderr, r
        assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
        r = flightrec("broker", "status", "--port", port, env=env)
        assert r.returncode == 3 and "--data" in r.stdout and f"port {port}" in r.stdout, r
