"""The local broker: every event type through real Kafka, keys keep order, clear failures."""

from __future__ import annotations

import asyncio
import socket
import uuid

import pytest
from flightrec.broker import LocalBroker, check_java
from flightrec.broker.local import free_port
from flightrec.schemas import (
    TOPICS,
    BenchmarkResult,
    FileTail,
    InstanceFacts,
    Lifecycle,
    LogBatch,
    ProcessExit,
    Sealed,
    Throughput,
    decode,
    encode,
)

from flightrec.errors import BrokerError
from flightrec.settings import Settings

pytestmark = pytest.mark.integration


def _one_of_each(instance: str) -> list:
    env = lambda seq: dict(event_id=str(uuid.uuid4()), instance_id=instance, boot_id="boot-1", seq=seq, ts_us=seq)
    return [
        InstanceFacts(**env(0), gpu_model="NVIDIA RTX PRO 4000", gpu_count=1, compute_capability="12.0"),
        Lifecycle(**env(1), stage="benchmark", state="started"),
        LogBatch(
            **env(2),
            stage="benchmark",
            source="/var/log/prover.log",
            line_no=[1],
            line_ts_us=[3],
            text=["CUDA error: no kernel image is available for execution on the device"],
            truncated=[False],
            invalid_utf8=[False],
        ),
        ProcessExit(
            **env(3),
            stage="benchmark",
            argv=["bench"],
            exit_code=1,
            started_us=1,
            ended_us=2,
            duration_s=1.0,
            file_tails=(FileTail("/var/log/prover.log", ["no kernel image"]),),
        ),
        Throughput(**env(4), stage="benchmark", backend="cpu", proofs=1, seconds=2.0, proofs_per_hour=1800.0),
        BenchmarkResult(**env(5), stage="benchmark", backend="cpu", proofs_per_hour=0.0, min_rate=30.0, verdict="fail"),
        Sealed(**env(6), event_count=7),
    ]


async def _publish(bootstrap: str, events: list) -> None:
    from aiokafka import AIOKafkaProducer

    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=True)
    await producer.start()
    try:
        for e in events:
            await producer.send(e.topic, encode(e), key=e.instance_id.encode())
        await producer.flush()
    finally:
        await producer.stop()


def test_every_event_type_travels_through_the_real_broker(kafka):
    instance = f"inst-{uuid.uuid4().hex[:8]}"
    sent = _one_of_each(instance)
    asyncio.run(_publish(kafka.bootstrap, sent))
    got = [decode(m.value) for m in kafka.consume() if m.key == instance.encode()]
    assert sorted(got, key=lambda e: e.seq) == sent
    topics = {type(e).__name__: e.topic for e in sent}
    assert set(topics.values()) == set(TOPICS)


def test_a_test_reads_only_what_came_after_its_mark(kafka, topics_mark, tmp_path):
    """The session's topics hold earlier tests' events: consume() and a new database seeded by seed_at_mark()
    start at the end offsets marked before the test (tests/conftest.py), not at offset 0."""
    from flightrec.db.filestore import FileStore

    assert topics_mark == kafka.mark and kafka.mark, "the autouse fixture marked the topics"
    kafka.produce("flightrec.lifecycle", [b"before the mark"], key=b"mark-test")
    kafka.start_at_mark()  # as the fixture did before the test
    kafka.produce("flightrec.lifecycle", [b"after the mark"], key=b"mark-test")
    got = kafka.consume(("flightrec.lifecycle",))
    assert [m.value for m in got if m.key == b"mark-test"] == [b"after the mark"]
    assert all(m.offset >= kafka.mark[(m.topic, m.partition)] for m in got)  # nothing the topic held before
    db = tmp_path / "seeded.duckdb"
    kafka.seed_at_mark(db)
    store = FileStore(db, "flightrec-materializer")
    try:
        assert store.offsets() == kafka.mark
    finally:
        store.close()


