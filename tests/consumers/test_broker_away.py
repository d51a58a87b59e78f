"""Fault paths of the broker: none at start (a clear error), and one that goes away and comes back mid-run."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from flightrec.broker.local import free_port
from flightrec.db.query import run_query
from materializer_helpers import Boot, flightrec, publish

from flightrec.errors import QueryError

pytestmark = pytest.mark.integration


def test_no_broker_at_start_is_a_clear_error(tmp_path, env_for_no_broker):
    out = flightrec(
        "materialize",
        "--db",
        str(tmp_path / "x.duckdb"),
        "--until-idle",
        "1",
        env=env_for_no_broker,
        check=False,
        timeout=120,
    )
    assert out.returncode == 1
    assert "no Kafka broker answered" in out.stderr and "FLIGHTREC_BOOTSTRAP" in out.stderr


@pytest.fixture
def env_for_no_broker(env_for):
    return env_for(FLIGHTREC_BOOTSTRAP=f"127.0.0.1:{free_port()}")


def _wait_count(db: Path, instance: str, n: int, proc: subprocess.Popen, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    got = None
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()[1].decode()
        try:
            got = run_query(db, "SELECT count(*) AS n FROM log_lines WHERE instance_id = ?", [instance]).to_pylist()[0][
                "n"
            ]
        except QueryError:
            got = None
        if got == n:
            return
        time.sleep(0.3)
    raise AssertionError(f"expected {n} lines, saw {got}")


def test_broker_away_and_back_mid_run(fresh_kafka, tmp_path):
    db = tmp_path / "db.duckdb"
    env = fresh_kafka.env(FLIGHTREC_LOG_LEVEL="WARNING", PYTHONSAFEPATH="1")
    b = Boot()
    b.facts()
    b.lines("supervisor", "stdout", [f"before {i}" for i in range(10)])
    publish(fresh_kafka.bootstrap, b.events)
    exe = Path(sys.executable).with_name("flightrec")
    proc = subprocess.Popen(
        [str(exe), "materialize", "--db", str(db)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        _wait_count(db, b.instance, 10, proc)
        fresh_kafka.broker.stop()
        time.sleep(3)  # the materializer keeps running and keeps serving reads while the broker is away
        _wait_count(db, b.instance, 10, proc)
        fresh_kafka.broker.start()
        b.lines("supervisor", "stdout", [f"after {i}" for i in range(10)])
        b.seal()
        publish(fresh_kafka.bootstrap, b.events[-2:])
        _wait_count(db, b.instance, 20, proc, timeout=120)
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err.decode()
    assert run_query(db, "SELECT complete FROM instances WHERE instance_id = ?", [b.instance]).to_pylist() == [
        {"complete": True}
    ]
