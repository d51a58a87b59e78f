"""Record batches the Kafka client cannot parse, written byte for byte by a raw producer (rawkafka.py) with only
what a host holds (write access to the topics): a header name that is not UTF-8, batches compressed with a codec
whose library is not installed. None of them stops the materializer, a replay, the timeline or a lake group; each
record of such a batch is a dead letter (its bytes, partition, offset and why), every other record is folded, and
every partition's position is where the database says."""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path

import duckdb
import pytest
from aiokafka import codec as aiokafka_codecs
from flightrec.schemas import encode
from flightrec.schemas.topics import TOPIC_LIFECYCLE
from lake_helpers import assert_lake_equals_file, lake_count, seed_lake_at_mark
from materializer_helpers import Boot, flightrec, materialize, motivating_boot, publish
from rawkafka import CODECS, RawRecord, produce, record_batch

pytestmark = pytest.mark.integration

# the codecs aiokafka cannot read here (their library, cramjam, is not in the test venv)
UNREADABLE_CODECS = tuple(c for c in ("snappy", "lz4", "zstd") if not getattr(aiokafka_codecs, f"has_{c}")())


def _records(boot: Boot, headers: tuple[tuple[bytes, bytes | None], ...] = ()) -> list[RawRecord]:
    return [RawRecord(e.instance_id.encode(), encode(e), headers) for e in boot.events]


def _fleet(n: int, prefix: str) -> list[Boot]:
    """Healthy boots of ``n`` instances: keyed by instance id, they fill every partition."""
    boots = []
    for k in range(n):
        b = Boot(instance=f"{prefix}{k:02d}")
        b.facts()
        b.stage_ok("tunnel", [f"tunnel {k} up"])
        b.seal()
        boots.append(b)
    return boots


def _hostile(prefix: str) -> tuple[list[tuple[str, int, bytes]], list[Boot], dict[tuple[str, int], int]]:
    """The hostile batches (topic, partition, bytes); the boots whose events they carry; records per partition."""
    batches, boots, counts = [], [], {}

    def add(topic: str, partition: int, boot: Boot, codec: str = "none", bad_header_at: int | None = None) -> None:
        records = _records(boot)
        if bad_header_at is not None:
            r = records[bad_header_at]
            records[bad_header_at] = RawRecord(r.key, r.value, ((b"\xff", b"x"), (b"ok", None)))
        batches.append((topic, partition, record_batch(records, codec)))
        boots.append(boot)
        counts[(topic, partition)] = counts.get((topic, partition), 0) + len(records)

    b = Boot(instance=f"{prefix}bad-header")
    for stage in ("one", "two", "three"):
        b.stage_ok(stage)
    add(TOPIC_LIFECYCLE, 1, _only(b, TOPIC_LIFECYCLE), bad_header_at=1)
    for i, codec in enumerate(UNREADABLE_CODECS):
        c = Boot(instance=f"{prefix}{codec}")
        c.stage_ok("s", ["a line"])
        add(TOPIC_LIFECYCLE, 2 + i, _only(c, TOPIC_LIFECYCLE), codec=codec)
    return batches, boots, counts


def _only(boot: Boot, topic: str) -> Boot:
    out = Boot(instance=boot.instance, boot=boot.boot)
    out.events = [e for e in boot.events if e.topic == topic]
    return out


def _readable(prefix: str) -> tuple[list[tuple[str, int, bytes]], list[Boot]]:
    """Batches the client can read, written raw: gzip, and header names and values of any UTF-8 / bytes."""
    b = Boot(instance=f"{prefix}gzip")
    b.stage_ok("g", ["gzipped line"])
    c = Boot(instance=f"{prefix}headers")
    c.stage_ok("h")
    recs = [
        RawRecord(r.key, r.value, (("ключ".encode(), b"\xff\x00"), (b"", None)), timestamp_delta=-5)
        for r in _records(_only(c, TOPIC_LIFECYCLE))
    ]
    return [
        (TOPIC_LIFECYCLE, 0, record_batch(_records(_only(b, TOPIC_LIFECYCLE)), "gzip")),
        (TOPIC_LIFECYCLE, 0, record_batch(recs, "none", base_timestamp=-(2**40))),
    ], [_only(b, TOPIC_LIFECYCLE), _only(c, TOPIC_LIFECYCLE)]


def _count(db: Path, sql: str, *params: object) -> int:
    con = duckdb.connect(str(db), read_only=True)
    try:
        return int(con.execute(sql, list(params)).fetchone()[0])
    finally:
        con.close()


