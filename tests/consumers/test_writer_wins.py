"""The writer always wins: no read a reader may run makes a commit fail or the materializer exit."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import duckdb
import pytest
from flightrec.db.fold import RawMessage, fold
from flightrec.db.query import run_query
from flightrec.schemas import encode
from materializer_helpers import Boot

from flightrec.errors import MaterializeError, QueryError

EXE = str(Path(sys.executable).with_name("flightrec"))
# passes the statement check; fills the writer's shared memory (and spills gigabytes) in seconds
HOG = "SELECT count(DISTINCT (a.range::varchar || repeat('y', 50))) FROM range(300000000) a"


def _delta(boot: Boot, first_offset: int = 0):
    return fold(
        [RawMessage(e.topic, 0, first_offset + i, e.instance_id.encode(), encode(e)) for i, e in enumerate(boot.events)]
    )


def test_a_read_too_large_for_a_live_read_is_stopped_and_told_so(tmp_path: Path) -> None:
    from flightrec.db.filestore import FileStore
    from flightrec.db.live import query_live
    from flightrec.db.serve import QueryServer

    db = tmp_path / "fr.duckdb"
    store = FileStore(db, "g")
    try:
        with QueryServer(store.con.cursor(), db) as server:
            t0 = time.monotonic()
            with pytest.raises(QueryError, match="too large for a live read") as err:
                query_live(db, HOG)
            assert time.monotonic() - t0 < 30
            assert "\n" not in str(err.value) and "copy of the database" in str(err.value)
            assert server.counters["reads_stopped"] >= 1
            # the writer commits at once, and ordinary reads go on
            boot = Boot()
            boot.lines("benchmark", "stdout", ["after the hog"])
            store.commit(_delta(boot))
            assert query_live(db, "SELECT count(*) AS n FROM log_lines").to_pylist() == [{"n": 1}]
            spilled = store.con.execute("SELECT sum(temporary_storage_bytes) FROM duckdb_memory()").fetchone()[0]
            assert spilled < 2 << 30
    finally:
        store.close()


def test_a_commit_out_of_memory_stops_the_reads_and_commits_again(tmp_path: Path, monkeypatch) -> None:
    """DuckDB gives "Out of Memory" to whichever allocation loses the race for the last page, so a test cannot
    arrange for the commit to lose it: the first try's OOM is injected (a real duckdb.OutOfMemoryException raised
    inside the transaction, after rows were written); everything after it is the real store."""
    from flightrec.db.filestore import FileStore

    db = tmp_path / "fr.duckdb"
    store = FileStore(db, "g")
    stopped: list[str] = []
    store.make_room = lambda why: stopped.append(why) or 1
    real = store._write
    tries = {"n": 0}

    def failing_first(delta):
        out = real(delta)
        tries["n"] += 1
        if tries["n"] == 1:
            raise duckdb.OutOfMemoryException("Out of Memory Error: failed to allocate data of size 4.0 KiB")
        return out

    monkeypatch.setattr(store, "_write", failing_first)
    boot = Boot()
    boot.lines("benchmark", "stdout", [f"line {i}" for i in range(100)])
    try:
        stats = store.commit(_delta(boot))
        assert stats.oom_retried == 1 and stats.lines_written == 100 and stopped == ["a commit ran out of memory"]
        assert store.con.execute("SELECT count(*) FROM log_lines").fetchone()[0] == 100  # once, not twice
        assert store.totals.lines_written == 100

        tries["n"] = -10  # from now on every try fails: the commit gives up with the reason, nothing written
        monkeypatch.setattr(
            store,
            "_write",
            lambda d: (_ for _ in ()).throw(duckdb.OutOfMemoryException("Out of Memory Error: failed to allocate")),
        )
        again = Boot()
        again.lines("benchmark", "stdout", ["never"])
        with pytest.raises(MaterializeError, match="tried 3 times"):
            store.commit(_delta(again))
        assert store.con.execute("SELECT count(*) FROM log_lines").fetchone()[0] == 100
    finally:
        store.close()


@pytest.mark.integration
def test_the_hog_from_flightrec_sql_leaves_a_live_materializer_committing(kafka, tmp_path: Path) -> None:
    db = tmp_path / "fr.duckdb"
    env = kafka.env(
        PYTHONSAFEPATH="1", FLIGHTREC_LOG_LEVEL="WARNING", FLIGHTREC_SPOOL=str(tmp_path / "spool"), FLIGHTREC_FACTS=""
    )
    kafka.seed_at_mark(db)
    mat = subprocess.Popen(
        [EXE, "materialize", "--db", str(db)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    instance = f"writer-wins-{uuid.uuid4().hex[:8]}"
    n = 400
    ticker = f"import time\nfor i in range({n}):\n    print('tick', i, flush=True)\n    time.sleep(0.025)\n"
    agent = subprocess.Popen(
        [EXE, "agent", "run", "--instance", instance, "--stage", "s", "--", sys.executable, "-c", ticker],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "fr.duckdb.sock").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        hog: dict = {}

        def run_hog() -> None:
            t0 = time.monotonic()
            hog["r"] = subprocess.run(
                [EXE, "sql", "--db", str(db), HOG], env=env, capture_output=True, text=True, timeout=300
            )
            hog["s"] = time.monotonic() - t0

        t = threading.Thread(target=run_hog)
        t.start()
        t.join(300)
        assert agent.wait(120) == 0
        r = hog["r"]
        assert r.returncode == 1 and "too large for a live read" in r.stderr, r.stderr
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert hog["s"] < 30
        deadline = time.monotonic() + 60
        got = 0
        while time.monotonic() < deadline:
            got = run_query(db, "SELECT count(*) AS n FROM log_lines WHERE instance_id = ?", [instance]).to_pylist()[0][
                "n"
            ]
            if got == n or mat.poll() is not None:
                break
            time.sleep(0.3)
        assert mat.poll() is None, f"the materializer exited: {mat.stderr.read()[-3000:] if mat.stderr else ''}"
        assert got == n  # committed without a restart
    finally:
        if agent.poll() is None:
            agent.kill()
        mat.terminate()
        mat.wait(60)


def test_an_oom_retry_keeps_the_totals_of_earlier_commits(tmp_path: Path, monkeypatch) -> None:
    """(Found by review.) The first try's OOM is injected, as above."""
    from flightrec.db.filestore import FileStore

    store = FileStore(tmp_path / "fr.duckdb", "g")
    store.make_room = lambda why: 0
    try:
        a = Boot()
        a.lines("benchmark", "stdout", [f"a {i}" for i in range(100)])
        store.commit(_delta(a))
        real, tries = store._write, {"n": 0}

        def failing_first(delta):
            out = real(delta)
            tries["n"] += 1
            if tries["n"] == 1:
                raise duckdb.OutOfMemoryException("Out of Memory Error: injected")
            return out

        monkeypatch.setattr(store, "_write", failing_first)
        b = Boot()
        b.lines("benchmark", "stdout", [f"b {i}" for i in range(7)])
        store.commit(_delta(b, 1000))
        assert (store.totals.commits, store.totals.lines_written) == (2, 107)
        assert store.con.execute("SELECT commits, lines FROM materializer_runs").fetchall() == [(2, 107)]
    finally:
        store.close()


