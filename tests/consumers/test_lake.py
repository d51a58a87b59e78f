"""The writer side of a lake: the same tables as a file, replay into a lake, fencing, conflicts retried."""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

import duckdb
import pytest
from flightrec.db import lake as lakes
from flightrec.db.filestore import FileStore
from flightrec.db.fold import RawMessage, fold
from flightrec.db.lakestore import LakeStore
from flightrec.db.rowwriter import MATERIALIZED_TABLES
from flightrec.db.stats import Stats
from flightrec.schemas import Lifecycle, encode
from lake_helpers import (
    assert_lake_equals_file,
    lake_con,
    lake_count,
    run_lake,
    seed_lake_at_mark,
    table_rows,
    varied_fleet,
)
from materializer_helpers import Boot, flightrec, materialize, publish

from flightrec.errors import Fenced, MaterializeError


def test_the_lake_equals_a_file_of_the_same_topics(kafka, lake, tmp_path):
    db, data_path = lake
    events, raw = varied_fleet()
    publish(kafka.bootstrap, events, raw)
    file = tmp_path / "file.duckdb"
    materialize(kafka, file, from_mark=False)  # the lake read the topics from the beginning too
    stats = run_lake(kafka, db, data_path)
    assert stats.commits >= 1 and stats.fenced == 0
    counts = assert_lake_equals_file(db, file)
    for table in (
        "instances",
        "boots",
        "failures",
        "heartbeats",
        "running_stages",
        "manager_events",
        "dead_letters",
        "log_lines",
        "throughput",
        "process_exits",
    ):
        assert counts[table] > 0, table
    con = lake_con(db)
    try:  # the readers' views are stored in the lake, as in a file
        assert con.execute("SELECT count(*) FROM fleet").fetchone()[0] == counts["instances"]
        assert con.execute("SELECT count(DISTINCT owner) FROM claims").fetchone()[0] == 1
    finally:
        con.close()
    again = run_lake(kafka, db, data_path, idle=1.0)  # offsets stored with the rows: nothing new to write
    assert again.lines_written == 0 and again.events_written == 0
    assert_lake_equals_file(db, file, ("log_lines", "events_seen"))


def test_replay_into_a_lake(kafka, lake, tmp_path, env_for):
    db, data_path = lake
    events, raw = varied_fleet(2)
    publish(kafka.bootstrap, events, raw)
    file = tmp_path / "file.duckdb"
    flightrec("replay", "--db", str(file), env=env_for())
    out = flightrec("replay", "--db", db, "--data-path", data_path, env=env_for())
    assert "conflicts_retried=" in out.stderr
    assert_lake_equals_file(db, file)
    again = flightrec("replay", "--db", db, "--data-path", data_path, env=env_for(), check=False)
    assert again.returncode == 1 and "already holds events" in again.stderr
    no_path = flightrec("replay", "--db", db, env=env_for(), check=False)
    assert no_path.returncode == 1 and "--data-path" in no_path.stderr
    # a replay that reached its end leaves a whole lake: a materializer takes it (and goes on from its offsets)
    flightrec("materialize", "--db", db, "--data-path", data_path, "--until-idle", "1", env=env_for())


