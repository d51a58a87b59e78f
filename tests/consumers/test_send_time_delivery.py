"""Through the real agent and broker: events spooled while Kafka was away and flushed seconds later carry the
flush's send time, so a right clock is not accused (the demo's h100-01); the delay itself stays visible."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from flightrec.db.query import run_query
from flightrec.db.views import VIEWS
from materializer_helpers import materialize

pytestmark = pytest.mark.integration
EXE = str(Path(sys.executable).with_name("flightrec"))
WAITED_S = 8.0


def test_events_flushed_late_by_a_right_clock_are_not_a_clock_offset(kafka, tmp_path: Path, db: Path) -> None:
    instance = f"spooled-{uuid.uuid4().hex[:8]}"
    kafka.seed_at_mark(db)
    with socket.socket() as held:  # a port nothing listens on: the network is cut
        held.bind(("127.0.0.1", 0))
        away = f"127.0.0.1:{held.getsockname()[1]}"
        env = kafka.env(
            FLIGHTREC_SPOOL=str(tmp_path / "spool"),
            FLIGHTREC_INSTANCE=instance,
            FLIGHTREC_FACTS="",
            FLIGHTREC_FLUSH_TIMEOUT="0",
            FLIGHTREC_BOOTSTRAP=away,
        )
        for state in ("started", "info", "info"):
            r = subprocess.run(
                [EXE, "agent", "event", "--stage", "supervisor", "--state", state],
                env=env,
                capture_output=True,
                timeout=120,
            )
            assert r.returncode == 0, r.stderr
    time.sleep(WAITED_S)
    r = subprocess.run(
        [EXE, "agent", "flush"],
        env={**env, "FLIGHTREC_BOOTSTRAP": kafka.bootstrap},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    materialize(kafka, db)
    waited = run_query(
        db, "SELECT min(recv_us - ts_us) / 1e6 AS s FROM events_seen WHERE instance_id = ?", [instance]
    ).to_pylist()[0]["s"]
    assert waited > WAITED_S - 1, "the events did wait in the spool"
    row = run_query(
        db, "SELECT clock_offset_s, clock_skewed FROM fleet WHERE instance_id = ?", [instance], prelude=VIEWS
    ).to_pylist()[0]
    assert abs(row["clock_offset_s"]) < 3 and not row["clock_skewed"], row
