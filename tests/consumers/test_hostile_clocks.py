"""Issue 23, hostile clocks, end to end: real agents whose clocks are an hour off, the real broker, a live
`flightrec materialize` posting to a local webhook, and the instance page."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from flightrec.db.query import run_query
from flightrec.db.views import VIEWS

from flightrec.cluster import LOG_APPEND_TIME, TIMESTAMP_TYPE, describe_topic_configs
from flightrec.errors import FlightrecError
from flightrec.settings import TOPICS

pytestmark = pytest.mark.integration
EXE = str(Path(sys.executable).with_name("flightrec"))


def _fleet(db: Path, instance: str) -> dict:
    rows = run_query(db, "SELECT * FROM fleet WHERE instance_id = ?", [instance], prelude=VIEWS).to_pylist()
    assert rows, f"{instance} is not in the fleet view"
    return rows[0]


def _wait_status(db: Path, instance: str, want: str, within: float) -> dict:
    """Poll the fleet view until ``instance`` has status ``want``; its row then (fails after ``within``)."""
    t0, last = time.monotonic(), None
    while time.monotonic() - t0 < within:
        try:
            last = _fleet(db, instance)
            if last["status"] == want:
                return last
        except (AssertionError, FlightrecError):  # not materialized yet
            pass
        time.sleep(0.2)
    raise AssertionError(f"{instance} did not become {want} within {within}s; last row: {last}")


class Counting:
    """A webhook receiver that counts posts per (instance, kind)."""

    def __init__(self) -> None:
        self.posts: Counter[tuple[str, str]] = Counter()
        self.lock = threading.Lock()
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))["flightrec"]
                with hook.lock:
                    hook.posts[(body["instance_id"], body["kind"])] += 1
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def count(self, instance: str, kind: str) -> int:
        with self.lock:
            return self.posts[(instance, kind)]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_flightrec_makes_its_topics_stamp_the_brokers_clock(kafka):
    import asyncio

    from aiokafka.admin import AIOKafkaAdminClient

    async def go() -> dict[str, dict[str, str]]:
        admin = AIOKafkaAdminClient(bootstrap_servers=kafka.bootstrap)
        await admin.start()
        try:
            return await describe_topic_configs(admin, TOPICS)
        finally:
            await admin.close()

    configs = asyncio.run(go())
    assert {t: c[TIMESTAMP_TYPE] for t, c in configs.items()} == {t: LOG_APPEND_TIME for t in TOPICS}


def test_an_hour_behind_stays_running_an_hour_ahead_is_lost_once_and_the_offset_shows(
    kafka, tmp_path, db, env_for, open_page
):
    hook = Counting()
    base = env_for(
        FLIGHTREC_HEARTBEAT_S="1", FLIGHTREC_SPOOL=str(tmp_path / "spool"), FLIGHTREC_FACTS="", PYTHONSAFEPATH="1"
    )
    behind, ahead = f"behind-{uuid.uuid4().hex[:8]}", f"ahead-{uuid.uuid4().hex[:8]}"
    offsets = {behind: "-3600", ahead: "3600"}
    kafka.seed_at_mark(db)
    mat = subprocess.Popen(
        [EXE, "materialize", "--db", str(db), "--webhook", hook.url],
        env=base,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    agents = {
        i: subprocess.Popen(
            [EXE, "agent", "run", "--instance", i, "--stage", "benchmark", "--", "sleep", "300"],
            env={**base, "FLIGHTREC_CLOCK_OFFSET_S": offsets[i]},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        for i in (behind, ahead)
    }
    try:
        for i in (behind, ahead):
            _wait_status(db, i, "running", 90)
        time.sleep(5)  # more than 3 intervals: on the instance's clock the one behind has been silent an hour
        row = _wait_status(db, behind, "running", 10)  # polled: a loaded machine may lag a moment
        assert row["clock_offset_s"] == pytest.approx(-3600, abs=30) and row["clock_skewed"]
        assert row["liveness_clock"] == "receiver"
        row = _fleet(db, ahead)
        assert row["clock_offset_s"] == pytest.approx(3600, abs=30) and row["clock_skewed"]

        os.killpg(agents[ahead].pid, signal.SIGKILL)  # no heartbeat, no exit, no seal; its clock says an hour
        killed = time.monotonic()
        row = _wait_status(db, ahead, "lost", 20)
        assert time.monotonic() - killed < 20  # 3 intervals of 1 s, plus a loaded machine's commit lag
        assert "lost contact" in row["status_detail"] and not row["status_detail"].endswith("by its own clock)")

        deadline = time.monotonic() + 60  # the writer reads the statuses every 15 s
        while hook.count(ahead, "lost") == 0 and time.monotonic() < deadline:
            time.sleep(0.5)
        assert hook.count(ahead, "lost") == 1, hook.posts
        statuses: list[str] = []
        until = time.monotonic() + 35  # two more status reads: the silence is alerted once, the heartbeats never
        while time.monotonic() < until:
            statuses.append(_fleet(db, behind)["status"])
            time.sleep(1)
        # mostly running: a materializer lagging 3 intervals on a loaded machine may show it lost for a moment
        assert statuses.count("running") >= 0.7 * len(statuses) and len(statuses) >= 10, statuses
        assert hook.count(ahead, "lost") == 1 and hook.count(behind, "lost") == 0, hook.posts
        assert _fleet(db, ahead)["status"] == "lost"
        beats = _fleet(db, behind)
        assert beats["status"] == "running"
    finally:
        for p in agents.values():
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
            p.wait(30)
        mat.terminate()
        mat.wait(60)
        hook.close()

    at = open_page(db, "instance", instance=ahead)  # the offset shows, with a warning beyond the bound
    warnings = " ".join(str(w.value) for w in at.warning)
    assert "1 h 0 min ahead" in warnings and "clock is wrong" in warnings, warnings
    at = open_page(db, "instance", instance=behind)
    warnings = " ".join(str(w.value) for w in at.warning)
    assert "behind" in warnings and ("59 min" in warnings or "1 h 0 min" in warnings), warnings


def test_topics_that_stamp_create_time_are_named_with_the_fix_and_liveness_falls_back(fresh_kafka, tmp_path, caplog):
    """An operator's cluster whose topics stamp the sender's clock: the materializer says so at start (with the
    command that fixes it), and `lost` follows the instance's clock, saying so."""
    import asyncio
    import logging

    from aiokafka.admin import AIOKafkaAdminClient, NewTopic
    from flightrec.schemas import Heartbeat, Lifecycle
    from materializer_helpers import Boot, materialize, publish

    async def recreate() -> None:
        admin = AIOKafkaAdminClient(bootstrap_servers=fresh_kafka.bootstrap)
        await admin.start()
        try:
            await admin.delete_topics(list(TOPICS))
            for _ in range(100):
                if not set(TOPICS) & set(await admin.list_topics()):
                    break
                await asyncio.sleep(0.2)
            for _ in range(100):  # deletion completes in the background: retry until the names are free
                try:
                    await admin.create_topics(
                        [
                            NewTopic(t, 2, 1, topic_configs={TIMESTAMP_TYPE: "CreateTime"})
                            for t in TOPICS
                            if t not in await admin.list_topics()
                        ]
                    )
                except Exception:  # noqa: BLE001 - TopicAlreadyExists while the old one is being removed
                    await asyncio.sleep(0.2)
                    continue
                if set(TOPICS) <= set(await admin.list_topics()):
                    break
        finally:
            await admin.close()

    asyncio.run(recreate())
    b = Boot(t0=time.time_ns() // 1000 - 3600 * 1_000_000)  # a clock an hour behind, heartbeating now
    b.facts()
    b.add(Lifecycle, stage="benchmark", state="started")
    b.add(Heartbeat, stage="benchmark", interval_s=30.0)
    publish(fresh_kafka.bootstrap, b.events)
    db = tmp_path / "f.duckdb"
    with caplog.at_level(logging.WARNING, logger="flightrec.consumers.materializer"):
        materialize(fresh_kafka, db, idle=0.5)
    said = " ".join(r.getMessage() for r in caplog.records)
    assert "sender's clock" in said and "kafka-configs.sh" in said and "LogAppendTime" in said, said
    row = _fleet(db, b.instance)
    assert row["liveness_clock"] == "instance" and row["clock_offset_s"] is None
    assert row["status"] == "lost" and row["status_detail"].endswith("by its own clock)"), row
