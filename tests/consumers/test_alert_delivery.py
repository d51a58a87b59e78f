"""Webhook delivery at most once, without a broker: what each POST outcome proves, the idempotency key, one alert
per silence, and a POST left in flight by a crash is never sent again."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from flightrec.consumers import webhook
from flightrec.consumers.alerts import OUTBOX_DDL, AlertConfig, Alerter, new_silences
from flightrec.db.filestore import FileStore
from flightrec.db.fold import RawMessage, fold
from flightrec.schemas import encode
from materializer_helpers import motivating_boot


class Server:
    """Answers every POST with ``status`` after ``delay`` s (a Retry-After header with 503); counts the POSTs."""

    def __init__(self, status: int = 200, delay: float = 0.0) -> None:
        self.posts: list[tuple[dict, str | None]] = []
        srv = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                srv.posts.append((body, self.headers.get("Idempotency-Key")))
                time.sleep(delay)
                try:
                    self.send_response(status)
                    if status == 503:
                        self.send_header("Retry-After", "7")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                except OSError:
                    pass  # the client gave up

            def log_message(self, *args: object) -> None:
                pass

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.http.server_address[1]}/hook"
        threading.Thread(target=self.http.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.http.shutdown()
        self.http.server_close()


@pytest.fixture
def server_for() -> Iterator:
    made: list[Server] = []

    def make(status: int = 200, delay: float = 0.0) -> Server:
        made.append(Server(status, delay))
        return made[-1]

    yield make
    for s in made:
        s.close()


def _dead_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}/hook"  # nothing listens once closed


def test_what_each_answer_proves():
    assert [webhook.judge_status(c) for c in (200, 204, 408, 429, 503, 400, 404, 410, 500, 502, 504)] == [
        "delivered",
        "delivered",
        "retry",
        "retry",
        "retry",
        "refused",
        "refused",
        "refused",
        "unknown",
        "unknown",
        "unknown",
    ]
    key = webhook.idempotency_key("lost:i-1:b-1:1750000000000000")
    assert key == webhook.idempotency_key("lost:i-1:b-1:1750000000000000") != webhook.idempotency_key("f-2")
    assert len(key) == 36 and key.count("-") == 4  # a UUID: header-safe whatever the instance id holds
    assert webhook.idempotency_key("i\r\nX-Evil: 1").isascii()


def test_one_post_tells_delivered_refused_retry_and_unknown(server_for):
    body, key = b'{"text": "x"}', "k-1"
    ok, gone, busy, broken = server_for(200), server_for(404), server_for(503), server_for(500)
    slow = server_for(200, delay=3.0)
    assert webhook.post(ok.url, body, key, 5).outcome == "delivered" and ok.posts[0][1] == "k-1"
    assert webhook.post(gone.url, body, key, 5).outcome == "refused"
    r = webhook.post(busy.url, body, key, 5)
    assert (r.outcome, r.retry_after) == ("retry", 7.0)
    assert webhook.post(broken.url, body, key, 5).outcome == "unknown"
    r = webhook.post(slow.url, body, key, 0.5)  # sent, then no answer in time: it may have been handled
    assert r.outcome == "unknown" and "no answer" in r.why
    r = webhook.post(_dead_url(), body, key, 5)  # refused connection: certainly not received
    assert r.outcome == "retry" and "not sent" in r.why
    r = webhook.post("http://no-such-host.invalid/hook", body, key, 5)
    assert r.outcome == "retry"


def _row(instance: str, boot: str, last: int, alerted: int | None, clock: str, recorded: bool = False) -> dict:
    return {
        "instance_id": instance,
        "boot_id": boot,
        "last_sign_us": last,
        "alerted_us": alerted,
        "liveness_clock": clock,
        "recorded": recorded,
        "failure_id": f"lost:{instance}:{boot}:{last}",
    }


def test_one_alert_per_silence_whatever_the_heartbeats_say():
    first = _row("a", "b1", 100, None, "receiver")
    assert new_silences([first], set()) == [first]
    assert new_silences([{**first, "recorded": True}], set()) == []
    # receiver's clock: a later last sign received before the alert was made is the same silence (a backlog) ...
    assert new_silences([_row("a", "b1", 150, 200, "receiver")], {("a", "b1")}) == []
    # ... one received after it is a new silence, even if no look saw it alive in between
    assert len(new_silences([_row("a", "b1", 250, 200, "receiver")], {("a", "b1")})) == 1
    # instance's clock (no receive times): heartbeats of a clock behind move the sign while it stays lost: no alert
    assert new_silences([_row("c", "b3", 500, 200, "instance")], {("c", "b3")}) == []
    # seen not lost in between: a new silence
    assert len(new_silences([_row("c", "b3", 900, 200, "instance")], set())) == 1


def _store_with_a_failure(path) -> FileStore:
    """A database whose outbox exists (alerts enabled) before a failure is committed: the failure is to be sent."""
    b = motivating_boot()
    store = FileStore(path, group="alerts")
    store.con.execute(OUTBOX_DDL)
    store.commit(fold([RawMessage(e.topic, 0, n, e.instance_id.encode(), encode(e)) for n, e in enumerate(b.events)]))
    return store


def _run(store: FileStore, url: str, wait: float, **config: float) -> None:
    """An alerter's life in a materializer: start, a sync now and then for ``wait`` s, close."""
    alerter = Alerter(AlertConfig(url, backoff=0.05, drain=wait, **config))
    alerter.start(store.con)
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        alerter.sync(store.con)
        time.sleep(0.1)
    alerter.close(store.con)