@pytest.mark.slow  # a lake replay stopped by a signal after its first commit (~20 s with its catalog)
def test_a_lake_replay_stopped_before_its_end_is_a_lake_no_writer_takes_for_whole(
    fresh_kafka, lake, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGTERM after the replay's first commit (`flightrec replay` in this process, committing one event at a time
    here): it exits 1 saying the lake holds part of the topics only, and a materializer or another replay refuses
    the lake."""
    import functools
    import os
    import signal

    from flightrec.consumers import materializer

    from flightrec.cli import main

    db, data_path = lake
    events = []
    for i in range(3):
        b = Boot(instance=f"replayed-{i}")
        b.lines("supervisor", "stdout", [f"line {k}" for k in range(10)])
        events += b.events
    publish(fresh_kafka.bootstrap, events)
    real = LakeStore.commit

    def commit_then_signal(self: LakeStore, deltas: Any, **kw: Any) -> Any:
        done = real(self, deltas, **kw)
        if self.mode == "replay" and done.events_received:
            os.kill(os.getpid(), signal.SIGTERM)  # the CLI's handler stops the run: before its end offsets
        return done

    monkeypatch.setattr(LakeStore, "commit", commit_then_signal)
    monkeypatch.setattr(materializer, "Options", functools.partial(materializer.Options, batch_messages=1))
    monkeypatch.setenv("FLIGHTREC_BOOTSTRAP", fresh_kafka.bootstrap)
    assert main(["replay", "--db", db, "--data-path", data_path]) == 1
    monkeypatch.undo()
    env = fresh_kafka.env(FLIGHTREC_LOG_LEVEL="WARNING")
    for command in ("materialize", "replay"):
        extra = ["--until-idle", "1"] if command == "materialize" else []
        refused = flightrec(command, "--db", db, "--data-path", data_path, *extra, env=env, check=False)
        assert refused.returncode == 1, refused.stderr
        said = "is a replay that did not finish" if command == "materialize" else "already holds events"
        assert said in refused.stderr, refused.stderr


def _delta(boot: Boot, partition: int = 0, first_offset: int = 0):
    return fold(
        [
            RawMessage(e.topic, partition, first_offset + i, e.instance_id.encode(), encode(e))
            for i, e in enumerate(boot.events)
        ]
    )


def _boot(lines: int = 10) -> Boot:
    b = Boot()
    b.lines("supervisor", "stdout", [f"line {i}" for i in range(lines)])
    return b


def _count(store: LakeStore, sql: str) -> int:
    return store.con.execute(sql).fetchone()[0]


@pytest.mark.parametrize("check", [True, False], ids=["owner-check", "owner-check-disabled"])
def test_a_stale_member_is_fenced_and_writes_nothing(lake, check):
    db, data_path = lake
    loc = lakes.lake_location(db, data_path, writing=True)
    a = LakeStore(loc, "g", shards=[0], owner="member-a")
    b = LakeStore(loc, "g", shards=[0], owner="member-b")
    try:
        a.claim([0])
        a.commit({0: _delta(_boot(), first_offset=0)})
        assert _count(a, "SELECT count(*) FROM log_lines") == 10
        b.claim([0])  # the group moved shard 0 to b; a has not noticed yet
        assert a.epochs[0] < b.epochs[0]
        stale = {0: _delta(_boot(7), first_offset=1)}
        if check:
            with pytest.raises(Fenced) as info:
                a.commit(stale)
            assert info.value.shards == (0,)
            assert a.totals.fenced == 1
            assert _count(b, "SELECT count(*) FROM log_lines") == 10  # nothing of the stale batch
            assert b.offsets() == {("flightrec.logs", 0): 1}
        else:  # without the check the stale member's rows and offsets land: what fencing prevents
            a.commit(stale, check_claims=False)
            assert _count(b, "SELECT count(*) FROM log_lines") == 17
            assert b.offsets() == {("flightrec.logs", 0): 2}
        b.commit({0: _delta(_boot(3), first_offset=1)})  # the owner commits on
        assert _count(b, "SELECT count(*) FROM log_lines") == (13 if check else 20)
    finally:
        a.close()
        b.close()


def test_an_event_sent_again_later_is_stored_once(lake):
    """A producer's re-send (the same event at a later offset, after other commits) is dropped: the duplicate check
    looks only at files whose ts_us range can hold it, and still finds it."""
    db, data_path = lake
    loc = lakes.lake_location(db, data_path, writing=True)
    store = LakeStore(loc, "g", shards=[0])
    try:
        store.claim([0])
        first = _boot(10)
        store.commit({0: _delta(first, first_offset=0)})
        offset = len(first.events)
        later = []
        for _ in range(3):  # newer events in files of their own
            time.sleep(0.01)
            b = _boot(5)
            later.append(b)
            store.commit({0: _delta(b, first_offset=offset)})
            offset += len(b.events)
        again = store.commit({0: _delta(first, first_offset=offset)})  # the first boot's events, sent again
        assert again.duplicates_dropped == len(first.events) and again.lines_written == 0
        assert _count(store, "SELECT count(*) FROM log_lines") == 10 + 3 * 5
        assert _count(store, "SELECT count(*) FROM events_seen") == len(first.events) + sum(
            len(b.events) for b in later
        )
    finally:
        store.close()


def test_concurrent_commits_are_retried_and_counted(lake):
    """Another transaction writing the shard's claim table meanwhile makes commits lose DuckLake's race; each is
    retried whole and lands once."""
    db, data_path = lake
    loc = lakes.lake_location(db, data_path, writing=True)
    store = LakeStore(loc, "g", shards=[0], owner="member-a")
    store.claim([0])
    rival = lakes.connect(loc)
    stop = threading.Event()
    pause, touches = 1.0, 4  # a bounded rival: on a loaded machine a commit can take longer than its pause, and an
    # endless one would win every retry

    def touch() -> None:  # a commit of the same table, as a claim or another writer would make
        n = 0
        while not stop.is_set() and n < touches:
            try:
                rival.execute("UPDATE part_0.claim SET claimed_us = claimed_us")
                n += 1
            except duckdb.Error:
                pass
            time.sleep(pause)

    t = threading.Thread(target=touch, daemon=True)
    t.start()
    boots = [_boot(20) for _ in range(6)]
    try:
        for k, b in enumerate(boots):
            store.commit({0: _delta(b, first_offset=len(b.events) * k)})
    finally:
        stop.set()
        t.join()
        rival.close()
    try:
        assert store.totals.conflicts_retried > 0, "no commit met a conflict: the rival did not race"
        assert _count(store, "SELECT count(*) FROM log_lines") == 6 * 20
        assert _count(store, "SELECT count(DISTINCT event_id) FROM log_lines") == 6
        # with no retries allowed, the same race is an error, not a silent loss
        store.retries = 0
        pause, touches = 0.0, 10**9
        rival = lakes.connect(loc)
        stop.clear()
        t = threading.Thread(target=touch, daemon=True)
        t.start()
        with pytest.raises(MaterializeError, match="conflict"):
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                b = _boot(1)
                store.commit({0: _delta(b, first_offset=1000 + int(time.monotonic() * 1000))})
        stop.set()
        t.join()
        rival.close()
    finally:
        store.close()


def test_two_members_creating_a_new_lake_at_once(lake):
    db, data_path = lake
    loc = lakes.lake_location(db, data_path, writing=True)
    errors: list[BaseException] = []
    stores: list[LakeStore] = []

    def open_() -> None:
        try:
            stores.append(LakeStore(loc, "g", shards=range(6), views=("CREATE OR REPLACE VIEW v AS SELECT 1 AS x",)))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=open_) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for s in stores:
        s.close()
    assert not errors, errors
    con = lake_con(db)
    try:
        assert con.execute("SELECT count(*) FROM instances").fetchone()[0] == 0
        assert con.execute("SELECT x FROM v").fetchone()[0] == 1
    finally:
        con.close()


def test_webhook_alerts_are_refused_on_a_lake(kafka, lake, env_for):
    db, data_path = lake
    r = flightrec(
        "materialize",
        "--db",
        db,
        "--data-path",
        data_path,
        "--webhook",
        "http://127.0.0.1:9/x",
        "--until-idle",
        "1",
        env=env_for(),
        check=False,
    )
    assert r.returncode == 1 and "webhook" in r.stderr.lower() and "lake" in r.stderr


def _waited(records, deadline_s: float = 60.0) -> None:
    """Until the member says it waits for the catalog (its warning), or fail after ``deadline_s``."""
    deadline = time.monotonic() + deadline_s
    while not any("catalog does not answer" in r.getMessage() for r in list(records)):
        assert time.monotonic() < deadline, "the member never waited for the catalog"
        time.sleep(0.2)


def test_a_member_rides_out_a_catalog_restart(kafka, pg_dir, tmp_path, caplog):
    """The catalog (PostgreSQL) goes away mid-run and comes back: the member waits, reattaches and goes on;
    every line written exactly once, none lost with the commits that failed while it was away."""
    from flightrec.broker.local import free_port
    from flightrec.catalog import LocalCatalog

    catalog = LocalCatalog(port=free_port(), data=pg_dir / "c")
    catalog.start()
    data_path = tmp_path / "files"
    data_path.mkdir()
    before, during = _boot(40), _boot(40)
    group = f"restart-{uuid.uuid4().hex[:8]}"
    seed_lake_at_mark(kafka, catalog.db, str(data_path), group)  # not every earlier test's lines first (CI's load)
    publish(kafka.bootstrap, before.events)
    out: dict[str, object] = {}

    def member() -> None:
        try:
            out["stats"] = run_lake(kafka, catalog.db, str(data_path), idle=15.0, group=group)
        except BaseException as exc:  # noqa: BLE001 - reported below
            out["error"] = exc

    def lines(instance: str) -> int:
        return lake_count(catalog.db, "SELECT count(*) FROM log_lines WHERE instance_id = ?", [instance])

    thread = threading.Thread(target=member)
    thread.start()
    try:
        deadline = time.monotonic() + 120
        while lines(before.instance) < 40:
            assert thread.is_alive(), out
            assert time.monotonic() < deadline, "the member wrote nothing in 120 s"
            time.sleep(0.3)
        catalog.stop()
        publish(kafka.bootstrap, during.events)  # read and folded while the catalog is away: its commits fail
        _waited(caplog.records)
        time.sleep(1.0)
        assert thread.is_alive(), f"the member ended while the catalog was away: {out}"
        catalog.start()
        thread.join(120)
        assert not thread.is_alive(), "the member did not finish within 120 s of the catalog's return"
        assert "error" not in out, out["error"]
        con = lake_con(catalog.db)
        try:
            for boot in (before, during):
                n, distinct = con.execute(
                    """SELECT count(*), count(DISTINCT line_no) FROM log_lines
                                             WHERE instance_id = ?""",
                    [boot.instance],
                ).fetchone()
                assert (n, distinct) == (40, 40), boot.instance
                assert con.execute(
                    "SELECT count(*) FROM events_seen WHERE instance_id = ?", [boot.instance]
                ).fetchone()[0] == len(boot.events)
            assert (
                con.execute("SELECT complete FROM instances WHERE instance_id = ?", [during.instance]).fetchone()
                is not None
            )
        finally:
            con.close()
        assert out["stats"].catalog_waits >= 1
    finally:
        catalog.start()  # a no-op when it runs: the member's thread must be able to end
        thread.join(60)
        catalog.stop()


def test_a_catalog_that_stays_away_stops_the_member_saying_so(pg_dir, tmp_path):
    from flightrec.broker.local import free_port
    from flightrec.catalog import LocalCatalog

    catalog = LocalCatalog(port=free_port(), data=pg_dir / "c")
    catalog.start()
    try:
        loc = lakes.lake_location(catalog.db, str(tmp_path / "files"), writing=True)
        store = LakeStore(loc, "g", shards=[0], owner="member-a")
        store.claim([0])
        catalog.stop()
        # a stopping materializer (SIGTERM) does not wait out the catalog
        store.catalog_wait = 120.0
        threading.Timer(1.0, store.stop_waiting.set).start()
        started = time.monotonic()
        with pytest.raises(MaterializeError, match="stopped while waiting for the catalog"):
            store.commit({0: _delta(_boot())})
        assert time.monotonic() - started < 10
        store.stop_waiting.clear()
        store.catalog_wait = 3.0
        started = time.monotonic()
        with pytest.raises(MaterializeError, match="has not answered for") as err:
            store.commit({0: _delta(_boot())})
        assert 3.0 <= time.monotonic() - started < 30
        assert "restart this materializer" in str(err.value) and "password" not in str(err.value)
        store.close()  # does not wait for the catalog (its run's row is bookkeeping)
        assert time.monotonic() - started < 40
        catalog.start()
        con = lake_con(catalog.db)
        try:
            assert con.execute("SELECT count(*) FROM log_lines").fetchone()[0] == 0
        finally:
            con.close()
    finally:
        catalog.stop()


def test_sigterm_while_the_catalog_is_away_stops_the_member_at_once(kafka, pg_dir, tmp_path, env_for):
    """`flightrec materialize` on a lake whose catalog went away: SIGTERM ends its wait for the catalog (no
    two-minute hang), with one line saying the batch is read again at the next start."""
    import signal
    import subprocess
    import sys
    from pathlib import Path

    from flightrec.broker.local import free_port
    from flightrec.catalog import LocalCatalog

    catalog = LocalCatalog(port=free_port(), data=pg_dir / "c")
    catalog.start()
    before, during = _boot(5), _boot(5)
    publish(kafka.bootstrap, before.events)
    exe = Path(sys.executable).with_name("flightrec")
    log = tmp_path / "member.log"
    member = subprocess.Popen(
        [str(exe), "materialize", "--db", catalog.db, "--data-path", str(tmp_path / "files")],
        env={**env_for(), "PYTHONSAFEPATH": "1"},
        stdout=subprocess.DEVNULL,
        stderr=log.open("w"),
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while lake_count(catalog.db, "SELECT count(*) FROM log_lines WHERE instance_id = ?", [before.instance]) < 5:
            assert member.poll() is None, log.read_text()[-2000:]
            assert time.monotonic() < deadline, "the member wrote nothing in 120 s"
            time.sleep(0.3)
        catalog.stop()
        publish(kafka.bootstrap, during.events)
        deadline = time.monotonic() + 60
        while "catalog does not answer" not in log.read_text():  # read, folded, its commit waiting for the catalog
            assert member.poll() is None and time.monotonic() < deadline, log.read_text()[-2000:]
            time.sleep(0.2)
        member.send_signal(signal.SIGTERM)
        member.wait(20)
        err = log.read_text()
        assert member.returncode == 1, err[-2000:]
        assert "stopped while waiting for the catalog" in err and "Traceback" not in err, err[-2000:]
    finally:
        if member.poll() is None:
            member.kill()
            member.wait()
        catalog.stop()


def test_a_claim_that_fails_in_the_rebalance_stops_the_member(kafka, lake, monkeypatch):
    """aiokafka swallows what a rebalance listener raises: a member whose claim failed would read on with no
    partition (or, after a failed drain, past a batch it never committed). It stops with the error instead."""
    db, data_path = lake

    def refuse(self, shards):  # the catalog away past CATALOG_WAIT_S, say
        raise MaterializeError("could not claim partitions in the lake: test")

    monkeypatch.setattr(LakeStore, "claim", refuse)
    out: dict[str, BaseException] = {}

    def member() -> None:
        try:
            run_lake(kafka, db, data_path, idle=2.0)
        except BaseException as exc:  # noqa: BLE001 - asserted below
            out["error"] = exc

    thread = threading.Thread(target=member, daemon=True)
    thread.start()
    thread.join(60)
    assert not thread.is_alive(), "the member went on after its claim failed"
    assert isinstance(out.get("error"), MaterializeError) and "could not claim" in str(out["error"])


@pytest.mark.parametrize(
    "text",
    ["a NUL \x00 in a line", "\x00", "quote ' and \\ and \x00'", "é\x00漢", "\x01\x02\x7f"],
    ids=["nul-inside", "nul-only", "quotes-and-nul", "utf8-and-nul", "controls"],
)
def test_a_line_with_odd_bytes_commits_to_a_lake(lake, text):
    """A log line's text with a NUL byte (a program's output is any bytes) reaches a lake like any other: on main
    DuckLake's per-file column statistics carried it into the catalog's SQL, where PostgreSQL's text ends at the NUL
    ("unterminated quoted string"), and the member failed on that batch at every start."""
    db, data_path = lake
    loc = lakes.lake_location(db, data_path, writing=True)
    store = LakeStore(loc, "g", shards=[0])
    try:
        store.claim([0])
        b = Boot()
        b.lines("supervisor", "stdout", [text, "after it"])
        b.add(Lifecycle, stage="supervisor", state="failed", detail=text)
        store.commit({0: _delta(b)})
        assert _count(store, "SELECT count(*) FROM log_lines") == 2
        got = store.con.execute("SELECT text FROM log_lines ORDER BY line_no").fetchall()
        assert [r[0] for r in got] == [text.replace("\x00", "\\x00"), "after it"]  # the NUL spelled out
        detail = store.con.execute("SELECT detail FROM lifecycle_events").fetchall()
        assert detail == [(text.replace("\x00", "\\x00"),)]
    finally:
        store.close()


def test_a_dead_letter_of_odd_bytes_commits_to_a_lake_byte_for_byte(lake):
    db, data_path = lake
    loc = lakes.lake_location(db, data_path, writing=True)
    store = LakeStore(loc, "g", shards=[0])
    raw = b"\x00\x01not avro\x00\xff'\\"
    try:
        store.claim([0])
        store.commit({0: fold([RawMessage("flightrec.logs", 0, 0, b"k\x00", raw)])})
        assert store.con.execute("SELECT key, value FROM dead_letters").fetchall() == [(b"k\x00", raw)]
    finally:
        store.close()


def test_a_nul_in_an_instance_id_and_its_facts_commits_to_a_lake(lake):
    """The same for the keys a lake's derived tables group by (instance id) and a map (facts' attributes)."""
    db, data_path = lake
    loc = lakes.lake_location(db, data_path, writing=True)
    store = LakeStore(loc, "g", shards=[0])
    try:
        store.claim([0])
        b = Boot(instance="gpu-\x00-1")
        b.facts(attributes={"k\x00": "v\x00"})
        b.lines("supervisor", "stdout", ["hello"])
        b.add(Lifecycle, stage="supervisor", state="failed", detail="x")
        store.commit({0: _delta(b)})
        assert store.con.execute("SELECT DISTINCT instance_id FROM log_lines").fetchall() == [("gpu-\\x00-1",)]
        assert _count(store, "SELECT count(*) FROM instances WHERE instance_id = 'gpu-\\x00-1'") == 1
        again = store.commit({0: _delta(b, first_offset=len(b.events))})  # sent again: still counted once
        assert again.lines_written == 0 and _count(store, "SELECT count(*) FROM log_lines") == 1
    finally:
        store.close()


def test_a_commit_of_several_shards_writes_what_one_shard_at_a_time_writes(lake, tmp_path):
    """A member owning several shards writes their shared tables once per commit (LakeStore._write_together): the
    same rows as the shards' Deltas written one after another on a file, dead letters, duplicates, heartbeats,
    failures and manager events included; an event id in two shards' Deltas makes it write them one at a time."""
    events, raw = varied_fleet()
    by_shard: dict[int, list[RawMessage]] = {0: [], 1: [], 2: []}
    instances = list(dict.fromkeys(ev.instance_id for ev in events))  # each instance in one shard, as Kafka's keys
    for ev in events:
        key = ev.instance_id.encode()
        shard = instances.index(ev.instance_id) % 3
        by_shard[shard].append(RawMessage(ev.topic, shard, len(by_shard[shard]), key, encode(ev), None, None, ()))
    for topic, key, value in raw:
        by_shard[2].append(RawMessage(topic, 2, len(by_shard[2]), key, value, None, None, ()))
    assert all(by_shard.values()), "every shard gets events"
    deltas = {s: fold(msgs) for s, msgs in by_shard.items()}

    db, data_path = lake
    loc = lakes.lake_location(db, data_path, writing=True)
    store = LakeStore(loc, "g", shards=range(3))
    file = FileStore(tmp_path / "one-at-a-time.duckdb", "g")
    try:
        store.claim(range(3))
        together = store.commit(deltas)
        assert together.commits == 1, "one transaction, shared tables written once"
        one_by_one = Stats()
        for s in range(3):
            one_by_one += file.commit(deltas[s])
        for field in ("events_written", "lines_written", "duplicates_dropped", "dead_letters", "failures_written"):
            assert getattr(together, field) == getattr(one_by_one, field), field
        store.con.execute("SET search_path = 'lake.main'")
        for table in MATERIALIZED_TABLES:
            if table in ("consumer_offsets", "materializer_runs", "schema_version"):
                continue
            assert table_rows(store.con, table) == table_rows(file.con, table), table
        # the same new event in two shards' Deltas: written shard after shard, the second copy is a duplicate
        fresh = _boot(3).events  # one LogBatch of 3 lines
        twice = {
            s: fold([RawMessage(e.topic, s, 100 + i, e.instance_id.encode(), encode(e), None, None, ())
                     for i, e in enumerate(fresh)])
            for s in (0, 1)
        }  # fmt: skip
        stats = store.commit(twice)
        assert (stats.events_written, stats.duplicates_dropped, stats.lines_written) == (1, 1, 3), stats
    finally:
        store.close()
        file.close()


