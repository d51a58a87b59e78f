"""The materializer against the real broker: the motivating failure, instances, dead letters, duplicates, gaps."""

from __future__ import annotations

import struct
import uuid

import pytest
from flightrec.db.query import run_query
from flightrec.schemas import MAGIC, Lifecycle, LogBatch, ProcessExit, encode
from materializer_helpers import Boot, materialize, motivating_boot, publish

from flightrec.settings import TOPIC_LIFECYCLE, TOPIC_LOGS, TOPIC_METRICS, TOPICS

pytestmark = pytest.mark.integration


def one(db, sql, *params):
    rows = run_query(db, sql, list(params)).to_pylist()
    assert len(rows) == 1, rows
    return rows[0]


def test_motivating_case_failure_row_holds_the_daemon_log_line(kafka, db):
    b = motivating_boot()
    publish(kafka.bootstrap, b.events)
    stats = materialize(kafka, db)
    assert stats.lines_written >= 7

    f = one(db, "SELECT * FROM failures WHERE instance_id = ?", b.instance)
    assert f["stage"] == "benchmark"
    assert f["exit_code"] == 1
    assert f["failure_class"] == "gpu_arch_unsupported"
    assert "no kernel image is available" in f["decisive_line"] and f["matched_line"] == f["decisive_line"]
    assert f["decisive_source"] == "/var/log/prover-daemon.log" and f["rule_id"] == "no-kernel-for-gpu-arch"
    assert "architecture" in f["hint"]
    daemon = [t for t in f["file_tails"] if t["path"] == "/var/log/prover-daemon.log"]
    assert daemon and any("no kernel image" in line for line in daemon[0]["lines"])
    assert f["stderr_tail"] == ["benchmark exited with error"]
    assert f["gpu_model"] == "NVIDIA RTX PRO 4000 Blackwell" and f["compute_capability"] == "12.0"
    assert f["preceding_events"][0] == "tunnel started"
    assert f["preceding_events"][-1] == "benchmark failed benchmark exited with error"
    assert f["detail"] == "benchmark exited with error"

    i = one(db, "SELECT * FROM instances WHERE instance_id = ?", b.instance)
    assert i["failures"] == 1 and i["sealed"] and i["complete"] and i["incomplete_reason"] is None
    assert i["events"] == len(b.events) and i["boot_id"] == b.boot
    assert i["stage"] == "benchmark" and i["state"] == "sealed"
    assert i["verdict"] == "error" and i["gpu_count"] == 1
    assert i["first_event_us"] == b.events[0].ts_us and i["last_event_us"] == b.events[-1].ts_us

    lines = run_query(
        db,
        """SELECT source, line_no, text FROM log_lines WHERE instance_id = ?
                             ORDER BY seq, line_no""",
        [b.instance],
    ).to_pylist()
    daemon_lines = [r["text"] for r in lines if r["source"] == "/var/log/prover-daemon.log"]
    assert len(daemon_lines) == 4 and "no kernel image" in daemon_lines[2]


def test_cross_topic_order_does_not_matter(kafka, db):
    # The exit and the failed lifecycle of one stage arrive in either order, even in different runs.
    a, b = Boot(), Boot()
    for boot in (a, b):
        boot.facts()
        boot.add(Lifecycle, stage="params", state="started")
        boot.lines("params", "stderr", ["curl: (6) Could not resolve host: params.example"])
        boot.exit("params", 6, stderr=["curl: (6) Could not resolve host: params.example"])
        boot.add(Lifecycle, stage="params", state="failed", detail="fetch failed")
    life_a = [e for e in a.events if e.topic == TOPIC_LIFECYCLE]
    rest_a = [e for e in a.events if e.topic != TOPIC_LIFECYCLE]
    publish(kafka.bootstrap, life_a)  # a: lifecycle (failed) first...
    materialize(kafka, db, idle=0.5)
    first = one(db, "SELECT failure_class, exit_code FROM failures WHERE instance_id = ?", a.instance)
    assert first["exit_code"] is None  # ...so far only the failed lifecycle is known
    publish(kafka.bootstrap, rest_a + list(reversed(b.events)))  # b: everything in reverse
    materialize(kafka, db, idle=0.5)
    for boot in (a, b):
        f = one(db, "SELECT * FROM failures WHERE instance_id = ?", boot.instance)
        assert f["exit_code"] == 6 and f["failure_class"] == "params_download_failed", f
        assert f["failure_id"] == boot.events[3].event_id  # the exit: lowest seq revealing the failure
    assert one(db, "SELECT count(*) AS n FROM failures WHERE instance_id IN (?, ?)", a.instance, b.instance)["n"] == 2


