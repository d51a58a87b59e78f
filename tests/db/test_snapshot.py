"""The readers' snapshot (db/snapshot.py): copies of a file a writer holds, made current block by block, that open
as the writer's database as of the publish, in another process; a copy a reader holds is never written."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import duckdb
import numpy as np
import pytest
from flightrec.db import snapshot
from flightrec.db.filestore import FileStore
from flightrec.db.query import freshness, run_query

from flightrec.errors import QueryError

# What a reader in another process sees of a copy: the tables' digests (a read-only open, as readers do).
DIGEST = """
import duckdb, json, sys
con = duckdb.connect(sys.argv[1], read_only=True)
print(json.dumps(con.execute(sys.argv[2]).fetchall()))
"""
STATE = (
    "SELECT (SELECT count(*) FROM log), (SELECT sum(i) FROM log), (SELECT sum(hash(s)) FROM log), "
    "(SELECT count(*) FROM inst), (SELECT sum(n) FROM inst), (SELECT string_agg(last, ',' ORDER BY inst) FROM inst)"
)


def _seen_by_a_reader(path: Path, sql: str = STATE) -> list:
    out = subprocess.run([sys.executable, "-c", DIGEST, str(path), sql], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def _writer(path: Path) -> tuple[duckdb.DuckDBPyConnection, snapshot.Publisher]:
    con = duckdb.connect(str(path))
    con.execute("SET checkpoint_threshold = '64MB'")
    con.execute("CREATE TABLE log (i BIGINT, inst VARCHAR, s VARCHAR)")
    con.execute("CREATE TABLE inst (inst VARCHAR PRIMARY KEY, n BIGINT, last VARCHAR)")
    block = con.execute("SELECT block_size FROM pragma_database_size()").fetchall()[0][0]
    return con, snapshot.Publisher(path, block)


def test_every_block_begins_with_duckdbs_checksum_of_the_rest(tmp_path):
    """What the publisher relies on to copy only changed blocks; a DuckDB that changed it fails here (and the
    publisher, seeing no block match, would copy whole files: slower, still right)."""
    path = tmp_path / "f.duckdb"
    con = duckdb.connect(str(path))
    con.execute("CREATE TABLE t AS SELECT range AS i, repeat('x', (range % 50)::INT) || range AS s FROM range(300000)")
    con.execute("CHECKPOINT")
    block = con.execute("SELECT block_size FROM pragma_database_size()").fetchall()[0][0]
    data = path.read_bytes()
    n = (len(data) - snapshot.HEADER_BYTES) // block
    assert n > 3 and (len(data) - snapshot.HEADER_BYTES) % block == 0
    blocks = np.frombuffer(data[snapshot.HEADER_BYTES :], dtype="<u8").reshape(n, block // 8)
    assert (snapshot.block_checksums(blocks) == blocks[:, 0]).all()
    fd = os.open(path, os.O_RDONLY)
    try:
        assert (snapshot.checksum_fields(fd, len(data), block) == blocks[:, 0]).all()
    finally:
        os.close(fd)
    con.close()


def test_changed_runs():
    a = np.array([1, 2, 3, 4, 5, 6], dtype="<u8")
    assert snapshot.changed_runs(a, None) == [(0, 6)]
    assert snapshot.changed_runs(a, a.copy()) == []
    b = a.copy()
    b[[1, 2, 4]] = 0
    assert snapshot.changed_runs(a, b) == [(1, 2), (4, 1)]
    assert snapshot.changed_runs(a, a[:4].copy()) == [(4, 2)]
    assert snapshot.changed_runs(a[:3], a.copy()) == []


@pytest.mark.slow
def test_a_published_copy_is_the_writers_database_as_of_the_publish(tmp_path):
    """Random commits (small and large inserts, upserts, deletes), each published, a third of them after a
    CHECKPOINT (the others with their write-ahead log): a reader in another process opens the copy and sees exactly
    what the writer had."""
    path = tmp_path / "f.duckdb"
    con, pub = _writer(path)
    rng = random.Random(45)
    total = 0
    for n_commit in range(1, 17):
        n = rng.choice([10, 1000, 50_000, 200_000])
        con.execute("BEGIN TRANSACTION")
        con.execute(
            f"INSERT INTO log SELECT {total} + range, 'i' || (range % 97), repeat('y', (range % 40)::INT) || range "
            f"FROM range({n})"
        )
        con.execute(
            f"INSERT OR REPLACE INTO inst SELECT 'i' || (range % 97), {total} + range, 'v{n_commit}' FROM range(97)"
        )
        if n_commit % 5 == 3:
            con.execute("DELETE FROM inst WHERE n % 5 = 0")
        con.execute("COMMIT")
        total += n
        if n_commit % 3 == 0:
            con.execute("CHECKPOINT")
        assert pub.publish(n_commit)
        current = snapshot.current(path)
        assert current is not None and current.commits == n_commit and current.path is not None
        assert _seen_by_a_reader(current.path) == json.loads(json.dumps(con.execute(STATE).fetchall()))
    pub.close()
    assert snapshot.current(path) is None  # the pointer goes with the writer
    con.close()
    pub.release()


def test_a_small_commit_copies_a_few_blocks_not_the_file(tmp_path):
    path = tmp_path / "f.duckdb"
    con, pub = _writer(path)
    con.execute("INSERT INTO log SELECT range, 'i' || (range % 97), repeat('y', 30) || range FROM range(2000000)")
    con.execute("CHECKPOINT")
    size = path.stat().st_size
    assert size > 20 << 20
    for commits in range(1, 4):  # each copy is filled once
        con.execute("INSERT INTO log VALUES (-?, 'a', 'x')", [commits])
        con.execute("CHECKPOINT")
        assert pub.publish(commits)
    assert pub.copied_bytes >= 2 * size * 0.9  # two copies take turns while no reader holds one
    for commits in range(4, 7):  # without a CHECKPOINT: the write-ahead log and no block
        before = pub.copied_bytes
        con.execute("INSERT INTO log VALUES (-?, 'a', 'x')", [commits])
        assert pub.publish(commits)
        assert pub.copied_bytes - before < (1 << 20), (commits, pub.copied_bytes - before)
    for commits in range(7, 10):
        before = pub.copied_bytes
        con.execute("INSERT INTO log VALUES (-?, 'a', 'x')", [commits])
        con.execute("INSERT OR REPLACE INTO inst VALUES ('i-1', ?, 'x')", [commits])
        con.execute("CHECKPOINT")
        assert pub.publish(commits)
        assert pub.copied_bytes - before < size / 8, (commits, pub.copied_bytes - before, size)  # a few blocks
    current = snapshot.current(path)
    assert _seen_by_a_reader(current.path, "SELECT count(*), min(i) FROM log") == [[2000009, -9]]
    pub.close()
    con.close()
    pub.release()


def test_a_copy_a_reader_holds_is_never_written_and_the_writer_never_waits(tmp_path):
    path = tmp_path / "f.duckdb"
    con, pub = _writer(path)
    con.execute("INSERT INTO log VALUES (1, 'a', 'x')")
    con.execute("CHECKPOINT")
    assert pub.publish(1)
    readers = []
    try:
        for commits in (2, 3):  # readers hold every copy: the current one and the one made current next
            held = snapshot.current(path)
            assert held is not None and held.path is not None
            readers.append(duckdb.connect(str(held.path), read_only=True))
            con.execute("INSERT INTO log VALUES (?, 'a', 'x')", [commits])
            con.execute("CHECKPOINT")
            assert pub.publish(commits)
        held = snapshot.current(path)
        assert held is not None and held.path is not None
        readers.append(duckdb.connect(str(held.path), read_only=True))
        con.execute("INSERT INTO log VALUES (4, 'a', 'x')")
        con.execute("CHECKPOINT")
        assert not pub.publish(4)  # all three copies are read: skipped, at once
        assert [r.execute("SELECT count(*) FROM log").fetchall()[0][0] for r in readers] == [1, 2, 3]
        readers.pop(0).close()
        assert pub.publish(4)  # the first reader left: its copy is written
        current = snapshot.current(path)
        assert current is not None and current.commits == 4
        assert _seen_by_a_reader(current.path, "SELECT count(*) FROM log") == [[4]]
        assert [r.execute("SELECT count(*) FROM log").fetchall()[0][0] for r in readers] == [2, 3]
    finally:
        for r in readers:
            r.close()
        pub.close()
        con.close()
        pub.release()


def test_a_copy_left_half_written_is_made_again_and_a_failed_copy_costs_only_freshness(tmp_path, monkeypatch):
    path = tmp_path / "f.duckdb"
    con, pub = _writer(path)
    con.execute("INSERT INTO log SELECT range, 'a', 'x' FROM range(200000)")
    con.execute("CHECKPOINT")
    assert pub.publish(1)
    # The disk refuses a copy (ENOSPC, as a full disk would; a full disk cannot be made here without root):
    # the publish is skipped, the writer goes on, readers keep the copy they had.
    con.execute("INSERT INTO log VALUES (-1, 'a', 'x')")
    con.execute("CHECKPOINT")

    def full(*_args: object) -> int:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "copy_file_range", full)
    assert not pub.publish(2)
    monkeypatch.undo()
    current = snapshot.current(path)
    assert current is not None and current.commits == 1
    assert _seen_by_a_reader(current.path, "SELECT count(*) FROM log") == [[200000]]
    partial = list(snapshot.snapshot_dir(path).glob("*.partial"))
    assert len(partial) == 1  # the copy it was writing is marked
    pub.close()
    con.close()
    pub.release()
    # The next writer of the file remakes the marked copy from scratch and keeps the complete one.
    con = duckdb.connect(str(path))
    block = con.execute("SELECT block_size FROM pragma_database_size()").fetchall()[0][0]
    pub = snapshot.Publisher(path, block)
    assert not list(snapshot.snapshot_dir(path).glob("*.partial"))
    assert sum(f is not None for f in pub._fields) == 1
    assert pub.publish(2)
    current = snapshot.current(path)
    assert _seen_by_a_reader(current.path, "SELECT count(*) FROM log") == [[200001]]
    pub.close()
    con.close()
    pub.release()


def test_publishing_keeps_the_writers_lock_on_the_file(tmp_path):
    """The publisher reads the file through a descriptor it keeps: closing one (or an mmap's duplicate) would drop
    DuckDB's lock, and another process could open the file the writer writes."""
    db = tmp_path / "f.duckdb"
    store = FileStore(db, "g")
    try:
        for n in range(3):
            store.con.execute("INSERT INTO instances (instance_id) VALUES (?)", [f"i-{n}"])
            store.totals = store.totals + type(store.totals)(commits=1)  # as a commit counts itself
            assert store.publish()
        out = subprocess.run(
            [sys.executable, "-c", f"import duckdb; duckdb.connect({str(db)!r}, read_only=True)"],
            capture_output=True,
            text=True,
        )
        assert out.returncode != 0 and "lock" in out.stderr.lower()
    finally:
        store.close()


def test_readers_read_the_snapshot_while_a_store_holds_the_file_and_the_file_after(tmp_path):
    """run_query on a file a FileStore holds reads its snapshot (in this process, and in a bounded one of its own),
    says as of which commit; once the store closes, the file itself."""
    from flightrec.db.sandbox import ReadLimits

    db = tmp_path / "f.duckdb"
    store = FileStore(db, "g")
    try:
        assert snapshot.current(db) is not None
        store.con.execute("INSERT INTO instances (instance_id) VALUES ('i-1')")  # not a commit of the store
        for limits in (None, ReadLimits()):
            t = run_query(db, "SELECT count(*) AS n FROM instances", limits=limits)
            assert t.to_pylist() == [{"n": 0}]  # the snapshot is as of the last publish
            fresh = freshness(t)
            assert fresh is not None and fresh.source == "snapshot" and "behind the materializer" in fresh.line()
        with pytest.raises(QueryError, match="not DELETE"):
            run_query(db, "DELETE FROM instances")
    finally:
        store.close()
    assert snapshot.current(db) is None
    t = run_query(db, "SELECT count(*) AS n FROM instances")
    assert t.to_pylist() == [{"n": 1}]
    assert freshness(t).source == "file" and "no materializer is running" in freshness(t).line()


def test_a_detached_stores_snapshots_stay_and_follow_a_file_replaced_meanwhile(tmp_path):
    """A store closed to be opened again (a compaction) keeps the pointer, so readers read the last copy and not the
    file; the store opened next takes the publisher over. When the path names another file by then (a compaction
    renamed its copy over it), the publisher reads that one, keeps DuckDB's lock on it, and copies it whole."""
    from flightrec.db.compact import compact_file

    db = tmp_path / "f.duckdb"
    store = FileStore(db, "g")
    store.con.execute("INSERT INTO instances (instance_id) SELECT 'i-' || range FROM range(5000)")
    store.wrote()
    assert store.publish()
    publisher = store.detach()
    assert publisher is not None and store.publisher is None
    try:
        assert snapshot.current(db) is not None  # readers keep the snapshot while the file is replaced
        assert run_query(db, "SELECT count(*) AS n FROM instances").to_pylist() == [{"n": 5000}]
        compact_file(db, lock_wait=1.0)
        runs = []
        real = snapshot.changed_runs
        snapshot.changed_runs = lambda new, old: runs.append((len(new), real(new, old))) or runs[-1][1]
        try:
            again = FileStore(db, "g", snapshots=publisher)
        finally:
            snapshot.changed_runs = real
    except BaseException:
        publisher.close()
        publisher.release()
        raise
    try:
        assert again.publisher is publisher
        blocks, copied = runs[0]
        assert copied == [(0, blocks)]  # the new file whole
        assert not publisher.follow(publisher.block)  # the same file: nothing opened, nothing closed
        out = subprocess.run(
            [sys.executable, "-c", f"import duckdb; duckdb.connect({str(db)!r}, read_only=True)"],
            capture_output=True,
            text=True,
        )
        assert out.returncode != 0 and "lock" in out.stderr.lower()  # DuckDB's lock on the new file held
        again.con.execute("DELETE FROM instances WHERE instance_id <> 'i-1'")
        again.wrote()
        assert again.publish()
        assert run_query(db, "SELECT count(*) AS n FROM instances").to_pylist() == [{"n": 1}]
    finally:
        again.close()
    assert snapshot.current(db) is None
