"""Untrusted hosts: the fold believes an event only with a valid tag from a key that may write it (db/trust.py)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from flightrec.db.filestore import FileStore
from flightrec.db.fold import LOG_APPEND_TIME, RawMessage, fold
from flightrec.db.trust import Trust, TrustConfig, load_state
from flightrec.schemas import Event, Heartbeat, Lifecycle, ManagerEvent, Sealed, decode, encode
from flightrec.schemas.auth import (
    HEADER,
    Signer,
    enroll,
    first_version_tag,
    new_fleet_key,
    parse_fleet_key,
    tag,
    verify,
)
from materializer_helpers import Boot

from flightrec.errors import ConfigError

FLEET = parse_fleet_key(new_fleet_key())
T_ENROLL = 1_700_000_000_000_000


def _msg(ev: Event, offset: int, signer: Signer | None, recv_ms: int | None = None) -> RawMessage:
    key, value = ev.instance_id.encode(), encode(ev)
    headers = (signer.header(ev.topic, 0, key, value),) if signer else ()
    return RawMessage(ev.topic, 0, offset, key, value, recv_ms, LOG_APPEND_TIME if recv_ms else None, headers)


def _trust(mode: str = "refuse") -> Trust:
    return Trust(TrustConfig(FLEET, mode))  # type: ignore[arg-type]  # the literal is one of the two modes


@pytest.fixture
def store(tmp_path: Path):
    s = FileStore(tmp_path / "fr.duckdb", "g")
    yield s
    s.close()


def _manager(instance: str, kind: str, ts_us: int) -> ManagerEvent:
    return ManagerEvent(
        event_id=f"m-{instance}-{kind}-{ts_us}",
        instance_id=instance,
        boot_id="manager-boot",
        seq=0,
        ts_us=ts_us,
        source_id="manager@test",
        kind=kind,
    )


def test_a_tag_proves_its_key_and_nothing_else() -> None:
    a = enroll(FLEET, "inst-a", T_ENROLL)
    value = b"\xc3\x01payload"
    _, header = a.header("flightrec.logs", 0, b"inst-a", value)
    assert verify(FLEET, header, "flightrec.logs", 0, b"inst-a", value).instance_id == "inst-a"
    for topic, key, val in (("flightrec.exits", b"inst-a", value), ("flightrec.logs", b"x", value)):
        assert verify(FLEET, header, topic, 0, key, val).problem, "the tag covers the topic and the key"
    assert verify(FLEET, header, "flightrec.logs", 0, b"inst-a", value + b"!").problem, "and the value"
    other_fleet = parse_fleet_key(new_fleet_key())
    assert verify(other_fleet, header, "flightrec.logs", 0, b"inst-a", value).problem
    # a host that knows its own secret cannot make a key id of another instance verify
    b_id = a.key_id.replace("inst-a", "inst-b")
    forged = f"{b_id} {tag(a.secret, 'flightrec.logs', 0, b'inst-a', value)}".encode()
    assert verify(FLEET, forged, "flightrec.logs", 0, b"inst-a", value).problem
    assert verify(FLEET, b"\xff\xfe", "flightrec.logs", 0, None, value).problem
    assert verify(FLEET, None, "flightrec.logs", 0, None, value).key_id is None


def test_a_tag_binds_the_partition_its_writer_chose() -> None:
    a = enroll(FLEET, "inst-a", T_ENROLL)
    value = b"\xc3\x01payload"
    for partition in (0, 5, 11):  # any partition any partitioner picks, and partitions added since
        _, header = a.header("flightrec.logs", partition, b"inst-a", value)
        assert verify(FLEET, header, "flightrec.logs", partition, b"inst-a", value).valid
        other = verify(FLEET, header, "flightrec.logs", partition + 1, b"inst-a", value)
        assert other.problem and f"for partition {partition + 1}" in other.problem
    # bytes moved between the key and the value change the tag (the key's length is in it)
    _, header = a.header("flightrec.logs", 0, b"inst-a\x00", b"x" + value)
    assert verify(FLEET, header, "flightrec.logs", 0, b"inst-a", b"\x00x" + value).problem
    # a tag of the first version (no partition) is refused, and says why
    old = f"{a.key_id} {first_version_tag(a.secret, 'flightrec.logs', b'inst-a', value)}".encode()
    v = verify(FLEET, old, "flightrec.logs", 0, b"inst-a", value)
    assert not v.valid and "does not bind the partition" in (v.problem or "") and "upgrade the agent" in v.problem


def test_a_verbatim_copy_in_another_partition_is_a_dead_letter() -> None:
    a = enroll(FLEET, "inst-a", T_ENROLL)
    b = Boot(instance="inst-a")
    b.stage_ok("benchmark", ["one", "two", "three"])
    msgs = [_msg(ev, n, a) for n, ev in enumerate(b.events)]
    copies = [dataclasses.replace(m, partition=3) for m in msgs]
    delta = fold(msgs + copies, trust=_trust())
    assert delta.events.num_rows == len(msgs) and delta.logs.num_rows == 3
    dead = delta.dead.to_pylist()
    assert len(dead) == len(copies) and {d["partition"] for d in dead} == {3}
    assert all(d["reason"].startswith("forged: its tag does not match key") for d in dead), dead[0]


def test_the_secret_is_never_in_a_repr_or_a_header() -> None:
    a = enroll(FLEET, "inst-a", T_ENROLL)
    assert a.secret.hex() not in repr(a)
    assert a.secret.hex() not in a.header("t", 0, b"k", b"v")[1].decode()
    assert a.secret.hex() in a.token and Signer.from_token(a.token) == a
    for bad in ("", "v2." + a.token[3:], a.token[:-4], a.token.replace(".", "x")):
        with pytest.raises(ConfigError) as err:
            Signer.from_token(bad)
        assert a.secret.hex() not in str(err.value)
    from flightrec.settings import Settings

    s = Settings.from_env({"FLIGHTREC_INSTANCE_KEY": a.token, "FLIGHTREC_FLEET_KEY": FLEET.hex()})
    assert a.secret.hex() not in repr(s) and FLEET.hex() not in repr(s)


def test_an_enrolled_instance_s_events_are_folded_with_their_key(store: FileStore) -> None:
    boot = Boot(instance="inst-a")
    boot.add(Lifecycle, stage="benchmark", state="started")
    boot.add(Lifecycle, stage="benchmark", state="failed", detail="exit 1")
    a = enroll(FLEET, "inst-a", T_ENROLL)
    stats = store.commit(fold([_msg(e, i, a) for i, e in enumerate(boot.events)], trust=_trust()))
    assert stats.dead_letters == 0
    keys = store.con.execute("SELECT DISTINCT key_id FROM events_seen WHERE instance_id = 'inst-a'").fetchall()
    assert keys == [(a.key_id,)]


def test_forgeries_by_an_enrolled_host_are_dead_letters_with_the_claimed_instance(store: FileStore) -> None:
    victim = Boot(instance="victim")
    victim.add(Lifecycle, stage="benchmark", state="started")
    v = enroll(FLEET, "victim", T_ENROLL)
    store.commit(fold([_msg(e, i, v) for i, e in enumerate(victim.events)], trust=(trust := _trust())))

    attacker = enroll(FLEET, "attacker", T_ENROLL)
    fake_failure = Lifecycle(**{**_env(victim, 1), "stage": "benchmark", "state": "failed", "detail": "CUDA error"})
    fake_seal = Sealed(**_env(victim, 2), event_count=3)
    fake_destroy = _manager("victim", "destroyed", T_ENROLL + 5)
    untagged = Lifecycle(**{**_env(victim, 3), "stage": "benchmark", "state": "failed"})
    forged = [_msg(fake_failure, 10, attacker), _msg(fake_seal, 11, attacker), _msg(fake_destroy, 12, attacker)]
    forged.append(_msg(untagged, 13, None))
    # a tag copied from a real message onto other bytes
    real = _msg(victim.events[0], 0, v)
    forged.append(dataclasses.replace(_msg(fake_failure, 14, None), headers=real.headers))
    stats = store.commit(fold(forged, trust=trust))
    assert stats.dead_letters == 5 and stats.events_written == 0
    rows = store.con.execute('SELECT instance_id, reason FROM dead_letters ORDER BY "offset"').fetchall()
    assert {r[0] for r in rows} == {"victim"}
    reasons = [r[1] for r in rows]
    assert "instance 'attacker''s key wrote an event claiming instance 'victim'" in reasons[0]
    assert "instance 'attacker''s key wrote a manager event about 'victim'" in reasons[2]
    assert reasons[3].startswith("unauthenticated: no tag")
    assert reasons[4].startswith("forged: its tag does not match")
    assert store.con.execute("SELECT count(*) FROM manager_events").fetchone() == (0,)
    assert store.con.execute("SELECT state FROM instances WHERE instance_id = 'victim'").fetchone() != ("failed",)


def _env(boot: Boot, seq: int) -> dict:
    return dict(
        event_id=f"{boot.instance}-forged-{seq}",
        instance_id=boot.instance,
        boot_id=boot.boot,
        seq=seq,
        ts_us=boot.t0 + seq * 1000,
    )


def test_destroyed_revokes_the_key_for_what_kafka_receives_after_it(store: FileStore, tmp_path: Path) -> None:
    boot = Boot(instance="inst-a")
    early = boot.add(Lifecycle, stage="benchmark", state="started")
    late = boot.add(Lifecycle, stage="benchmark", state="succeeded")
    a = enroll(FLEET, "inst-a", T_ENROLL)
    manager = Signer.manager(FLEET)
    destroyed = _manager("inst-a", "destroyed", T_ENROLL + 60_000_000)
    t_destroy_ms = 1_700_000_100_000
    msgs = [
        _msg(early, 0, a, t_destroy_ms - 5_000),  # received before the destroy: the evidence, kept
        _msg(destroyed, 1, manager, t_destroy_ms),
        _msg(late, 2, a, t_destroy_ms + 5_000),  # received after, and nothing before counted past it: unverified
    ]
    trust = _trust()
    stats = store.commit(fold(msgs, trust=trust))
    assert stats.dead_letters == 1
    (reason,) = store.con.execute("SELECT reason FROM dead_letters").fetchone()
    assert reason.startswith("unverified: delivered after instance 'inst-a' was destroyed")
    # a materializer started afresh learns the revocation from the database
    fresh = _trust()
    load_state(fresh, store.con)
    assert "inst-a" in fresh.revoked and "inst-a" in fresh.tagged
    again = Lifecycle(**{**_env(boot, 5), "stage": "x", "state": "started"})
    assert store.commit(fold([_msg(again, 3, a, t_destroy_ms + 9_000)], trust=fresh)).dead_letters == 1
    # the same instance id rented again: a key enrolled after the destroy writes
    rerented = enroll(FLEET, "inst-a", T_ENROLL + 120_000_000)
    new_boot = Boot(instance="inst-a")
    new_boot.add(Lifecycle, stage="tunnel", state="started")
    stats = store.commit(fold([_msg(new_boot.events[0], 4, rerented, t_destroy_ms + 60_000)], trust=fresh))
    assert stats.dead_letters == 0 and stats.events_written == 1


def test_unauthenticated_modes(store: FileStore) -> None:
    boot = Boot(instance="old-style")
    boot.add(Lifecycle, stage="benchmark", state="started")
    untagged = [_msg(e, i, None) for i, e in enumerate(boot.events)]
    assert store.commit(fold(untagged, trust=Trust())).dead_letters == 0, "no fleet key: nothing to verify"
    accept = _trust("accept")
    other = Boot(instance="legacy")
    other.add(Lifecycle, stage="benchmark", state="started")
    assert store.commit(fold([_msg(other.events[0], 5, None)], trust=accept)).dead_letters == 0
    # an instance that tags its events loses nothing to an untagged forger, even in accept mode
    a = enroll(FLEET, "inst-a", T_ENROLL)
    tagged = Boot(instance="inst-a")
    tagged.add(Lifecycle, stage="benchmark", state="started")
    tagged.add(Lifecycle, stage="benchmark", state="failed")
    store.commit(fold([_msg(tagged.events[0], 6, a)], trust=accept))
    assert store.commit(fold([_msg(tagged.events[1], 7, None)], trust=accept)).dead_letters == 1
    # and manager events need the manager's tag in any mode
    assert (
        store.commit(fold([_msg(_manager("legacy", "destroyed", T_ENROLL), 8, None)], trust=accept)).dead_letters == 1
    )


def test_headers_are_read_as_aiokafka_gives_them() -> None:
    a = enroll(FLEET, "inst-a", T_ENROLL)
    boot = Boot(instance="inst-a")
    ev = boot.add(Lifecycle, stage="s", state="started")
    m = _msg(ev, 0, a)
    listed = dataclasses.replace(m, headers=[("other", b"x"), (HEADER, m.headers[0][1])])  # type: ignore[arg-type]  # a list, as some clients give
    assert fold([listed], trust=_trust()).dead.num_rows == 0


def test_no_header_bytes_make_verify_raise_or_pass() -> None:
    """Whatever bytes a host puts in the tag header: a verdict (never an exception that would stop the fold), not a
    valid one, and a reason short enough for a dead letter's row; a key id with a trailing newline is no key id."""
    from flightrec.schemas.auth import KeyId
    from hypothesis import given, settings
    from hypothesis import strategies as st

    a = enroll(FLEET, "inst-a", T_ENROLL)
    real = a.header("flightrec.lifecycle", 0, b"inst-a", b"value")[1]
    assert verify(FLEET, real, "flightrec.lifecycle", 0, b"inst-a", b"value").valid
    assert KeyId.parse(a.key_id + "\n") is None

    @settings(max_examples=300, deadline=None)
    @given(
        st.one_of(st.binary(max_size=3000), st.binary(max_size=40).map(lambda b: real[:60] + b), st.just(real + b"\n"))
    )
    def check(header: bytes) -> None:
        v = verify(FLEET, header, "flightrec.lifecycle", 0, b"inst-a", b"value")
        assert not v.valid or header == real
        assert v.problem is None or len(v.problem) < 400

    check()