class _Counting:
    """A lake connection that counts the statements naming a table (the rest passes through)."""

    def __init__(self, con: duckdb.DuckDBPyConnection, table: str) -> None:
        self._con, self._table, self.count = con, table, 0

    def _seen(self, sql: object) -> None:
        self.count += self._table in str(sql)

    def execute(self, sql: object, *args, **kwargs):
        self._seen(sql)
        return self._con.execute(sql, *args, **kwargs)

    def sql(self, sql: object, *args, **kwargs):
        self._seen(sql)
        return self._con.sql(sql, *args, **kwargs)

    def __getattr__(self, name: str):
        return getattr(self._con, name)


def test_a_commit_of_several_shards_derives_its_rows_in_one_pass(lake, tmp_path):
    """The derived rows (boots, failures, instances, running stages) of a commit of three shards are computed once for
    all of them: the statements reading the lifecycle events are as many as for the same events in one shard (each
    statement on a lake table costs catalog round trips: computed per shard, a member owning every shard paid the
    derivation six times a commit)."""

    def deltas(shards: int) -> dict[int, object]:
        events, _ = varied_fleet()  # new ids: each store of the lake writes a fleet of its own
        instances = list(dict.fromkeys(ev.instance_id for ev in events))
        by_shard: dict[int, list[RawMessage]] = {s: [] for s in range(shards)}
        for ev in events:
            s = instances.index(ev.instance_id) % shards
            by_shard[s].append(
                RawMessage(ev.topic, s, len(by_shard[s]), ev.instance_id.encode(), encode(ev), None, None, ())
            )
        return {s: fold(m) for s, m in by_shard.items()}

    db, data_path = lake
    counts = {}
    for shards in (1, 3):
        loc = lakes.lake_location(db, data_path, writing=True)
        store = LakeStore(loc, f"g{shards}", shards=range(10 * shards, 10 * shards + shards))
        try:
            store.claim(range(10 * shards, 10 * shards + shards))
            counting = store.con = _Counting(store.con, "lifecycle_events")
            store.commit({10 * shards + s: d for s, d in deltas(shards).items()})
            counts[shards] = counting.count
            store.con = counting._con
        finally:
            store.close()
    assert counts[1] > 0 and counts[3] == counts[1], counts


