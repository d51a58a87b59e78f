"""The archive (consumers/archive.py): `flightrec archive` keeps the topics' raw records in Parquet; a replay reads it
for what the topics no longer hold, then the topics from where it ends, and builds the same database."""

from __future__ import annotations

import asyncio
from pathlib import Path

import duckdb
import pytest
from aiokafka import TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, RecordsToDelete
from flightrec.consumers.archive import Archive, Segment, gaps, to_records, to_table, trim
from flightrec.db.fold import LOG_APPEND_TIME, RawMessage
from flightrec.db.location import FileLocation
from flightrec.db.rowwriter import MATERIALIZED_TABLES
from flightrec.schemas import encode
from lake_helpers import assert_lake_equals_file
from materializer_helpers import Boot, flightrec, motivating_boot, publish
from rawkafka import RawRecord, produce, record_batch

from flightrec.settings import TOPIC_LIFECYCLE, TOPIC_LOGS, TOPICS


def table(db: Path, name: str) -> list[str]:
    con = duckdb.connect(str(db), read_only=True)
    try:
        return sorted(repr(r) for r in con.execute(f"SELECT * FROM {name}").fetchall())
    finally:
        con.close()


def boots(n: int, tag: str) -> list:
    events = []
    for i in range(n):
        b = Boot(instance=f"{tag}-{i}")
        b.facts()
        b.stage_ok("params", [f"{tag} {i} fetched {k}" for k in range(20)])
        b.add_lines = b.lines("supervisor", "stdout", [f"{tag} {i} proof {k}" for k in range(50)])
        if i % 3 == 0:
            b.exit("supervisor", 1, stderr=["CUDA error: out of memory"])
        b.seal()
        events += b.events
    return events


def delete_before(bootstrap: str, offsets: dict[tuple[str, int], int]) -> None:
    """Kafka's retention played by hand: each partition's records before the offset deleted."""

    async def go() -> None:
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        await admin.start()
        try:
            await admin.delete_records({TopicPartition(t, p): RecordsToDelete(o) for (t, p), o in offsets.items()})
        finally:
            await admin.close()

    asyncio.run(go())