def test_facts_arriving_after_a_failure_reach_its_row(kafka, db):
    # A boot that failed before it sent facts shows the instance's latest facts, even when those
    # arrive in a later batch (from a later boot): the row must not depend on batch boundaries.
    first = Boot()
    first.add(Lifecycle, stage="params", state="started")
    first.exit("params", 6, stderr=["curl: (6) Could not resolve host: params.example"])
    first.add(Lifecycle, stage="params", state="failed", detail="fetch failed")
    publish(kafka.bootstrap, first.events)
    materialize(kafka, db, idle=0.5)
    assert one(db, "SELECT gpu_model FROM failures WHERE instance_id = ?", first.instance)["gpu_model"] is None
    later = Boot(instance=first.instance)
    later.facts(gpu_model="NVIDIA L40S", compute_capability="8.9")
    publish(kafka.bootstrap, later.events)
    materialize(kafka, db, idle=0.5)
    f = one(db, "SELECT gpu_model, compute_capability FROM failures WHERE instance_id = ?", first.instance)
    assert f == {"gpu_model": "NVIDIA L40S", "compute_capability": "8.9"}


def test_earlier_lifecycle_events_of_other_stages_reach_preceding_events(kafka, db):
    # Lifecycle events and exits travel on different topics, so the exit revealing a failure may be
    # committed before the lifecycle events of earlier stages: the failure row must not depend on it.
    b = Boot()
    b.add(Lifecycle, stage="tunnel", state="started")
    b.add(Lifecycle, stage="tunnel", state="succeeded")
    b.add(Lifecycle, stage="benchmark", state="started")
    b.exit("benchmark", 1, stderr=["benchmark exited with error"])
    publish(kafka.bootstrap, b.events[2:])
    materialize(kafka, db, idle=0.5)
    publish(kafka.bootstrap, b.events[:2])
    materialize(kafka, db, idle=0.5)
    f = one(db, "SELECT preceding_events FROM failures WHERE instance_id = ?", b.instance)
    assert f["preceding_events"] == ["tunnel started", "tunnel succeeded", "benchmark started"]


def test_below_min_rate_is_kept_apart_from_crashes(kafka, db):
    slow, crash = Boot(), Boot()
    slow.facts()
    slow.add(Lifecycle, stage="benchmark", state="started")
    slow.benchmark(4.2, 10.0, "fail", "4.2 proofs/h < MIN_RATE 10")
    slow.exit("benchmark", 1, stderr=["warning: CUDA out of memory, retrying with a smaller batch"])
    slow.add(Lifecycle, stage="benchmark", state="failed")
    crash.facts()
    crash.add(Lifecycle, stage="benchmark", state="started")
    crash.exit("benchmark", None, signal=11, signal_name="SIGSEGV", stderr=["Segmentation fault (core dumped)"])
    publish(kafka.bootstrap, slow.events + crash.events)
    materialize(kafka, db, idle=0.5)
    s = one(db, "SELECT * FROM failures WHERE instance_id = ?", slow.instance)
    assert s["failure_class"] == "below_min_rate" and s["proofs_per_hour"] == 4.2 and s["min_rate"] == 10.0
    c = one(db, "SELECT * FROM failures WHERE instance_id = ?", crash.instance)
    assert c["failure_class"] == "daemon_crashed" and c["signal_name"] == "SIGSEGV"
    i = one(
        db,
        "SELECT proofs_per_hour, verdict, state, complete, incomplete_reason FROM instances WHERE instance_id = ?",
        slow.instance,
    )
    assert i["verdict"] == "fail" and i["proofs_per_hour"] == 4.2 and i["state"] == "failed"
    assert not i["complete"] and i["incomplete_reason"] == "not sealed"


def test_redelivered_event_counts_once(kafka, db):
    b = Boot()
    b.facts()
    batch = b.lines("supervisor", "stdout", [f"proof {i}" for i in range(50)])
    b.seal()
    publish(kafka.bootstrap, b.events + [batch, batch, b.events[0]])  # same event_ids again
    stats = materialize(kafka, db, idle=0.5)
    assert stats.duplicates_dropped >= 3
    assert one(db, "SELECT count(*) AS n FROM log_lines WHERE instance_id = ?", b.instance)["n"] == 50
    assert one(db, "SELECT count(*) AS n FROM instance_facts WHERE instance_id = ?", b.instance)["n"] == 1
    assert one(db, "SELECT events, complete FROM instances WHERE instance_id = ?", b.instance) == {
        "events": 3,
        "complete": True,
    }
    publish(kafka.bootstrap, [batch])  # and redelivered in a later run, after a commit
    materialize(kafka, db, idle=0.5)
    assert one(db, "SELECT count(*) AS n FROM log_lines WHERE instance_id = ?", b.instance)["n"] == 50