def test_a_result_too_large_for_the_materializer_s_memory_is_refused(tmp_path: Path) -> None:
    """(Found by review.) A result is built outside DuckDB's memory limit: over half of it, the read is stopped."""
    from flightrec.db.filestore import FileStore
    from flightrec.db.live import query_live
    from flightrec.db.serve import QueryServer

    db = tmp_path / "fr.duckdb"
    store = FileStore(db, "g", memory_limit="200MB")
    try:
        with QueryServer(store.con.cursor(), db) as server:
            with pytest.raises(QueryError, match="too large for a live read.*result passed"):
                query_live(db, "SELECT repeat('y', 1000) || range AS s FROM range(300000)")
            assert server.counters["reads_stopped"] >= 1
            assert query_live(db, "SELECT count(*) AS n FROM range(300000)").to_pylist() == [{"n": 300000}]
    finally:
        store.close()


def test_aggregate_states_count_as_a_read_s_memory(tmp_path: Path) -> None:
    """(Found by review.) list() and string_agg() hold their states in DuckDB's ALLOCATOR, not in a hash table."""
    from flightrec.db.filestore import FileStore
    from flightrec.db.live import query_live
    from flightrec.db.serve import QueryServer

    db = tmp_path / "fr.duckdb"
    store = FileStore(db, "g", memory_limit="300MB")
    try:
        with QueryServer(store.con.cursor(), db):
            with pytest.raises(QueryError, match="too large for a live read|Out of Memory"):
                query_live(db, "SELECT length(string_agg(repeat('y', 1000) || range, ',')) FROM range(2000000)")
            boot = Boot()
            boot.lines("benchmark", "stdout", ["after"])
            store.commit(_delta(boot))
    finally:
        store.close()
