"""Failure-kind alerts: one webhook message per new or regressed kind (db/kinds.py, the failure_kinds view), never
one per failure; sent once, not again after a restart, not for history a new database reads from old topics.
The real materializer folds boots published to the real broker; a real HTTP server receives the posts."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from flightrec.db.query import run_query
from flightrec.db.views import prelude_for, stored_views
from flightrec.schemas import Lifecycle
from materializer_helpers import Boot, materialize, publish
from test_alerts import Hook

pytestmark = pytest.mark.integration

DAY_US = 24 * 3600 * 10**6
# Three kinds no rule knows, each with its own variable parts (the stage's number, a path, an address, a duration).
LINES = {
    "shards": "zorblax: shard {n} of /data/run-{n}/p.bin unreadable at offset {m}",
    "bench-{i}": "zorblax quorum gone: peer 10.0.{i}.9:70{i} answered {m} frames",
    "prove": "zorblax ledger 0x{m:x}ab turned away after {n}ms",
}


@pytest.fixture
def hook() -> Iterator[Hook]:
    h = Hook()
    yield h
    h.close()


def _failing(i: int, t0: int, stages: dict[str, str] = LINES) -> Boot:
    """One instance whose stages each fail with their own line (exit code 1..3), as the agent reports it."""
    b = Boot(t0=t0)
    b.facts()
    for code, (stage, line) in enumerate(stages.items(), start=1):
        name = stage.format(i=i)
        b.add(Lifecycle, stage=name, state="started")
        b.exit(name, code, stderr=["starting", line.format(i=i, n=7 * i + code, m=1000 * i + 31 * code)])
        b.add(Lifecycle, stage=name, state="failed", detail=f"exit code {code}")
    b.seal()
    return b


def _now_us() -> int:
    return time.time_ns() // 1000


def _kind_posts(hook: Hook) -> list[dict]:
    return [m["flightrec"] for m in hook.delivered if m["flightrec"]["kind"] == "failure_kind"]


def _kinds(db: Path, instances: list[str]) -> list[dict]:
    sql = """SELECT kind, status, failures, instances, template FROM failure_kinds
             WHERE kind IN (SELECT kind FROM failures WHERE list_contains($ids, instance_id)) ORDER BY kind"""
    return run_query(db, sql, {"ids": instances}, prelude=prelude_for(sql)).to_pylist()


def test_thirty_failures_of_three_new_kinds_make_three_alerts_and_a_restart_none(kafka, db, hook):
    boots = [_failing(i, _now_us()) for i in range(10)]
    publish(kafka.bootstrap, [e for b in boots for e in b.events])
    materialize(kafka, db, idle=1.0, webhook=hook.url, views=stored_views())
    kinds = _kinds(db, [b.instance for b in boots])
    assert [(k["status"], k["failures"], k["instances"]) for k in kinds] == [("new", 10, 10)] * 3, kinds
    posts = _kind_posts(hook)
    assert sorted(p["failure_kind"] for p in posts) == [k["kind"] for k in kinds], posts
    assert all(p["status"] == "new" and "zorblax" in p["template"] for p in posts)
    assert all(p["link"].endswith(f"kinds?kind={p['failure_kind']}") for p in posts)
    assert len([m for m in hook.delivered if m["flightrec"]["kind"] == "failed"]) == 30  # per failure, as before
    ids = run_query(db, "SELECT alert_id FROM alerts WHERE kind = 'failure_kind' AND sent_us > 0").to_pylist()
    assert len(ids) == 3

    materialize(kafka, db, idle=1.0, webhook=hook.url, views=stored_views())  # a restart sends none again
    assert len(_kind_posts(hook)) == 3
    # more failures of the same kinds: no alert; a failure of a fourth kind: one
    again = _failing(10, _now_us())
    fourth = _failing(11, _now_us(), {"verify": "zorblax verifier lost its seed {n} after {m} rounds"})
    publish(kafka.bootstrap, again.events + fourth.events)
    materialize(kafka, db, idle=1.0, webhook=hook.url, views=stored_views())
    posts = _kind_posts(hook)
    assert len(posts) == 4, posts
    assert posts[-1]["failure_kind"] not in {k["kind"] for k in kinds} and "verifier" in posts[-1]["template"]


def test_a_kind_seen_again_after_a_quiet_week_alerts_once_as_regressed(kafka, db, hook):
    stages = {"verify": "zorblax checksum {n} mismatch on block {m}"}
    old = [_failing(i, _now_us() - 9 * DAY_US, stages) for i in range(2)]  # 9 days ago, then nothing
    now = [_failing(i, _now_us(), stages) for i in range(2, 4)]
    publish(kafka.bootstrap, [e for b in old + now for e in b.events])
    materialize(kafka, db, idle=1.0, webhook=hook.url, views=stored_views())
    (kind,) = _kinds(db, [b.instance for b in old + now])
    assert kind["status"] == "regressed", kind
    posts = _kind_posts(hook)
    assert [(p["failure_kind"], p["status"]) for p in posts] == [(kind["kind"], "regressed")], posts
    later = _failing(4, _now_us(), stages)
    publish(kafka.bootstrap, later.events)
    materialize(kafka, db, idle=1.0, webhook=hook.url, views=stored_views())
    assert len(_kind_posts(hook)) == 1  # still the same regression


def test_an_old_kind_and_an_explained_one_make_no_kind_alert(kafka, db, hook):
    stages = {"verify": "zorblax checksum {n} mismatch on block {m}"}
    old = _failing(0, _now_us() - 3 * DAY_US, stages)  # ongoing: first seen 3 days ago
    explained = _failing(1, _now_us(), {"bench": "CUDA error: out of memory (tried to allocate {n} MiB)"})
    publish(kafka.bootstrap, old.events + explained.events)
    materialize(kafka, db, idle=1.0, webhook=hook.url, views=stored_views())
    statuses = sorted(k["status"] for k in _kinds(db, [old.instance, explained.instance]))
    assert statuses == ["explained", "ongoing"]
    assert _kind_posts(hook) == []


def test_kinds_in_a_database_built_from_old_topics_are_history_not_alerts(kafka, db, hook):
    boots = [_failing(i, _now_us()) for i in range(3)]  # new kinds, but Kafka received them before the first look
    publish(kafka.bootstrap, [e for b in boots for e in b.events])
    time.sleep(3)
    materialize(kafka, db, idle=1.0, webhook=hook.url, views=stored_views(), alert_max_age=2.0)
    assert _kind_posts(hook) == []
    rows = run_query(db, "SELECT sent_us, outcome, error FROM alerts WHERE kind = 'failure_kind'").to_pylist()
    assert len(rows) == 3 and all(r["sent_us"] == 0 and r["outcome"] == "historical" for r in rows), rows
    materialize(kafka, db, idle=1.0, webhook=hook.url, views=stored_views())
    assert _kind_posts(hook) == []


def test_alert_on_failure_kind_posts_only_kinds(kafka, db, hook):
    boots = [_failing(i, _now_us()) for i in range(2)]
    publish(kafka.bootstrap, [e for b in boots for e in b.events])
    materialize(kafka, db, idle=1.0, webhook=hook.url, views=stored_views(), alert_on=("failure_kind",))
    assert {m["flightrec"]["kind"] for m in hook.delivered} == {"failure_kind"}
    assert len(hook.delivered) == 3


def test_a_kind_the_per_failure_query_leaves_out_is_found_by_the_look_at_every_kind(tmp_path: Path) -> None:
    """After each commit only the kinds of the failures it added are looked at; a failure already in the outbox
    (alerted before its row was built again, under another kind: a rule changed its decisive line) is not among
    them, so its kind alerts at the next look at every kind (``kinds_interval``), not before, and once."""
    import json

    from flightrec.consumers.alerts import AlertConfig, Alerter
    from flightrec.consumers.webhook import PostResult
    from flightrec.db.filestore import FileStore
    from flightrec.db.fold import RawMessage, fold
    from flightrec.schemas import encode

    b = _failing(0, _now_us(), {"load": "zorblax shard {n} unreadable after {m} tries"})
    posted: list[dict] = []

    def post(url: str, body: bytes, key: str, timeout: float) -> PostResult:
        posted.append(json.loads(body)["flightrec"])
        return PostResult("delivered")

    store = FileStore(tmp_path / "fr.duckdb", "g")
    for stmt in stored_views():
        store.con.execute(stmt)
    alerts = Alerter(AlertConfig("http://hook.example/x", kinds_interval=2.0, drain=5.0), post=post)
    try:
        alerts.start(store.con)  # the first look at every kind: none yet
        store.commit(fold([RawMessage(e.topic, 0, n, b.instance.encode(), encode(e)) for n, e in enumerate(b.events)]))
        ((failure_id, kind),) = store.con.execute("SELECT failure_id, kind FROM failures").fetchall()
        store.con.execute(
            "INSERT INTO alerts (alert_id, kind, instance_id, created_us, sent_us) VALUES (?, 'failed', ?, 0, 0)",
            [failure_id, b.instance],
        )
        alerts.sync(store.con)
        count = "SELECT count(*) FROM alerts WHERE kind = 'failure_kind'"
        assert store.con.execute(count).fetchone() == (0,)  # not among the commit's new failures
        time.sleep(2.1)
        alerts.sync(store.con)
        alerts.sync(store.con)
        made = store.con.execute("SELECT alert_id FROM alerts WHERE kind = 'failure_kind'").fetchall()
        assert made == [(f"failure_kind:{kind}:{failure_id}",)], made
    finally:
        alerts.close(store.con)
        store.close()
    assert [(p["kind"], p["failure_kind"]) for p in posted] == [("failure_kind", kind)]