def test_an_instance_in_two_shards_of_a_commit_is_derived_in_each(lake):
    """Kafka keys events by instance id, so an instance lives in one shard; a producer keying otherwise puts it in
    two. Such a commit is written shard after shard (lakederive.join_shards says no): each shard holds the instance's
    derived rows, as when the two shards commit apart, and nothing fails."""
    b = Boot()
    b.stage_ok("tunnel", ["up"])
    b.add(Lifecycle, stage="benchmark", state="started")
    half = len(b.events) // 2
    deltas = {
        s: fold([RawMessage(e.topic, s, i, b"other-key", encode(e), None, None, ()) for i, e in enumerate(part)])
        for s, part in ((0, b.events[:half]), (1, b.events[half:]))
    }
    db, data_path = lake
    store = LakeStore(lakes.lake_location(db, data_path, writing=True), "g", shards=range(2))
    try:
        store.claim(range(2))
        stats = store.commit(deltas)
        assert stats.events_written == len(b.events), stats
        for s in range(2):
            rows = store.con.execute(f"SELECT instance_id FROM lake.part_{s}.instances").fetchall()
            assert rows == [(b.instance,)], (s, rows)
    finally:
        store.close()


def _kept_equals_lake(store: LakeStore, shards: range) -> None:
    """The derived rows a member keeps (lakederive.OwnedRows) are its shards' rows in the lake."""
    for name, columns in {"boots": "*", "instances": "*", "failures": "instance_id, boot_id, stage"}.items():
        union = " UNION ALL ".join(f"SELECT {columns} FROM lake.part_{s}.{name}" for s in shards)
        lake_rows = store.con.execute(f"SELECT * FROM ({union}) ORDER BY ALL").fetchall()
        kept = store.con.execute(f"SELECT * FROM temp.main._kept_{name} ORDER BY ALL").fetchall()
        assert kept == lake_rows, name


