"""Reads while the materializer writes: `flightrec sql` on its snapshot, and reader SQL can neither write nor touch
files, on the snapshot, in a read's own process and on the file."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from flightrec.db.query import freshness, run_query
from flightrec.db.sandbox import ReadLimits
from materializer_helpers import Boot, flightrec, materialize, publish, serving

from flightrec.errors import QueryError

pytestmark = pytest.mark.integration

FORBIDDEN = [
    ("SELECT * FROM read_csv('/etc/passwd')", "table functions readers may not use: read_csv"),
    ("SELECT * FROM read_text('/etc/hostname')", "table functions readers may not use: read_text"),
    ("SELECT * FROM glob('/etc/*')", "table functions readers may not use: glob"),
    ("COPY log_lines TO '/tmp/flightrec-leak.csv'", "not COPY"),
    ("DELETE FROM log_lines", "not DELETE"),
    ("DROP TABLE instances", "not DROP"),
    ("ATTACH '/tmp/other.duckdb' AS o", "not ATTACH"),
    ("INSTALL httpfs", "not"),
    ("SET enable_external_access = true", "not SET"),
    ("SELECT 1; DELETE FROM log_lines", "one statement at a time"),
    ("SELECT * FROM query('DELETE FROM log_lines')", "table functions readers may not use: query"),
]


def _count(db: Path, instance: str) -> int:
    return run_query(db, "SELECT count(*) AS n FROM log_lines WHERE instance_id = ?", [instance]).to_pylist()[0]["n"]


def test_sql_reads_counts_while_the_materializer_writes(kafka, db, env_for):
    env = env_for()
    b = Boot()
    b.facts()
    exe = Path(sys.executable).with_name("flightrec")
    kafka.seed_at_mark(db)
    proc = subprocess.Popen(
        [str(exe), "materialize", "--db", str(db)],
        env={**env, "PYTHONSAFEPATH": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        seen = []
        for round_ in range(3):
            b.lines("supervisor", "stdout", [f"round {round_} line {i}" for i in range(100)])
            publish(kafka.bootstrap, b.events[-2:] if round_ == 0 else b.events[-1:])
            deadline = time.monotonic() + 60
            while True:
                assert proc.poll() is None, proc.communicate()[1].decode()
                if serving(db):
                    out = flightrec(
                        "sql",
                        "--db",
                        str(db),
                        "--json",
                        f"SELECT count(*) AS n FROM log_lines WHERE instance_id = '{b.instance}'",
                        env=env,
                    )
                    n = json.loads(out.stdout.splitlines()[0])["n"]
                    if n == 100 * (round_ + 1):
                        seen.append(n)
                        break
                assert time.monotonic() < deadline, f"round {round_}: still {n} lines visible"
                time.sleep(0.2)
        assert seen == [100, 200, 300]

        # The text table, through the CLI, on the snapshot; stderr says as of which commit.
        out = flightrec(
            "sql",
            "--db",
            str(db),
            f"SELECT instance_id, events FROM instances WHERE instance_id = '{b.instance}'",
            env=env,
        )
        assert out.stdout.splitlines()[0].split() == ["instance_id", "events"]
        assert b.instance in out.stdout and "(1 row)" in out.stdout
        assert out.stderr.startswith("-- as of commit ") and "s behind the materializer" in out.stderr, out.stderr

        # Reader SQL can neither write nor read files on the snapshot, in this process or a read's own.
        for sql, why in FORBIDDEN:
            for limits in (None, ReadLimits(seconds=30)):
                with pytest.raises(QueryError, match=why):
                    run_query(db, sql, limits=limits)
        assert not Path("/tmp/flightrec-leak.csv").exists()
        # The CLI says no, with a non-zero exit.
        bad = flightrec("sql", "--db", str(db), "DELETE FROM log_lines", env=env, check=False)
        assert bad.returncode == 1 and "only read-only queries" in bad.stderr
        assert _count(db, b.instance) == 300
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err.decode()
    assert not serving(db)  # a clean stop takes the pointer away: readers read the file

    # With no materializer running the file is opened read-only, with the same refusals.
    assert _count(db, b.instance) == 300
    for sql, why in FORBIDDEN:
        with pytest.raises(QueryError, match=why):
            run_query(db, sql)
    out = flightrec(
        "sql",
        "--db",
        str(db),
        "--csv",
        f"SELECT count(*) AS n FROM log_lines WHERE instance_id = '{b.instance}'",
        env=env,
    )
    assert out.stdout.splitlines() == ["n", "300"]
    assert "no materializer is running" in out.stderr


def test_sql_on_a_missing_database_says_what_to_do(tmp_path, env_for):
    out = flightrec("sql", "--db", str(tmp_path / "none.duckdb"), "SELECT 1", env=env_for(), check=False)
    assert out.returncode == 1 and "flightrec materialize" in out.stderr


def test_prelude_views_and_params_on_the_snapshot_path(kafka, db):
    b = Boot()
    b.facts()
    b.lines("s", "stdout", ["a", "b", "c"])
    publish(kafka.bootstrap, b.events)
    materialize(kafka, db, idle=0.5)
    from flightrec.db.filestore import FileStore

    store = FileStore(db, "g")
    try:
        for limits in (None, ReadLimits(seconds=30)):
            t = run_query(
                db,
                "SELECT n FROM three WHERE instance_id = $i",
                {"i": b.instance},
                prelude=[
                    "CREATE OR REPLACE TEMP VIEW three AS SELECT instance_id, count(*) AS n FROM log_lines GROUP BY ALL"
                ],
                limits=limits,
            )
            assert t.to_pylist() == [{"n": 3}] and freshness(t).source == "snapshot"
            # Temp views of one read do not leak into the next.
            with pytest.raises(QueryError, match="three"):
                run_query(db, "SELECT * FROM three", limits=limits)
        # The writer writes on: nothing of the reads is in its process.
        store.con.execute("CREATE TABLE scratch AS SELECT 1 AS x")
    finally:
        store.close()


def test_the_prelude_is_no_way_around_the_read_only_check(db):
    # A COMMIT in a prelude would let later statements write for good (on a read-write connection), so only
    # CREATE TEMP VIEW statements pass, whichever path the read takes.
    import hashlib

    from flightrec.db import snapshot
    from flightrec.db.filestore import FileStore

    evil = (
        """INSERT INTO dead_letters (topic, "partition", "offset", reason) VALUES ('x', 0, 0, 'written by a reader')"""
    )
    store = FileStore(db, "g")
    try:
        copy = snapshot.current(db).path
        before = hashlib.sha256(copy.read_bytes()).hexdigest()
        for limits in (None, ReadLimits(seconds=30)):
            for prelude in (
                ["COMMIT", evil],
                [evil, "COMMIT"],
                ["CREATE OR REPLACE TEMP VIEW v AS SELECT 1; COMMIT", evil],
                ["CREATE TABLE kept AS SELECT 1 AS x", "COMMIT"],
                ["SET threads = 1"],
            ):
                with pytest.raises(QueryError, match="CREATE TEMP VIEW"):
                    run_query(db, "SELECT 1 AS one", prelude=prelude, limits=limits)
            t = run_query(db, "SELECT * FROM v", prelude=["create temporary view v as select 1 as one"], limits=limits)
            assert t.to_pylist() == [{"one": 1}]
        assert store.con.execute("SELECT count(*) FROM dead_letters").fetchone()[0] == 0
        assert store.con.execute("SELECT count(*) FROM duckdb_tables() WHERE table_name = 'kept'").fetchone()[0] == 0
        assert hashlib.sha256(copy.read_bytes()).hexdigest() == before
    finally:
        store.close()


def test_a_write_hidden_in_explain_analyze_is_refused_on_the_snapshot_path(db):
    from flightrec.db.filestore import FileStore

    store = FileStore(db, "g")
    try:
        store.con.execute("INSERT INTO instances (instance_id) VALUES ('i-1')")
        for limits in (None, ReadLimits(seconds=30)):
            for sql in (
                "EXPLAIN ANALYZE DELETE FROM instances",
                "EXPLAIN ANALYZE INSERT INTO instances (instance_id) VALUES ('x')",
            ):
                with pytest.raises(QueryError, match="read-only"):
                    run_query(db, sql, limits=limits)
            assert run_query(db, "EXPLAIN ANALYZE SELECT count(*) FROM instances", limits=limits).num_rows
        assert store.con.execute("SELECT count(*) FROM instances").fetchone()[0] == 1
    finally:
        store.close()


def test_a_batch_is_committed_once_the_topics_go_quiet_not_at_the_end_of_the_window(kafka, db, env_for):
    """A file materializer commits a partial batch as soon as a read finds nothing more (the topics are quiet): the
    batch window (FLIGHTREC_COMMIT_INTERVAL, here 30 s) bounds how long a batch grows under a steady stream, it is
    not a wait imposed on the last lines of a burst or on a lone failure. Before, each round waited the whole 30 s."""
    env = env_for(FLIGHTREC_COMMIT_INTERVAL="30")
    b = Boot()
    kafka.seed_at_mark(db)
    proc = subprocess.Popen(
        [str(Path(sys.executable).with_name("flightrec")), "materialize", "--db", str(db)],
        env={**env, "PYTHONSAFEPATH": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 60
        while not serving(db):
            assert proc.poll() is None, proc.communicate()[1].decode()
            assert time.monotonic() < deadline, "the materializer never published a snapshot"
            time.sleep(0.1)
        for round_ in range(2):
            b.lines("supervisor", "stdout", [f"round {round_} line {i}" for i in range(10)])
            publish(kafka.bootstrap, b.events[-1:])
            sent = time.monotonic()
            while _count(db, b.instance) < 10 * (round_ + 1):
                assert proc.poll() is None, proc.communicate()[1].decode()
                assert time.monotonic() - sent < 15, f"round {round_}: not committed 15 s after it was sent"
                time.sleep(0.1)
    finally:
        proc.terminate()
        proc.wait(30)
