"""What any writer can put on the topics, generated and written byte for byte by the raw producer (rawkafka.py):
record batches of every codec Kafka allows, any partition, keys, values (events, garbage, nothing), header names and
values of any bytes, any timestamps. Through the real consumer path: the materializer never stops, every record is
either folded or a dead letter, the stored positions are the topics' ends; and a 2-member lake group with a fleet key
stores what a file stores, whatever arrives (a host's signed events copied into other partitions included)."""

from __future__ import annotations

import asyncio
import threading
import uuid
from pathlib import Path
from typing import Any, cast

import duckdb
import pytest
from flightrec.db.trust import TrustConfig
from flightrec.schemas import Heartbeat, Lifecycle, ManagerEvent, decode, encode
from flightrec.schemas.auth import enroll, new_fleet_key, parse_fleet_key
from flightrec.schemas.topics import TOPIC_LIFECYCLE, TOPICS
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from lake_helpers import assert_lake_equals_file, run_lake, seed_lake_at_mark
from materializer_helpers import Boot, materialize
from rawkafka import CODECS, RawRecord, record_batch, send_batches

pytestmark = pytest.mark.slow
PARTITIONS = 6


def _partition_of(key: bytes) -> int:
    from aiokafka.partitioner import DefaultPartitioner

    return DefaultPartitioner()(key, list(range(PARTITIONS)), list(range(PARTITIONS)))


def _pool(prefix: str) -> list[Any]:
    """Real events of two instances, every topic: what a record's value may be besides garbage."""
    out: list[Any] = []
    for k in range(2):
        b = Boot(instance=f"{prefix}{k}")
        b.facts()
        b.stage_ok("tunnel", ["up", "ok"])
        b.add(Heartbeat, stage="supervisor", interval_s=30.0, pid=1)
        b.exit("benchmark", 1, stderr=["CUDA error"])
        b.add(Lifecycle, stage="benchmark", state="failed", detail="exit 1")
        b.seal()
        out += b.events
        out.append(
            ManagerEvent(
                event_id=str(uuid.uuid4()),
                instance_id=b.instance,
                boot_id="mgr",
                seq=0,
                ts_us=b.t0 + 1,
                source_id="m",
                kind="destroyed",
            )
        )
    return out


BYTES = st.binary(max_size=12)
HEADERS = st.lists(st.tuples(BYTES, st.one_of(st.none(), BYTES)), max_size=3).map(tuple)


def _record(data: st.DataObject, pool: list[Any]) -> RawRecord:
    ev = data.draw(st.sampled_from(pool))
    value = data.draw(
        st.one_of(
            st.just(encode(ev)),
            st.just(encode(ev)),
            st.binary(max_size=64),
            st.just(b"\xc3\x01" + encode(ev)[2:-1]),  # an Avro header with a body cut short
            st.none(),
        )
    )
    key = data.draw(st.one_of(st.just(ev.instance_id.encode()), st.none(), BYTES))
    return RawRecord(key, value, data.draw(HEADERS), data.draw(st.integers(-(2**40), 2**40)))


Batch = tuple[str, int, bytes, list[RawRecord]]  # topic, partition, the batch's bytes, its records


def _batches(data: st.DataObject, pool: list[Any]) -> list[Batch]:
    out = []
    for _ in range(data.draw(st.integers(1, 6), label="batches")):
        topic = data.draw(st.sampled_from(TOPICS))
        partition = data.draw(st.integers(0, PARTITIONS - 1))
        records = [_record(data, pool) for _ in range(data.draw(st.integers(1, 4)))]
        codec = data.draw(st.sampled_from(sorted(CODECS)))
        base = data.draw(st.integers(-(2**45), 2**45))
        out.append((topic, partition, record_batch(records, codec, base_timestamp=base), records))
    return out


Sent = dict[tuple[str, int, int], bytes | None]  # (topic, partition, offset) -> the value, of each record appended


def _send(bootstrap: str, batches: list[Batch]) -> Sent:
    """Send the batches (the test reads nothing back with a client: it may not parse them)."""
    got = asyncio.run(send_batches(bootstrap, [(t, p, b) for t, p, b, _r in batches]))
    out: Sent = {}
    for (topic, partition, _b, records), produced in zip(batches, got, strict=True):
        if produced.error_code == 0:
            out.update({(topic, partition, produced.base_offset + i): r.value for i, r in enumerate(records)})
    return out


def _assert_each_folded_or_dead(db: Path, sent: Sent) -> None:
    con = duckdb.connect(str(db), read_only=True)
    try:
        dead = {tuple(r) for r in con.execute('SELECT topic, "partition", "offset" FROM dead_letters').fetchall()}
        found = con.execute("SELECT event_id FROM events_seen UNION SELECT event_id FROM manager_events").fetchall()
        ids = {r[0] for r in found}
        stored = dict(
            ((t, p), o)
            for t, p, o in con.execute('SELECT topic, "partition", next_offset FROM consumer_offsets').fetchall()
        )
    finally:
        con.close()
    for where, value in sent.items():
        if where in dead:
            continue
        assert value is not None, f"{where}: neither a dead letter nor an event"
        assert decode(value).event_id in ids, f"{where}: neither a dead letter nor folded"
    for topic, partition, offset in sent:
        assert stored.get((topic, partition), -1) > offset, (topic, partition, offset, stored)