def test_the_kept_derived_rows_follow_claims_and_failed_commits(lake, monkeypatch):
    """A member keeps its shards' derived rows between commits (the derivation reads them instead of the lake). When
    a commit failed after the derivation (its first after a claim, or a later one), another member wrote a shard
    meanwhile (it claimed it, then this member claimed it back), or a commit was written shard after shard, what it
    keeps is read again: it stays the lake's rows, and so do the rows derived from it."""
    db, data_path = lake
    loc = lakes.lake_location(db, data_path, writing=True)
    a = LakeStore(loc, "g", shards=range(2), owner="member-a")
    b = LakeStore(loc, "g", shards=range(2), owner="member-b")
    x, y = _boot(3), _boot(3)  # x's instance in shard 0, y's in shard 1

    def broken(delta):  # a fault after the derivation, before COMMIT
        raise duckdb.IOException("disk full (injected)")

    try:
        a.claim(range(2))
        a._owned.forget()  # as when the claim could not read them (the catalog away): the first commit reads them
        monkeypatch.setattr(a, "_write_shared", broken)
        with pytest.raises(MaterializeError, match="disk full"):
            a.commit({0: _delta(x, 0, 0), 1: _delta(y, 1, 0)})
        monkeypatch.undo()
        a.commit({0: _delta(x, 0, 0), 1: _delta(y, 1, 0)})
        _kept_equals_lake(a, range(2))

        b.claim([1])  # shard 1 moves to b, which boots y's instance again and sees a new instance
        again = Boot(instance=y.instance, t0=y.t0 + 10**6)
        again.add(Lifecycle, stage="tunnel", state="started")
        b.commit({1: _delta(again, 1, 1)})
        b.commit({1: _delta(_boot(2), 1, 2)})
        a.release([1])
        a.claim([1])  # and back to a
        a.commit({0: _delta(_boot(2), 0, 1)})
        _kept_equals_lake(a, range(2))
        again.lines("tunnel", "stdout", ["up"])  # a line of the new boot: only its boots columns change
        later = fold([RawMessage(e.topic, 1, 3, e.instance_id.encode(), encode(e)) for e in again.events[1:]])
        a.commit({1: later})
        _kept_equals_lake(a, range(2))
        assert a.con.execute("SELECT boot_id FROM instances WHERE instance_id = ?", [y.instance]).fetchall() == [
            (again.boot,)
        ]

        monkeypatch.setattr(a, "_write_shared", broken)
        with pytest.raises(MaterializeError, match="disk full"):
            a.commit({0: _delta(_boot(4), 0, 2)})
        monkeypatch.undo()
        a.commit({0: _delta(_boot(5), 0, 2)})
        _kept_equals_lake(a, range(2))

        # an event in two shards' batches: written shard after shard, past the kept rows; the next commit reads them
        twice, fresh = Boot(), _boot(1)
        twice.add(Lifecycle, stage="tunnel", state="started")
        a.commit({s: _delta(twice, s, 10) for s in range(2)})
        a.commit({0: _delta(fresh, 0, 11)})
        _kept_equals_lake(a, range(2))
    finally:
        a.close()
        b.close()