def _outbox(store: FileStore) -> tuple:
    return store.con.execute("SELECT outcome, sent_us, attempts, attempted_us FROM alerts").fetchone()


@pytest.mark.slow
def test_a_slow_receiver_gets_one_post_and_a_restart_sends_nothing(tmp_path, server_for):
    slow = server_for(200, delay=2.5)  # answers, but after the client's timeout
    store = _store_with_a_failure(tmp_path / "f.duckdb")
    try:
        _run(store, slow.url, 3.0, timeout=0.5)
        time.sleep(2.5)
        assert len(slow.posts) == 1, slow.posts
        body, key = slow.posts[0]
        assert key == body["flightrec"]["idempotency_key"] == webhook.idempotency_key(body["flightrec"]["alert_id"])
        assert _outbox(store) == ("unknown", None, 1, None)
        _run(store, slow.url, 2.0, timeout=0.5)  # a restart
        time.sleep(2.5)
        assert len(slow.posts) == 1
    finally:
        store.close()


def test_a_post_in_flight_when_the_materializer_died_is_never_sent_again(tmp_path, server_for):
    ok = server_for(200)
    store = _store_with_a_failure(tmp_path / "f.duckdb")
    try:
        _run(store, _dead_url(), 0.3, max_backoff=0.05)  # recorded (and refused a connection: still to send)
        # then a sender marked it and began the POST, and the process was killed before the answer
        store.con.execute("UPDATE alerts SET attempted_us = 1")
        _run(store, ok.url, 1.5)
        assert ok.posts == []
        assert _outbox(store)[:2] == ("unknown", None)
    finally:
        store.close()


@pytest.mark.slow
def test_a_receiver_that_cannot_be_reached_is_retried_then_gets_it_once(tmp_path, server_for):
    store = _store_with_a_failure(tmp_path / "f.duckdb")
    try:
        _run(store, _dead_url(), 1.0)  # connection refused: certainly not received, left to send
        outcome, sent, attempts, attempted = _outbox(store)
        assert (outcome, sent, attempted) == (None, None, None) and attempts >= 2
        ok = server_for(200)
        _run(store, ok.url, 1.5)
        assert len(ok.posts) == 1 and _outbox(store)[0] == "delivered"
    finally:
        store.close()