def test_unparseable_batches_are_dead_letters_and_every_other_record_is_folded(kafka, db: Path) -> None:
    prefix = f"hb-{uuid.uuid4().hex[:6]}-"
    before = _fleet(24, prefix + "a")  # fetched in the same round as the hostile batch: every partition has some
    publish(kafka.bootstrap, [e for b in before for e in b.events])
    hostile, carried, per_partition = _hostile(prefix)
    readable, gzipped = _readable(prefix)
    produce(kafka.bootstrap, hostile + readable)
    after = _fleet(12, prefix + "z")  # behind the hostile batch in its partition, and elsewhere
    publish(kafka.bootstrap, [e for b in after for e in b.events])

    materialize(kafka, db)  # before the fix: UnicodeDecodeError out of aiokafka's record parser

    good = before + after + gzipped
    sent_good = sum(len(b.events) for b in good)
    assert _count(db, "SELECT count(*) FROM events_seen WHERE starts_with(instance_id, ?)", prefix) == sent_good
    for (topic, partition), n in per_partition.items():
        dead = _count(
            db,
            'SELECT count(*) FROM dead_letters WHERE topic = ? AND "partition" = ? AND reason LIKE ?',
            topic,
            partition,
            "unreadable:%",
        )
        assert dead == n, (topic, partition)
    carried_ids = {b.instance for b in carried}
    assert not _count(
        db, "SELECT count(*) FROM events_seen WHERE list_contains(?, instance_id)", sorted(carried_ids)
    ), "no event of an unreadable batch is folded"
    sent = sent_good + sum(per_partition.values())
    folded_or_dead = _count(db, "SELECT count(*) FROM events_seen WHERE starts_with(instance_id, ?)", prefix) + _count(
        db, "SELECT count(*) FROM dead_letters WHERE reason LIKE 'unreadable:%'"
    )
    assert folded_or_dead == sent
    # every partition's stored position is the topic's end: nothing skipped, nothing left behind
    ends = kafka.end_offsets()
    assert {tp: _stored_offsets(db).get(tp) for tp in ends} == ends
    assert set(CODECS) >= set(UNREADABLE_CODECS)


def _stored_offsets(db: Path) -> dict[tuple[str, int], int]:
    con = duckdb.connect(str(db), read_only=True)
    try:
        rows = con.execute('SELECT topic, "partition", next_offset FROM consumer_offsets').fetchall()
    finally:
        con.close()
    return {(t, p): o for t, p, o in rows}


def _partition_of(key: bytes) -> int:
    from aiokafka.partitioner import DefaultPartitioner

    return DefaultPartitioner()(key, list(range(6)), list(range(6)))


def test_replay_timeline_and_the_materializer_command_read_past_an_unparseable_batch(fresh_kafka, tmp_path) -> None:
    victim = motivating_boot()
    publish(fresh_kafka.bootstrap, victim.events[:6])
    forged = Boot(instance=victim.instance)
    forged.stage_ok("forged")
    key = victim.instance.encode()
    bad = [RawRecord(r.key, r.value, ((b"\xff\xfe", b""),)) for r in _records(_only(forged, TOPIC_LIFECYCLE))]
    produce(fresh_kafka.bootstrap, [(TOPIC_LIFECYCLE, _partition_of(key), record_batch(bad))])
    publish(fresh_kafka.bootstrap, victim.events[6:])
    env = fresh_kafka.env(FLIGHTREC_LOG_LEVEL="WARNING")
    live, replayed = tmp_path / "live.duckdb", tmp_path / "replayed.duckdb"

    flightrec("materialize", "--db", str(live), "--until-idle", "2", env=env)
    flightrec("replay", "--db", str(replayed), env=env)
    for db in (live, replayed):
        n = _count(db, "SELECT count(*) FROM events_seen WHERE instance_id = ?", victim.instance)
        assert n == len(victim.events)
        assert _count(db, "SELECT count(*) FROM dead_letters WHERE reason LIKE 'unreadable:%'") == len(bad)
        assert _count(db, "SELECT count(*) FROM dead_letters WHERE instance_id = ?", victim.instance) == len(bad)
    ends = {tp: o for tp, o in fresh_kafka.end_offsets().items() if o}
    assert _stored_offsets(live) == _stored_offsets(replayed) == ends
    timeline = flightrec("timeline", victim.instance, "--from-topics", "--db", str(tmp_path / "none"), env=env)
    assert "gpu_arch_unsupported" in timeline.stdout and "forged" not in timeline.stdout


def _member(db: str, data_path: str, group: str, env: dict[str, str], log: Path) -> subprocess.Popen:
    exe = Path(sys.executable).with_name("flightrec")
    return subprocess.Popen(
        [str(exe), "materialize", "--db", db, "--data-path", data_path, "--group", group, "--until-idle", "6"],
        env={**env, "PYTHONSAFEPATH": "1", "FLIGHTREC_LOG_LEVEL": "WARNING"},
        stdout=subprocess.DEVNULL,
        stderr=log.open("ab"),
    )


def test_a_lake_group_reads_past_unparseable_batches_and_equals_the_file(kafka, lake, tmp_path) -> None:
    db, data_path = lake
    group = f"hostile-{uuid.uuid4().hex[:8]}"
    seed_lake_at_mark(kafka, db, data_path, group)
    prefix = f"hl-{uuid.uuid4().hex[:6]}-"
    before, after = _fleet(8, prefix + "a"), _fleet(8, prefix + "z")
    publish(kafka.bootstrap, [e for b in before for e in b.events])
    hostile, _carried, per_partition = _hostile(prefix)
    produce(kafka.bootstrap, hostile)
    publish(kafka.bootstrap, [e for b in after for e in b.events])
    logs = [tmp_path / "a.log", tmp_path / "b.log"]
    members = [_member(db, data_path, group, kafka.env(), log) for log in logs]
    try:
        codes = [m.wait(240) for m in members]
    finally:
        for m in members:
            if m.poll() is None:
                m.kill()
                m.wait(30)
    assert codes == [0, 0], "\n".join(log.read_text()[-3000:] for log in logs)
    dead = lake_count(db, "SELECT count(*) FROM dead_letters WHERE reason LIKE 'unreadable:%'")
    assert dead == sum(per_partition.values())
    file = tmp_path / "file.duckdb"
    materialize(kafka, file)  # from the mark, as the lake
    assert_lake_equals_file(db, file)