@settings(
    max_examples=8,
    phases=(Phase.explicit, Phase.reuse, Phase.generate),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(data=st.data())
def test_every_record_any_writer_sends_is_folded_or_a_dead_letter(kafka, tmp_path_factory, data) -> None:
    kafka.start_at_mark()
    pool = _pool(f"hp-{uuid.uuid4().hex[:6]}-")
    sent = _send(kafka.bootstrap, _batches(data, pool))
    db = tmp_path_factory.mktemp("hp") / "fr.duckdb"
    materialize(kafka, db, idle=1.0)  # never raises: it read to the end and stopped when idle
    _assert_each_folded_or_dead(db, sent)


def _signed(data: st.DataObject, fleet: bytes, pool: list[Any]) -> list[Batch]:
    """An enrolled host's events, signed for the partition of their key, and verbatim copies of some of them into
    other partitions (its key and write credential allow both)."""
    keys = {ev.instance_id: enroll(fleet, ev.instance_id, 1_700_000_000_000_000) for ev in pool}
    out = []
    for ev in pool:
        if isinstance(ev, ManagerEvent):
            continue
        key, value = ev.instance_id.encode(), encode(ev)
        home = _partition_of(key)
        copies = data.draw(st.sets(st.integers(0, PARTITIONS - 1), max_size=2), label="copies") - {home}
        header = keys[ev.instance_id].header(ev.topic, home, key, value)
        rec = RawRecord(key, value, ((header[0].encode(), header[1]),))
        out += [(ev.topic, p, record_batch([rec]), [rec]) for p in [home, *sorted(copies)]]
    return out


def _trust(fleet_hex: str) -> TrustConfig:
    """What a materializer verifies with, given a fleet key: an untagged event refused, as FLIGHTREC_UNAUTHENTICATED
    defaults to with a fleet key. (With ``accept``, an untagged verbatim copy of a tagged event in another partition
    is folded by a member that has not read its instance's tagged events, which live in another member's shard:
    a 2-member lake group may then store it twice, a file once; docs/security.md, Limits.)"""
    return TrustConfig(parse_fleet_key(fleet_hex), unauthenticated="refuse")


def _two_members(kafka: Any, db: str, data_path: str, group: str, fleet_hex: str) -> None:
    errors: list[BaseException] = []

    def member() -> None:
        try:
            run_lake(kafka, db, data_path, idle=4.0, group=group, trust=_trust(fleet_hex))
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)

    threads = [threading.Thread(target=member) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(240)
    assert not errors, errors


@settings(
    max_examples=2,
    phases=(Phase.explicit, Phase.reuse, Phase.generate),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(data=st.data())
def test_a_lake_group_equals_the_file_whatever_arrives(kafka, pg_catalog, tmp_path_factory, data) -> None:
    kafka.start_at_mark()
    fleet_hex = new_fleet_key()
    pool = _pool(f"hl-{uuid.uuid4().hex[:6]}-")
    batches = _signed(data, parse_fleet_key(fleet_hex), pool) + _batches(data, pool)
    _lake_and_file(kafka, pg_catalog, tmp_path_factory, batches, fleet_hex)
    assert TOPIC_LIFECYCLE in TOPICS


def _lake_and_file(kafka: Any, pg_catalog: Any, tmp_path_factory: Any, batches: list[Batch], fleet_hex: str) -> Path:
    """Send ``batches``; a 2-member lake group and a file read them; the lake holds the file's rows. The file."""
    _send(kafka.bootstrap, batches)
    name = f"hostile_{uuid.uuid4().hex[:8]}"
    db = pg_catalog.create_database(name)
    tmp = tmp_path_factory.mktemp("hl")
    data_path = tmp / "lake-data"
    data_path.mkdir()
    try:
        group = f"hostile-{uuid.uuid4().hex[:8]}"
        seed_lake_at_mark(kafka, db, str(data_path), group)
        _two_members(kafka, db, str(data_path), group, fleet_hex)
        file = tmp / "file.duckdb"
        materialize(kafka, file, trust=_trust(fleet_hex))
        assert_lake_equals_file(db, file)
    finally:
        pg_catalog.drop_database(name)
    return file


def _away_from_home(prefix: str) -> list[Any]:
    """A pool whose first instance's partition is not 0 (tried prefix by prefix: the partitioner decides)."""
    for k in range(100):
        pool = _pool(f"{prefix}{k}-")
        if _partition_of(pool[0].instance_id.encode()) != 0:
            return pool
    raise AssertionError("no instance id of 100 has a partition other than 0")


def test_an_untagged_copy_of_a_tagged_event_in_another_partition_leaves_the_lake_equal_to_the_file(
    kafka, pg_catalog, tmp_path_factory
) -> None:
    """The example the property above found: an instance's tagged events in its own partition, and one verbatim copy
    of its facts, untagged, in partition 0 (its key kept). A member reading partition 0 alone had never read the
    instance's tags and folded the copy: the lake held a second, unsealed row of the instance (3 instances, the
    file 2). Refused as unauthenticated, it is a dead letter in both."""
    kafka.start_at_mark()
    fleet_hex = new_fleet_key()
    pool = _away_from_home(f"hu-{uuid.uuid4().hex[:6]}-")
    facts = pool[0]
    copy = RawRecord(facts.instance_id.encode(), encode(facts), (), 0)
    batches = _signed(cast(st.DataObject, _NoCopies()), parse_fleet_key(fleet_hex), pool)
    batches.append((facts.topic, 0, record_batch([copy], "gzip", base_timestamp=0), [copy]))
    file = _lake_and_file(kafka, pg_catalog, tmp_path_factory, batches, fleet_hex)
    con = duckdb.connect(str(file), read_only=True)
    try:
        reasons = con.execute(
            'SELECT reason FROM dead_letters WHERE topic = ? AND "partition" = 0', [facts.topic]
        ).fetchall()
    finally:
        con.close()
    assert [r[0].split(":")[0] for r in reasons] == ["unauthenticated"], reasons


class _NoCopies:
    """A stand-in for Hypothesis's ``data`` in ``_signed``: no event copied into other partitions."""

    def draw(self, _strategy: Any, label: str | None = None) -> set[int]:
        return set()