def test_keys_keep_one_instances_events_on_one_partition_in_order(kafka):
    instances = [f"key-{uuid.uuid4().hex[:6]}" for _ in range(8)]
    events = []
    for seq in range(20):
        for inst in instances:
            events.append(
                Lifecycle(
                    event_id=str(uuid.uuid4()),
                    instance_id=inst,
                    boot_id="b",
                    seq=seq,
                    ts_us=seq,
                    stage="supervisor",
                    state="info",
                )
            )
    asyncio.run(_publish(kafka.bootstrap, events))
    keys = {inst.encode() for inst in instances}  # other tests' keys need not even be UTF-8
    msgs = [m for m in kafka.consume(("flightrec.lifecycle",)) if m.key in keys]
    partitions: dict[str, set[int]] = {}
    for inst in instances:
        mine = [m for m in msgs if m.key == inst.encode()]
        partitions[inst] = {m.partition for m in mine}
        assert len(partitions[inst]) == 1
        # within the partition, offsets follow seq
        by_offset = sorted(mine, key=lambda m: m.offset)
        assert [decode(m.value).seq for m in by_offset] == list(range(20))
    assert len({p for ps in partitions.values() for p in ps}) > 1, "8 keys all landed on one partition"


def test_topics_are_created_with_six_partitions_and_infinite_retention(kafka):
    async def describe():
        from aiokafka.admin import AIOKafkaAdminClient
        from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

        admin = AIOKafkaAdminClient(bootstrap_servers=kafka.bootstrap)
        await admin.start()
        try:
            meta = await admin.describe_topics(list(TOPICS))
            configs = await admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, t) for t in TOPICS])
            return meta, configs
        finally:
            await admin.close()

    meta, configs = asyncio.run(describe())
    assert {t["topic"]: len(t["partitions"]) for t in meta} == {t: 6 for t in TOPICS}
    retention = [entry for resp in configs for res in resp.resources for entry in res[4] if entry[0] == "retention.ms"]
    assert retention and all(entry[1] == "-1" for entry in retention)


def test_broker_survives_stop_and_start_keeping_its_data(fresh_kafka):
    instance = "restart-1"
    asyncio.run(_publish(fresh_kafka.bootstrap, _one_of_each(instance)[:2]))
    assert "stopped" in fresh_kafka.broker.stop()
    assert not fresh_kafka.broker.status().running
    assert "started" in fresh_kafka.broker.start()
    assert "already running" in fresh_kafka.broker.start()  # idempotent
    asyncio.run(_publish(fresh_kafka.bootstrap, _one_of_each(instance)[2:4]))
    seqs = sorted(decode(m.value).seq for m in fresh_kafka.consume() if m.key == instance.encode())
    assert seqs == [0, 1, 2, 3]


def test_two_brokers_run_side_by_side(kafka, fresh_kafka):
    assert kafka.bootstrap != fresh_kafka.bootstrap
    assert kafka.broker.status().answering and fresh_kafka.broker.status().answering