def test_gap_in_seq_leaves_instance_incomplete(kafka, db):
    b = Boot()
    b.facts()
    for k in range(6):
        b.lines("supervisor", "stdout", [f"line {k}"])
    b.seal()
    lost = {2, 3, 5}
    publish(kafka.bootstrap, [e for e in b.events if e.seq not in lost])
    materialize(kafka, db, idle=0.5)
    i = one(db, "SELECT sealed, complete, incomplete_reason FROM instances WHERE instance_id = ?", b.instance)
    assert i == {"sealed": True, "complete": False, "incomplete_reason": "missing seq 2..3, 5"}
    publish(kafka.bootstrap, [e for e in b.events if e.seq in lost])  # late arrivals complete it
    materialize(kafka, db, idle=0.5)
    i = one(db, "SELECT sealed, complete, incomplete_reason FROM instances WHERE instance_id = ?", b.instance)
    assert i == {"sealed": True, "complete": True, "incomplete_reason": None}


def _bad_messages(topic: str, instance: str) -> list[tuple[str, bytes | None, bytes | None]]:
    key = instance.encode()
    good = encode(
        LogBatch(
            event_id=str(uuid.uuid4()),
            instance_id=instance,
            boot_id="b",
            seq=0,
            ts_us=1,
            stage="s",
            source="stdout",
            line_no=[1],
            line_ts_us=[1],
            text=["x"],
            truncated=[False],
            invalid_utf8=[False],
        )
    )
    unequal = encode(
        LogBatch(
            event_id=str(uuid.uuid4()), instance_id=instance, boot_id="b", seq=0, ts_us=1, stage="s", source="stdout"
        )
    )
    # Rewrite the empty arrays: line_no gets one element while text stays empty (lengths differ).
    body = unequal[10:]
    unequal = unequal[:10] + body.replace(b"\x00\x00\x00\x00\x00", b"\x02\x02\x00\x00\x00\x00\x00", 1)
    return [
        (topic, key, b""),  # empty
        (topic, key, b"\xc3"),  # truncated header
        (topic, key, b'{"json": true, "not": "avro"}'),  # wrong magic
        (topic, key, MAGIC + struct.pack("<Q", 0xDEADBEEF) + b"\x00"),  # unknown fingerprint
        (topic, key, good[:-3]),  # truncated body
        (topic, key, good + b"\x00\x00"),  # trailing bytes
        (topic, key, unequal),  # decodes, but cannot be folded
    ]


def test_undecodable_messages_become_dead_letters_and_the_rest_is_materialized(kafka, db):
    b = Boot()
    b.facts()
    b.stage_ok("register", ["ok"])
    b.seal()
    instance_bad = f"bad-{uuid.uuid4().hex[:8]}"
    raw = [m for topic in TOPICS for m in _bad_messages(topic, instance_bad)]
    # A well-formed event on the wrong topic is a dead letter too.
    wrong = ProcessExit(
        event_id=str(uuid.uuid4()),
        instance_id=instance_bad,
        boot_id="b",
        seq=0,
        ts_us=1,
        stage="s",
        argv=["x"],
        started_us=0,
        ended_us=1,
        duration_s=0.0,
    )
    raw.append((TOPIC_METRICS, instance_bad.encode(), encode(wrong)))
    raw.append((TOPIC_LOGS, instance_bad.encode(), None))  # a tombstone
    half = len(b.events) // 2
    publish(kafka.bootstrap, b.events[:half], raw)
    publish(kafka.bootstrap, b.events[half:])
    materialize(kafka, db, idle=0.5)
    dead = run_query(
        db, "SELECT topic, reason, value FROM dead_letters WHERE key = ?", [instance_bad.encode()]
    ).to_pylist()
    assert len(dead) == len(raw)
    assert {d["topic"] for d in dead} == set(TOPICS)
    reasons = " | ".join(d["reason"] for d in dead)
    for expected in (
        "empty message",
        "truncated header",
        "magic",
        "unknown schema fingerprint",
        "does not decode",
        "trailing bytes",
        "different lengths",
        "belongs on flightrec.exits",
    ):
        assert expected in reasons, (expected, reasons)
    assert any(d["value"] == b"\xc3" for d in dead)  # the raw bytes are kept
    i = one(db, "SELECT complete, events FROM instances WHERE instance_id = ?", b.instance)
    assert i == {"complete": True, "events": len(b.events)}
    assert one(db, "SELECT count(*) AS n FROM instances WHERE instance_id = ?", instance_bad)["n"] == 0