@pytest.mark.parametrize("instance", ["gpu-ü", "节点-7", "a\\xff"])
def test_an_instance_id_beyond_ascii_signs_and_verifies(instance: str) -> None:
    a = enroll(FLEET, instance, T_ENROLL)
    key = instance.encode()
    v = verify(FLEET, a.header("flightrec.logs", 0, key, b"v")[1], "flightrec.logs", 0, key, b"v")
    assert v.valid and v.instance_id == instance, v
    assert Signer.from_token(a.token).key_id == a.key_id


def test_a_refused_event_kafka_holds_twice_is_one_dead_letter(store: FileStore) -> None:
    """A producer's retry can put one event in Kafka twice: refused, it is one dead letter, and the second copy a
    duplicate, whether both come in one batch or in two; the same event id with other bytes, or refused for another
    reason, is another dead letter."""
    victim = Boot(instance="victim")
    attacker = enroll(FLEET, "attacker", T_ENROLL)
    forged = Lifecycle(**{**_env(victim, 1), "stage": "benchmark", "state": "failed", "detail": "CUDA error"})
    trust = _trust()
    first = store.commit(fold([_msg(forged, 10, attacker), _msg(forged, 11, attacker)], trust=trust))
    assert (first.dead_letters, first.duplicates_dropped) == (1, 1)
    again = store.commit(fold([_msg(forged, 12, attacker)], trust=trust))
    assert (again.dead_letters, again.duplicates_dropped) == (0, 1)
    other = Lifecycle(**{**_env(victim, 1), "stage": "benchmark", "state": "failed", "detail": "other bytes"})
    assert store.commit(fold([_msg(other, 13, attacker)], trust=trust)).dead_letters == 1
    rows = store.con.execute('SELECT "offset", event_id FROM dead_letters ORDER BY "offset"').fetchall()
    assert rows == [(10, forged.event_id), (13, forged.event_id)]
    # bytes that never decoded have no event id: each Kafka record stays its own dead letter
    junk = [RawMessage("flightrec.lifecycle", 0, o, b"k", b"\x00junk", None, None, ()) for o in (14, 15)]
    assert store.commit(fold(junk, trust=trust)).dead_letters == 2