def test_port_in_use_is_a_one_line_cause(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(BrokerError, match=f"port {port} is in use"):
            LocalBroker(port=port, data=tmp_path / "b", settings=Settings.from_env({})).start()


def test_a_port_taken_by_another_broker_after_the_check_is_not_taken_for_ours(kafka, monkeypatch, tmp_path):
    # The race on a busy machine: the port was free when checked, then another broker (another test
    # session's) took it before ours bound it. Ours cannot listen; the other one answers metadata on the
    # port. Taking that for ours made a test read another session's topics (an exactly-once test then
    # counted 873,200 lines for its 600,000).
    monkeypatch.setattr("flightrec.broker.local.port_free", lambda port, host="127.0.0.1": True)
    broker = LocalBroker(port=kafka.broker.port, data=tmp_path / "b", settings=Settings.from_env({}))
    try:
        with pytest.raises(BrokerError, match=f"another Kafka .*port {kafka.broker.port}"):
            broker.start(timeout=60)
    finally:
        broker.stop()
    assert kafka.broker.status().answering  # the other broker is left alone


def test_a_broker_that_dies_on_start_reports_the_tail_of_its_log(tmp_path):
    broker = LocalBroker(port=free_port(), data=tmp_path / "b", settings=Settings.from_env({}))
    broker._write_config()
    # A corrupt KRaft metadata file makes Kafka exit at once, with the reason in its log.
    logs = tmp_path / "b" / "logs"
    logs.mkdir(parents=True)
    (logs / "meta.properties").write_text("version=1\nnode.id=99\ncluster.id=not-a-cluster\ndirectory.id=x\n")
    with pytest.raises(BrokerError) as info:
        broker.start(timeout=60)
    assert "exited with code" in str(info.value)
    assert info.value.log_tail.strip(), "the broker's own log tail is attached"
    assert "last lines of the broker log" in str(info.value)


def test_missing_java_says_what_to_install(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("JAVA_HOME", raising=False)
    with pytest.raises(BrokerError, match="Java not found"):
        check_java()


def test_old_java_is_refused(monkeypatch, tmp_path):
    fake = tmp_path / "java"
    fake.write_text("#!/bin/sh\necho 'openjdk version \"11.0.2\" 2019-01-15' >&2\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("JAVA_HOME", raising=False)
    with pytest.raises(BrokerError, match="Java 11 found"):
        check_java()


def _dash_cluster_id() -> str:
    """A valid cluster id (URL-safe base64 of 16 bytes) that begins with '-', as one in 64 random ids does."""
    import base64

    return base64.urlsafe_b64encode(b"\xf8" + uuid.uuid4().bytes[1:]).decode().rstrip("=")


def test_a_cluster_id_beginning_with_a_dash_formats(tmp_path):
    from flightrec.broker.local import fetch_kafka

    cluster_id = _dash_cluster_id()
    assert cluster_id.startswith("-")
    broker = LocalBroker(port=free_port(), data=tmp_path / "b", settings=Settings.from_env({}))
    config = broker._write_config()
    broker._format(check_java(), fetch_kafka(broker.settings), config, cluster_id=cluster_id)
    meta = (tmp_path / "b" / "logs" / "meta.properties").read_text()
    assert f"cluster.id={cluster_id}\n" in meta


def test_the_broker_log_holds_kafkas_own_info_lines(kafka):
    text = kafka.broker.log_path.read_text(errors="replace")
    assert "StaticLoggerBinder" not in text and "NOP" not in text
    assert " INFO " in text
    assert "Kafka Server started" in text


def test_a_failed_start_quotes_its_real_cause(tmp_path):
    broker = LocalBroker(port=free_port(), data=tmp_path / "b", settings=Settings.from_env({}))
    broker._write_config()
    logs = tmp_path / "b" / "logs"
    logs.mkdir(parents=True)
    (logs / "meta.properties").write_text("version=1\nnode.id=99\ncluster.id=not-a-cluster\ndirectory.id=x\n")
    with pytest.raises(BrokerError) as info:
        broker.start(timeout=60)
    first = str(info.value).splitlines()[0]
    assert "exited with code" in first
    # the cause, quoted from Kafka's own log, is on the first line
    assert "node.id" in first or "meta.properties" in first, first


def test_stop_stops_the_broker_it_started_before_its_pid_file_was_written(fresh_kafka):
    """A signal between the broker's start and its pid file (Ctrl-C in the demo) leaves no broker running."""
    broker = fresh_kafka.broker
    assert "stopped" in broker.stop()
    assert "started" in broker.start()
    proc = broker._proc
    assert proc is not None and proc.poll() is None
    try:
        (broker.data / "broker.pid").unlink()  # as if the signal came before it was written
        assert "stopped" in broker.stop()
        assert proc.poll() is not None, "the broker this object started is still running"
    finally:
        if proc.poll() is None:  # no stray broker for the rest of the suite when this fails
            proc.kill()
            proc.wait()
