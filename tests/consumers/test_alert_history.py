"""Alerts that fired wrongly: a materializer restarted after its broker or itself was away posted `lost` for every
live instance before it had read its backlog, and a new database built from old topics posted every historical
failure. Now silences are judged only up to what was read, and evidence Kafka received longer ago than
FLIGHTREC_ALERT_MAX_AGE at first sight is recorded, not posted."""

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
from materializer_helpers import motivating_boot, publish

from flightrec.errors import FlightrecError

pytestmark = pytest.mark.integration
EXE = str(Path(sys.executable).with_name("flightrec"))


class Hook:
    """A webhook receiver counting posts per (instance, kind)."""

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


def _status(db: Path, instance: str) -> str | None:
    try:
        rows = run_query(db, "SELECT status FROM fleet WHERE instance_id = ?", [instance], prelude=VIEWS).to_pylist()
    except FlightrecError:
        return None
    return rows[0]["status"] if rows else None


def _wait(what, within: float) -> None:  # type: ignore[no-untyped-def]  # what: a predicate
    t0 = time.monotonic()
    while time.monotonic() - t0 < within:
        if what():
            return
        time.sleep(0.2)
    raise AssertionError(f"not within {within}s")


def test_a_restarted_materializer_posts_no_lost_before_reading_its_backlog(kafka, tmp_path: Path, db: Path, env_for):
    hook = Hook()
    env = env_for(FLIGHTREC_HEARTBEAT_S="1", FLIGHTREC_SPOOL=str(tmp_path / "spool"), FLIGHTREC_FACTS="")
    alive = f"alive-{uuid.uuid4().hex[:8]}"
    kafka.seed_at_mark(db)

    def materializer() -> subprocess.Popen:
        return subprocess.Popen(
            [EXE, "materialize", "--db", str(db), "--webhook", hook.url],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    mat = materializer()
    agent = subprocess.Popen(
        [EXE, "agent", "run", "--instance", alive, "--stage", "supervisor", "--", "sleep", "300"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        _wait(lambda: _status(db, alive) == "running", 90)
        mat.send_signal(signal.SIGTERM)
        assert mat.wait(60) == 0
        time.sleep(8)  # the materializer away for more than 3 heartbeat intervals; the agent beats on
        mat = materializer()
        _wait(lambda: _status(db, alive) == "running", 60)  # read live through the new materializer
        time.sleep(6)  # its first status reads (at start and after) are done
        assert hook.count(alive, "lost") == 0, hook.posts
        # a real loss is still told
        os.killpg(agent.pid, signal.SIGKILL)
        _wait(lambda: _status(db, alive) == "lost", 60)
        _wait(lambda: hook.count(alive, "lost") == 1, 60)  # the next status read (every 15 s) posts it
    finally:
        with_pid = [p for p in (mat, agent) if p.poll() is None]
        for p in with_pid:
            p.kill()
            p.wait(30)
        hook.server.shutdown()


def test_a_database_built_from_old_topics_posts_no_history(kafka, tmp_path: Path, env_for) -> None:
    hook = Hook()
    env = env_for(FLIGHTREC_ALERT_MAX_AGE="20")  # far above a loaded machine's start of a materializer
    old = motivating_boot()
    mark = kafka.mark
    publish(kafka.bootstrap, old.events)
    time.sleep(22)  # older than FLIGHTREC_ALERT_MAX_AGE by the time a new database first sees it
    db = tmp_path / "rebuilt.duckdb"
    kafka.mark = mark
    kafka.seed_at_mark(db)
    r = subprocess.run(
        [EXE, "materialize", "--db", str(db), "--webhook", hook.url, "--until-idle", "2"],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert hook.count(old.instance, "failed") == 0, hook.posts
    rows = run_query(
        db, "SELECT kind, sent_us, outcome, error FROM alerts WHERE instance_id = ?", [old.instance]
    ).to_pylist()
    assert rows and all(r["outcome"] == "historical" and r["sent_us"] == 0 for r in rows), rows
    assert "FLIGHTREC_ALERT_MAX_AGE" in rows[0]["error"]
    # a failure seen as it happens is posted
    new = motivating_boot()
    publish(kafka.bootstrap, new.events)
    r = subprocess.run(
        [EXE, "materialize", "--db", str(db), "--webhook", hook.url, "--until-idle", "2"],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert hook.count(new.instance, "failed") == 1, hook.posts
    hook.server.shutdown()