def test_the_derived_rows_of_instances_new_to_the_shards_are_inserted_without_deletes(lake, tmp_path):
    """A lake's DELETE costs catalog round trips even where it finds nothing (~15 ms a table and shard): a commit's
    instances that the member's shards never held (no kept row, lakederive.fresh_instances) have their derived rows
    only inserted; instances seen before have theirs replaced. Either way the rows are a file's."""
    events, _ = varied_fleet()
    instances = list(dict.fromkeys(ev.instance_id for ev in events))
    seen: dict[str, int] = {}
    halves: list[dict[int, list[RawMessage]]] = [{0: [], 1: []}, {0: [], 1: []}]
    for ev in events:  # each instance's first events in the first commit, the rest in the second
        s = instances.index(ev.instance_id) % 2
        seen[ev.instance_id] = seen.get(ev.instance_id, 0) + 1
        half = halves[0 if seen[ev.instance_id] <= 3 else 1]
        offset = sum(len(h[s]) for h in halves)
        half[s].append(RawMessage(ev.topic, s, offset, ev.instance_id.encode(), encode(ev), None, None, ()))
    db, data_path = lake
    store = LakeStore(lakes.lake_location(db, data_path, writing=True), "g", shards=range(2))
    file = FileStore(tmp_path / "file.duckdb", "g")
    deletes = []
    try:
        store.claim(range(2))
        for half in halves:
            deltas = {s: fold(m) for s, m in half.items() if m}
            counting = store.con = _Counting(store.con, "DELETE FROM lake.part_")
            try:
                store.commit(deltas)
            finally:
                store.con = counting._con
            deletes.append(counting.count)
            for s in sorted(deltas):
                file.commit(deltas[s])
        assert deletes[0] == 0 and deletes[1] > 0, deletes
        store.con.execute("SET search_path = 'lake.main'")
        for table in ("boots", "instances", "failures", "running_stages"):
            assert table_rows(store.con, table) == table_rows(file.con, table), table
        _kept_equals_lake(store, range(2))
    finally:
        store.close()
        file.close()


