"""Webhook alerts against a local HTTP server: one post per failure, no re-send on restart, retries only of what
certainly did not arrive, a dead server, a slow one (at most once per alert and key)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from flightrec.broker.local import free_port
from flightrec.db.query import run_query
from flightrec.db.views import stored_views
from flightrec.schemas import Heartbeat, Lifecycle
from materializer_helpers import Boot, flightrec, materialize, motivating_boot, publish

pytestmark = pytest.mark.integration


class Hook:
    """A webhook receiver: answers each POST with the next status of ``statuses`` (then 200) after ``delay``
    seconds, keeps the bodies (and each request's Idempotency-Key header in ``keys``)."""

    def __init__(self, statuses: list[int] | None = None, delay: float = 0.0) -> None:
        self.statuses = list(statuses or [])
        self.attempts: list[dict] = []
        self.delivered: list[dict] = []
        self.keys: list[str | None] = []
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                status = hook.statuses.pop(0) if hook.statuses else 200
                hook.attempts.append(body)
                hook.keys.append(self.headers.get("Idempotency-Key"))
                time.sleep(delay)
                if status == 200:
                    hook.delivered.append(body)
                self.send_response(status)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def hook() -> Iterator[Hook]:
    h = Hook()
    yield h
    h.close()


def _failed_boot() -> Boot:
    return motivating_boot()


def test_one_failure_one_post_and_a_restart_sends_nothing_again(kafka, db, hook):
    b = _failed_boot()
    publish(kafka.bootstrap, b.events)
    materialize(kafka, db, idle=0.5, webhook=hook.url)
    mine = [m for m in hook.delivered if m["flightrec"]["instance_id"] == b.instance]
    assert len(mine) == 1, hook.delivered
    msg = mine[0]
    assert b.instance in msg["text"] and "gpu_arch_unsupported" in msg["text"]
    fields = msg["flightrec"]
    assert fields["kind"] == "failed" and fields["failure_class"] == "gpu_arch_unsupported"
    assert "no kernel image" in fields["decisive_line"] and "architecture" in fields["hint"]
    assert fields["matched_line"] == fields["decisive_line"]  # the old name, kept for receivers written before
    assert fields["link"].endswith(f"failure={fields['alert_id']}")
    section = json.dumps(msg["blocks"])  # Slack blocks carry the same fields
    assert b.instance in section and "gpu_arch_unsupported" in section
    sent = run_query(db, "SELECT alert_id, sent_us FROM alerts WHERE instance_id = ?", [b.instance]).to_pylist()
    assert len(sent) == 1 and sent[0]["sent_us"] is not None

    materialize(kafka, db, idle=0.5, webhook=hook.url)  # a restart: nothing is sent twice
    assert len([m for m in hook.delivered if m["flightrec"]["instance_id"] == b.instance]) == 1


def test_a_server_unavailable_twice_gets_the_message_once(kafka, db):
    hook = Hook([503, 429])  # both say the request was not handled: retried
    try:
        b = _failed_boot()
        publish(kafka.bootstrap, b.events)
        materialize(kafka, db, idle=0.5, webhook=hook.url, alert_backoff=0.05)
        mine = [m for m in hook.delivered if m["flightrec"]["instance_id"] == b.instance]
        assert len(mine) == 1 and len(hook.attempts) >= 3
        ids = [m["flightrec"]["alert_id"] for m in hook.delivered]
        assert len(ids) == len(set(ids))  # every message delivered once, retried or not
        key = mine[0]["flightrec"]["idempotency_key"]
        assert key and hook.keys[-1] == key and set(hook.keys[:3]) == {key}  # the same key on every attempt
    finally:
        hook.close()


def test_a_server_error_is_not_sent_again(kafka, db):
    hook = Hook([500])  # the receiver may have acted before it failed: at most once
    try:
        b = _failed_boot()
        publish(kafka.bootstrap, b.events)
        materialize(kafka, db, idle=0.5, webhook=hook.url, alert_backoff=0.05)
        assert [m["flightrec"]["instance_id"] for m in hook.attempts].count(b.instance) == 1
        (row,) = run_query(
            db, "SELECT sent_us, outcome, error, attempts FROM alerts WHERE instance_id = ?", [b.instance]
        ).to_pylist()
        assert row["outcome"] == "unknown" and row["sent_us"] is None and "HTTP 500" in row["error"]
        assert row["attempts"] == 1
        materialize(kafka, db, idle=0.5, webhook=hook.url, alert_backoff=0.05)  # a restart does not send it either
        assert [m["flightrec"]["instance_id"] for m in hook.attempts].count(b.instance) == 1
    finally:
        hook.close()


def test_a_receiver_slower_than_the_timeout_gets_each_alert_once(kafka, db):
    hook = Hook(delay=4.0)  # answers 200, but only after the client gave up (1 s)
    try:
        boots = [_failed_boot(), _failed_boot()]
        publish(kafka.bootstrap, [e for b in boots for e in b.events])
        materialize(kafka, db, idle=6, webhook=hook.url, alert_backoff=0.05, alert_timeout=1.0, alert_drain=8)
        time.sleep(4.5)  # any attempt under way lands
        for b in boots:
            assert [m["flightrec"]["instance_id"] for m in hook.attempts].count(b.instance) == 1, hook.attempts
        rows = run_query(
            db,
            "SELECT outcome, error, sent_us, attempted_us FROM alerts WHERE list_contains(?, instance_id)",
            [[b.instance for b in boots]],
        ).to_pylist()
        assert [r["outcome"] for r in rows] == ["unknown", "unknown"], rows
        assert all("no answer" in r["error"] and r["attempted_us"] is None for r in rows)
        materialize(kafka, db, idle=2, webhook=hook.url, alert_timeout=1.0)  # a restart sends neither again
        time.sleep(4.5)
        for b in boots:
            assert [m["flightrec"]["instance_id"] for m in hook.attempts].count(b.instance) == 1, hook.attempts
    finally:
        hook.close()


def test_a_dead_server_does_not_stop_materialization_and_is_sent_to_later(kafka, db):
    dead = f"http://127.0.0.1:{free_port()}/hook"
    b = _failed_boot()
    publish(kafka.bootstrap, b.events)
    t0 = time.monotonic()
    materialize(kafka, db, idle=0.5, webhook=dead, alert_backoff=0.05, alert_drain=1.0)
    assert time.monotonic() - t0 < 60
    assert run_query(db, "SELECT count(*) AS n FROM failures WHERE instance_id = ?", [b.instance]).to_pylist() == [
        {"n": 1}
    ]
    (row,) = run_query(db, "SELECT sent_us FROM alerts WHERE instance_id = ?", [b.instance]).to_pylist()
    assert row["sent_us"] is None  # remembered as not sent ...
    hook = Hook()
    try:
        materialize(kafka, db, idle=0.5, webhook=hook.url)  # ... so the next run sends it
        assert [m["flightrec"]["instance_id"] for m in hook.delivered].count(b.instance) == 1
    finally:
        hook.close()


def test_an_incomplete_boot_alerts_and_alert_on_chooses(kafka, db, hook):
    gap = Boot()
    gap.stage_ok("tunnel", ["up"])
    gap.add(Lifecycle, stage="params", state="started")
    gap.seal()
    del gap.events[1]  # seq 1 never arrives
    failed = _failed_boot()
    publish(kafka.bootstrap, gap.events + failed.events)
    materialize(kafka, db, idle=0.5, webhook=hook.url, alert_on=("incomplete",))
    kinds = {(m["flightrec"]["instance_id"], m["flightrec"]["kind"]) for m in hook.delivered}
    assert (gap.instance, "incomplete") in kinds
    assert not any(i == failed.instance for i, _ in kinds)  # failures were not asked for


def test_the_materialize_command_takes_the_webhook_from_the_environment(kafka, db, hook, env_for):
    b = _failed_boot()
    publish(kafka.bootstrap, b.events)
    kafka.seed_at_mark(db)
    flightrec(
        "materialize",
        "--db",
        str(db),
        "--until-idle",
        "1",
        "--no-serve",
        "--alert-on",
        "failed",
        env=env_for(FLIGHTREC_WEBHOOK=hook.url),
    )
    assert [m["flightrec"]["instance_id"] for m in hook.delivered].count(b.instance) == 1


def test_alert_on_refuses_an_unknown_kind():
    from flightrec.consumers.alerts import KINDS, parse_kinds

    from flightrec.errors import ConfigError

    assert parse_kinds(None) == KINDS and parse_kinds("failed, incomplete") == ("failed", "incomplete")
    with pytest.raises(ConfigError, match="choose from"):
        parse_kinds("failed,explosions")


def test_a_webhook_that_is_not_a_url_is_refused_with_what_to_do():
    from flightrec.consumers.alerts import AlertConfig, Alerter

    from flightrec.errors import ConfigError

    with pytest.raises(ConfigError, match="--webhook https://"):
        Alerter(AlertConfig("hooks.example.com/abc"))


def test_an_instance_whose_heartbeats_stop_is_lost_once(kafka, db, hook):
    b = Boot(t0=time.time_ns() // 1000)  # now: alive at first, silent from here on
    b.facts()
    b.add(Lifecycle, stage="supervisor", state="started")
    for _ in range(3):
        b.add(Heartbeat, stage="supervisor", interval_s=1.0)  # lost after 3 s without a sign
    publish(kafka.bootstrap, b.events)
    materialize(kafka, db, idle=12, webhook=hook.url, views=stored_views(), status_interval=0.5)
    lost = [m for m in hook.delivered if m["flightrec"]["instance_id"] == b.instance]
    assert [m["flightrec"]["kind"] for m in lost] == ["lost"], hook.delivered
    fields = lost[0]["flightrec"]
    assert fields["failure_class"] == "lost" and "lost contact" in fields["hint"]
    assert fields["link"].endswith(f"instance={b.instance}") and b.instance in lost[0]["text"]
    (row,) = run_query(db, "SELECT alert_id, sent_us FROM alerts WHERE instance_id = ?", [b.instance]).to_pylist()
    assert row["alert_id"].startswith(f"lost:{b.instance}:{b.boot}:") and row["sent_us"]

    materialize(kafka, db, idle=6, webhook=hook.url, views=stored_views(), status_interval=0.5)  # still lost
    assert len([m for m in hook.delivered if m["flightrec"]["instance_id"] == b.instance]) == 1