@pytest.mark.slow  # a broker of its own, four replays (~40 s)
def test_a_replay_from_the_archive_equals_a_replay_of_the_topics(fresh_kafka, lake, tmp_path: Path) -> None:
    archive_dir = tmp_path / "archive"
    env = fresh_kafka.env(FLIGHTREC_LOG_LEVEL="WARNING")
    raw = [
        (TOPIC_LOGS, b"garbage-key", b"\xc3\x01 not avro"),  # a dead letter, archived and replayed as one
        (TOPICS[0], b"i-x", None),  # a tombstone
    ]
    publish(fresh_kafka.bootstrap, [*motivating_boot().events, *boots(3, "early")], raw)
    flightrec("archive", "--to", str(archive_dir), "--until-idle", "1", env=env)
    publish(fresh_kafka.bootstrap, boots(3, "middle"))
    flightrec("archive", "--to", str(archive_dir), "--until-idle", "1", env=env)  # goes on from its position
    archive = Archive(str(archive_dir))
    position = archive.position()
    assert position == {tp: end for tp, end in fresh_kafka.end_offsets().items() if end}
    segments = {tp: archive.segments(*tp) for tp in archive.partitions()}
    assert sum(map(len, segments.values())) > len(position)  # a second run added segments
    assert all(gaps(segs, None) == [] and segs[0].first == 0 for segs in segments.values())  # contiguous
    publish(fresh_kafka.bootstrap, boots(5, "late"))  # only in the topics

    from_topics = tmp_path / "topics.duckdb"
    flightrec("replay", "--db", str(from_topics), env=env)

    # the topics let their first records go: half of what the archive holds of each partition
    delete_before(fresh_kafka.bootstrap, {tp: end // 2 for tp, end in position.items()})
    partial = tmp_path / "partial.duckdb"
    told = flightrec("replay", "--db", str(partial), env=env)
    assert "no longer hold offsets" in told.stderr and "FLIGHTREC_ARCHIVE" in told.stderr
    assert len(table(partial, "log_lines")) < len(table(from_topics, "log_lines"))

    from_archive = tmp_path / "archive.duckdb"
    flightrec("replay", "--db", str(from_archive), "--archive", str(archive_dir), env=env)
    for name in MATERIALIZED_TABLES:
        assert table(from_archive, name) == table(from_topics, name), name
    assert len(table(from_archive, "dead_letters")) == 2 and len(table(from_archive, "instances")) == 12
    offsets = duckdb.connect(str(from_archive), read_only=True)
    try:
        stored = dict(((t, p), o) for t, p, o in offsets.execute(
            'SELECT topic, "partition", next_offset FROM consumer_offsets').fetchall())  # fmt: skip
    finally:
        offsets.close()
    assert stored == {tp: end for tp, end in fresh_kafka.end_offsets().items() if end}

    # the same into a lake (a replay takes every shard, reads the archive, then the topics)
    lake_db, lake_data = lake
    flightrec("replay", "--db", lake_db, "--data-path", lake_data, "--archive", str(archive_dir), env=env)
    assert_lake_equals_file(lake_db, from_topics)

    # the topics let go of records the archive never had: a replay says which, and writes nothing
    ends = fresh_kafka.end_offsets()
    (topic, partition), end = next((tp, o) for tp, o in sorted(position.items()) if ends[tp] > o)
    delete_before(fresh_kafka.bootstrap, {(topic, partition): ends[(topic, partition)]})
    gap = tmp_path / "gap.duckdb"
    failed = flightrec("replay", "--db", str(gap), "--archive", str(archive_dir), env=env, check=False)
    assert failed.returncode == 1
    assert f"{topic}[{partition}] offsets {end}..{ends[(topic, partition)] - 1}" in failed.stderr
    assert "gone" in failed.stderr and not gap.exists()


def test_records_go_to_parquet_and_back_byte_for_byte(tmp_path: Path) -> None:
    records = [
        RawMessage("flightrec.logs", 3, 7, b"i-1", b"\xc3\x01\x00\xff", 1_750_000_000_123, LOG_APPEND_TIME,
                   (("flightrec-tag", b"\x01\x02"), ("other", b""))),
        RawMessage("flightrec.logs", 3, 8, None, None, None, None, ()),
    ]  # fmt: skip
    archive = Archive(str(tmp_path / "a"))
    seg = archive.write("flightrec.logs", 3, 7, 9, to_table(records))
    assert seg.name == "00000000000000000007-00000000000000000009-1750000000123.parquet"
    assert to_records(archive.read(archive.segments("flightrec.logs", 3)[0])) == records
    assert archive.position() == {("flightrec.logs", 3): 10}  # offset 9 is covered (a record purged since)
    assert not [p for p in (tmp_path / "a").rglob("*") if p.name.endswith(".tmp")]


def test_gaps_are_what_neither_holds() -> None:
    def seg(first: int, last: int) -> Segment:
        return Segment("t", 0, first, last, 0, "")

    assert gaps([seg(5, 9), seg(10, 19)], 15) == []  # history before 5 was never archived: not a gap
    assert gaps([seg(0, 9), seg(12, 19)], 15) == [(10, 11)]
    assert gaps([seg(0, 9)], 25) == [(10, 24)]
    assert gaps([seg(0, 9)], None) == []
    assert gaps([], 100) == []


def test_the_archive_keeps_its_own_days_and_its_last_segment(tmp_path: Path) -> None:
    archive = Archive(str(tmp_path / "a"))
    day = 86_400_000
    now = 1_767_225_600_000
    for k, age in enumerate((40, 35, 20, 39)):  # the last one is old too, but it holds the position
        rec = RawMessage("t", 0, k, None, b"x", now - age * day, LOG_APPEND_TIME)
        archive.write("t", 0, k, k, to_table([rec]))
    assert trim(archive, 30, now_ms=now) == 2
    assert [s.first for s in archive.segments("t", 0)] == [2, 3]
    assert archive.position() == {("t", 0): 4}


def test_a_file_location_is_not_an_archive_uri(tmp_path: Path) -> None:
    assert Archive(str(tmp_path)).local and FileLocation(tmp_path).exists()


@pytest.mark.slow  # a broker of its own, an archiver and two replays (~20 s)
def test_the_archive_keeps_batches_the_client_cannot_parse_and_replays_them_as_dead_letters(
    fresh_kafka, tmp_path: Path
) -> None:
    """A host may write a batch the Kafka client cannot parse (a header name that is not UTF-8): the archiver reads
    past it as the materializer does (consumers/batches.py), keeps its records with why they are unreadable, and a
    replay of the archive alone makes the same dead letters as a replay of the topics."""
    archive_dir = tmp_path / "archive"
    env = fresh_kafka.env(FLIGHTREC_LOG_LEVEL="WARNING")
    victim = motivating_boot()
    publish(fresh_kafka.bootstrap, victim.events[:6])
    forged = Boot(instance=victim.instance)
    forged.stage_ok("forged")
    bad = [RawRecord(e.instance_id.encode(), encode(e), ((b"\xff\xfe", b""),)) for e in forged.events
           if e.topic == TOPIC_LIFECYCLE]  # fmt: skip
    produce(fresh_kafka.bootstrap, [(TOPIC_LIFECYCLE, 0, record_batch(bad))])
    publish(fresh_kafka.bootstrap, [*victim.events[6:], *boots(2, "after")])

    flightrec("archive", "--to", str(archive_dir), "--until-idle", "1", env=env)  # before: UnicodeDecodeError
    ends = {tp: end for tp, end in fresh_kafka.end_offsets().items() if end}
    assert Archive(str(archive_dir)).position() == ends
    from_topics = tmp_path / "topics.duckdb"
    flightrec("replay", "--db", str(from_topics), env=env)
    delete_before(fresh_kafka.bootstrap, ends)  # the topics hold nothing more: the archive alone
    from_archive = tmp_path / "archive.duckdb"
    flightrec("replay", "--db", str(from_archive), "--archive", str(archive_dir), env=env)
    for name in MATERIALIZED_TABLES:
        assert table(from_archive, name) == table(from_topics, name), name
    dead = table(from_archive, "dead_letters")
    assert len(dead) == len(bad) and all("unreadable:" in d for d in dead)


@pytest.mark.slow  # a broker of its own, two materializer runs (~15 s)
def test_a_materializer_says_which_records_the_topics_let_go_before_it_read_them(fresh_kafka, tmp_path: Path) -> None:
    """A database behind what the topics still hold (a materializer stopped longer than their retention, a restored
    backup older than it): the run goes on from what Kafka holds, and says which offsets are not in the database and
    how to rebuild it from the archive."""
    env = fresh_kafka.env(FLIGHTREC_LOG_LEVEL="WARNING")
    db = tmp_path / "behind.duckdb"
    publish(fresh_kafka.bootstrap, boots(2, "first"))
    flightrec("materialize", "--db", str(db), "--until-idle", "1", env=env)
    read = {tp: end for tp, end in fresh_kafka.end_offsets().items() if end}
    publish(fresh_kafka.bootstrap, boots(2, "gone"))
    ends = fresh_kafka.end_offsets()
    delete_before(fresh_kafka.bootstrap, {tp: end for tp, end in ends.items() if end})  # gone before it was read
    publish(fresh_kafka.bootstrap, boots(1, "last"))
    told = flightrec("materialize", "--db", str(db), "--until-idle", "1", env=env)
    lost = [(tp, read.get(tp, 0), end) for tp, end in ends.items() if end > read.get(tp, 0)]
    assert lost and all(f"{t}[{p}] {start}..{end - 1}" in told.stderr for (t, p), start, end in lost if start), told
    assert "never read" in told.stderr and "--archive" in told.stderr
    instances = {r.split("'")[1] for r in table(db, "instances")}
    assert {i.split("-")[0] for i in instances} == {"first", "last"}  # what Kafka still held was read