def test_the_offsets_of_a_new_shard_are_inserted_once_then_updated(lake):
    """A claimed shard whose consumer_offsets never held a row gets its first offsets by a plain INSERT (a MERGE costs
    catalog round trips); every later commit, and a member that claims the shard after another wrote it, updates
    them: one row per partition, the latest offset."""
    db, data_path = lake
    loc = lakes.lake_location(db, data_path, writing=True)
    a = LakeStore(loc, "g", shards=range(2), owner="member-a")
    b = LakeStore(loc, "g", shards=range(2), owner="member-b")

    def offsets(store: LakeStore, shard: int) -> list[tuple]:
        return store.con.execute(
            f'SELECT topic, "partition", next_offset FROM lake.part_{shard}.consumer_offsets ORDER BY ALL'
        ).fetchall()

    try:
        assert a.claim(range(2)) == {}
        x = _boot(2)
        a.commit({0: _delta(x, 0, 0)})
        a.commit({0: _delta(_boot(2), 0, len(x.events))})
        assert offsets(a, 0) == [("flightrec.logs", 0, 2 * len(x.events))], offsets(a, 0)
        b.claim([0, 1])  # b takes both: shard 0 was written by a, shard 1 never
        b.commit({0: _delta(_boot(2), 0, 10), 1: _delta(_boot(2), 1, 0)})
        a.release([0, 1])
        assert a.claim([0, 1]) == {("flightrec.logs", 0): 10 + len(x.events), ("flightrec.logs", 1): len(x.events)}
        a.commit({0: _delta(_boot(2), 0, 20), 1: _delta(_boot(2), 1, 30)})
        assert offsets(a, 0) == [("flightrec.logs", 0, 20 + len(x.events))]
        assert offsets(a, 1) == [("flightrec.logs", 1, 30 + len(x.events))]
    finally:
        a.close()
        b.close()


