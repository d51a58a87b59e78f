"""`flightrec status` (one screen) and /health beside /metrics: the materializer's lag, last commit, how far its
input is read, disk free, dead letters and the agent versions seen; /metrics and /health on 127.0.0.1 unless asked."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest
from flightrec.broker.local import free_port

from flightrec import __version__

pytestmark = pytest.mark.integration
EXE = str(Path(sys.executable).with_name("flightrec"))


def _status(db: Path, env: dict[str, str], *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [EXE, "status", "--db", str(db), *extra], env=env, capture_output=True, text=True, timeout=120
    )


def _health(port: int) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _other_address() -> str | None:
    """An address of this host other than loopback (None where there is none)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))  # TEST-NET-1: no packet leaves, the kernel picks the outgoing address
            addr = s.getsockname()[0]
        except OSError:
            return None
    return None if addr.startswith("127.") else addr


def test_status_and_health_say_what_runs_and_what_does_not(kafka, tmp_path: Path, db: Path, env_for) -> None:
    env = env_for(FLIGHTREC_SPOOL=str(tmp_path / "spool"))
    instance = f"status-{uuid.uuid4().hex[:8]}"
    kafka.seed_at_mark(db)
    r = subprocess.run(
        [EXE, "agent", "run", "--instance", instance, "--stage", "params", "--", "true"],
        env={**env, "FLIGHTREC_FACTS": ""},
        capture_output=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    port = free_port()
    mat = subprocess.Popen(
        [EXE, "materialize", "--db", str(db), "--metrics-port", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 90
        while True:
            s = _status(db, env)
            if s.returncode == 0 or time.monotonic() > deadline:
                break
            time.sleep(1)
        assert s.returncode == 0, s.stdout + s.stderr
        assert "a materializer serves it live" in s.stdout and "healthy" in s.stdout, s.stdout
        assert f"{__version__} (1 instances)" in s.stdout, s.stdout  # the agent said its version
        assert "0 messages in Kafka not yet in the database" in s.stdout, s.stdout
        code, h = _health(port)
        assert code == 200 and h["ok"] and h["lag_messages"] == 0 and h["agent_versions"] == {__version__: 1}, h
        assert h["disk_free_bytes"] > 0 and h["caught_up_us"] and h["dead_letters"] == 0, h
        other = _other_address()
        if other is not None:  # /metrics is not served to other hosts unless asked
            with pytest.raises(OSError):
                socket.create_connection((other, port), timeout=2).close()
    finally:
        mat.terminate()
        mat.wait(60)
    s = _status(db, env, "--json")
    assert s.returncode == 3, s.stdout + s.stderr
    figures = json.loads(s.stdout)
    assert figures["serving"] is False and not figures["ok"], figures
    s = _status(db, env)
    assert "NO materializer is running" in s.stdout and f"flightrec materialize --db {db}" in s.stdout, s.stdout