def test_storing_dead_letters_is_a_hash_join_not_a_loop_over_the_table(store: FileStore) -> None:
    """Each dead letter is looked up among those stored by equality only: a flood of bad bytes must not make every
    commit a nested loop over every dead letter stored so far."""
    from flightrec.db.fold import DEAD
    from flightrec.db.rowwriter import DEAD_INSERT_SQL

    store.con.register("_d_dead", DEAD.empty_table())
    plan = "\n".join(r[1] for r in store.con.execute("EXPLAIN " + DEAD_INSERT_SQL.format(view="_d_dead")).fetchall())
    assert "HASH_JOIN" in plan
    assert "NESTED_LOOP" not in plan and "BLOCKWISE_NL" not in plan and "CROSS_PRODUCT" not in plan, plan


def test_evidence_spooled_before_the_destroy_is_kept_unverified_or_verified_by_what_was_committed(
    store: FileStore,
) -> None:
    """The README's h100-01 with a fleet key: the network cut, the failure spooled, the instance destroyed, then its
    spool delivered. Kafka receives it after the destroy: kept (a dead letter saying `unverified`, its bytes and
    claimed instance), never folded as evidence, never changing the status; but where a tagged event received
    before the destroy (a heartbeat) had counted past it in the boot's seq, it was committed then: verified."""
    a = enroll(FLEET, "h100-01", T_ENROLL)
    boot = Boot(instance="h100-01")
    boot.add(Lifecycle, stage="supervisor", state="started")  # seq 0
    boot.lines("supervisor", "stdout", ["proving"])  # seq 1: sent late, but committed by the heartbeat (seq 2)
    beat = boot.add(Heartbeat, stage="supervisor", interval_s=30.0, pid=7)  # seq 2: received before the destroy
    boot.lines("supervisor", "stderr", ["CUDA error: an illegal memory access"])  # seq 3: after the last heartbeat
    boot.add(Lifecycle, stage="supervisor", state="failed", detail="exit 1")  # seq 4
    t_destroy_ms = 1_700_000_100_000
    destroyed = _manager("h100-01", "destroyed", (t_destroy_ms - 1_000) * 1000)
    before = [_msg(boot.events[0], 0, a, t_destroy_ms - 60_000), _msg(beat, 1, a, t_destroy_ms - 30_000)]
    store.commit(fold([*before, _msg(destroyed, 2, Signer.manager(FLEET), t_destroy_ms)], trust=(trust := _trust())))
    late = [_msg(e, 3 + i, a, t_destroy_ms + 600_000) for i, e in enumerate(boot.events) if e.seq in (1, 3, 4)]
    stats = store.commit(fold(late, trust=trust))

    rows = store.con.execute("SELECT seq FROM events_seen WHERE instance_id = 'h100-01' ORDER BY seq").fetchall()
    assert [r[0] for r in rows] == [0, 1, 2]  # seq 1 verified: the heartbeat at seq 2 had committed to it
    assert store.con.execute("SELECT count(*) FROM log_lines WHERE text LIKE 'CUDA%'").fetchone() == (0,)
    dead = store.con.execute('SELECT reason, value, instance_id FROM dead_letters ORDER BY "offset"').fetchall()
    assert stats.dead_letters == 2 and [d[2] for d in dead] == ["h100-01", "h100-01"]
    assert all(d[0].startswith("unverified: delivered after instance 'h100-01' was destroyed") for d in dead), dead
    assert [decode(d[1]).seq for d in dead] == [3, 4]  # kept whole: the timeline shows them, flagged
    assert store.con.execute("SELECT count(*) FROM failures WHERE instance_id = 'h100-01'").fetchone() == (0,)
    # a restart judges alike: what was committed is read back from the database
    fresh = _trust()
    load_state(fresh, store.con)
    again = [_msg(boot.events[1], 9, a, t_destroy_ms + 700_000), _msg(boot.events[3], 10, a, t_destroy_ms + 700_000)]
    delta = fold(again, trust=fresh)
    assert delta.events.num_rows == 1 and delta.dead.num_rows == 1


def test_a_key_inventing_boot_ids_keeps_its_instance_s_counts_bounded() -> None:
    """Every tagged event may name a new boot: the judge keeps the signed counts of an instance's latest boots only,
    so a flood of made-up boot ids costs the materializer no more memory than one instance's share."""
    from flightrec.db.trust import COMMITTED_BOOTS

    a = enroll(FLEET, "inst-a", T_ENROLL)
    trust = _trust()
    msgs = []
    for n in range(200):
        b = Boot(instance="inst-a")
        msgs.append(_msg(b.add(Lifecycle, stage="s", state="started"), n, a, 1_700_000_000_000 + n))
    assert fold(msgs, trust=trust).events.num_rows == 200
    assert len(trust.committed["inst-a"]) == COMMITTED_BOOTS