def test_a_member_makes_the_views_after_its_claim_and_before_its_rows_are_seen(lake):
    """A member claims its shards first and makes the views that unite them after (a group member reads Kafka
    meanwhile): its first commit finds them made, or makes them; a writer that never commits makes them at close."""
    db, data_path = lake
    loc = lakes.lake_location(db, data_path, writing=True)

    def views_made() -> bool:
        con = lake_con(db, data_path)
        try:
            return bool(
                con.execute(
                    "SELECT count(*) FROM duckdb_views() WHERE database_name = 'lake' AND view_name = 'instances'"
                ).fetchone()[0]
            )
        finally:
            con.close()

    a = LakeStore(loc, "g", owner="member-a")
    try:
        a.claim(range(2))
        assert not views_made(), "the claim waits for no view"
        a.commit({0: _delta(_boot(3), 0, 0)})
        assert views_made()
        assert lake_count(db, "SELECT count(*) FROM instances", None, data_path) == 1
    finally:
        a.close()
    b = LakeStore(loc, "g", owner="member-b")
    try:
        b.claim(range(4))  # two more shards: the views must cover them
    finally:
        b.close()
    con = lake_con(db, data_path)
    try:
        assert "part_3" in con.execute("SELECT sql FROM duckdb_views() WHERE view_name = 'instances'").fetchone()[0]
    finally:
        con.close()


def test_a_commit_run_again_after_its_connection_broke_keeps_one_offsets_row(lake, monkeypatch):
    """A commit whose COMMIT reached the catalog just before the connection broke runs again once the catalog answers
    (LakeStore._retrying): its events are dropped then by id, and its offsets (a new shard's first: an INSERT) are
    upserted, not inserted twice: one row per partition, every line once."""
    db, data_path = lake
    store = LakeStore(lakes.lake_location(db, data_path, writing=True), "g", shards=range(1))
    try:
        store.claim([0])
        real, broke = store._in_transaction, []

        def committed_then_broken(fn):
            out = real(fn)
            if not broke:
                broke.append(True)
                raise duckdb.IOException("IO Error: connection to server was lost (injected, after the COMMIT)")
            return out

        monkeypatch.setattr(store, "_in_transaction", committed_then_broken)
        x = _boot(3)
        stats = store.commit({0: _delta(x, 0, 0)})
        assert broke and stats.catalog_waits == 1, stats
        assert store.con.execute(
            'SELECT topic, "partition", next_offset FROM lake.part_0.consumer_offsets'
        ).fetchall() == [("flightrec.logs", 0, len(x.events))]
        assert _count(store, "SELECT count(*) FROM log_lines") == 3
    finally:
        store.close()


def _zorblax(n: int) -> Boot:
    """A boot whose stage fails with a line no packaged rule knows."""
    b = Boot()
    b.add(Lifecycle, stage="params", state="started")
    said = [f"zorblax: shard {n} unreadable"]
    b.lines("params", "stderr", said)
    b.exit("params", 3, stderr=said)
    b.add(Lifecycle, stage="params", state="failed", detail="params exited 3")
    return b


def test_failures_are_classed_again_in_steps_by_the_owner_only(lake, tmp_path):
    """LakeStore.reclassify: a shard's failures classed again by the store's rules, a few stages a step, each step
    checking the claim as a commit does: a member whose shard was claimed away is fenced and writes nothing."""
    from flightrec.db.classify import load_table

    db, data_path = lake
    loc = lakes.lake_location(db, data_path, writing=True)
    (tmp_path / "rules.toml").write_text(
        '[[rule]]\nid = "zorblax"\nclass = "zorblax_shard"\nhint = "h"\nlines = ["zorblax: shard"]\n'
    )
    rules = load_table(None, tmp_path / "rules.toml")
    a = LakeStore(loc, "g", shards=[0], owner="member-a")
    b = LakeStore(loc, "g", shards=[0], owner="member-b")
    sql = "SELECT failure_class, rule_id, rules_version, count(*) FROM failures GROUP BY ALL"
    try:
        a.claim([0])
        boots = [_zorblax(n) for n in range(3)]
        a.commit({0: fold([m for k, boot in enumerate(boots) for m in _delta_records(boot, 100 * k)])})
        base = a.rules.version
        assert a.con.execute(sql).fetchall() == [("unknown", "unknown", base, 3)]
        b.claim([0])  # the group moved shard 0 to b; a has not noticed yet
        a.rules = rules
        with pytest.raises(Fenced) as info:
            a.reclassify(0)
        assert info.value.shards == (0,)
        assert b.con.execute(sql).fetchall() == [("unknown", "unknown", base, 3)]  # nothing written

        b.rules = rules
        steps = [b.reclassify(0, limit=2)]
        while not steps[-1].done:
            steps.append(b.reclassify(0, steps[-1].cursor, limit=2))
        assert [(s.rows, s.done) for s in steps] == [(2, False), (1, True)]
        assert b.con.execute(sql).fetchall() == [("zorblax_shard", "zorblax", rules.version, 3)]
        assert b.reclassify(0).rows == 0  # nothing left classed by another table
        b.commit({0: fold(_delta_records(_zorblax(9), 1000))})  # the owner commits on, by the rules it holds
        assert b.con.execute(sql).fetchall() == [("zorblax_shard", "zorblax", rules.version, 4)]
    finally:
        a.close()
        b.close()


def _delta_records(boot: Boot, first_offset: int) -> list[RawMessage]:
    return [
        RawMessage(e.topic, 0, first_offset + i, e.instance_id.encode(), encode(e)) for i, e in enumerate(boot.events)
    ]
