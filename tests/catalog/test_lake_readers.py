"""Readers on a lake: `flightrec sql`, `timeline` and the dashboard read it read-only, with the same walls as on
a file (no writes, no files beyond the lake), and see each new commit."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest
from flightrec.db import lake as lakes
from flightrec.db.query import run_query
from flightrec.db.views import VIEWS

from flightrec.errors import FlightrecError

NO_KERNEL = "CUDA error: no kernel image is available for execution on the device"


def flightrec(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "flightrec", *args],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONSAFEPATH": "1", **(env or {})},
        timeout=180,
    )


def writer(db: str) -> duckdb.DuckDBPyConnection:
    return lakes.connect(lakes.parse_db(db))


def snapshots(db: str) -> int:
    con = writer(db)
    try:
        return con.execute("SELECT count(*) FROM ducklake_snapshots('lake')").fetchone()[0]
    finally:
        con.close()


def test_sql_reads_a_lake(fleet_lake):
    db, _, ids = fleet_lake
    r = flightrec("sql", "--db", db, "--json", "SELECT instance_id, status FROM fleet ORDER BY instance_id")
    assert r.returncode == 0, r.stderr
    rows = [json.loads(line) for line in r.stdout.splitlines()]
    assert {row["instance_id"] for row in rows} == {ids["ok"], ids["no_kernel"], ids["slow"]}
    assert {row["status"] for row in rows if row["instance_id"] != ids["ok"]} <= {"failed", "below_min_rate"}
    r = flightrec(
        "sql", "--db", db, "SELECT failure_class FROM failures WHERE instance_id = '{}'".format(ids["no_kernel"])
    )
    assert r.returncode == 0 and "gpu_arch_unsupported" in r.stdout, r.stderr


def test_every_view_answers_the_same_on_the_lake_as_on_the_file(lake_file_pair):
    db, file = lake_file_pair
    names = [
        r[0]
        for r in duckdb.connect()
        .execute("SELECT unnest(regexp_extract_all(?, 'VIEW\\s+(\\w+)', 1))", ["\n".join(VIEWS)])
        .fetchall()
    ]
    assert "fleet" in names and "failure_context" in names
    for name in names + ["instances", "log_lines", "failures", "throughput", "process_exits"]:
        sql = f"SELECT * FROM {name}"
        on_file = run_query(file, sql, prelude=VIEWS)
        on_lake = run_query(db, sql, prelude=VIEWS)
        key = [
            c for c in on_file.column_names if c not in ("now_us", "age_s", "silent_s", "age_hours")
        ]  # read-time ages: now() moves between the two reads
        assert on_lake.schema.names == on_file.schema.names, name
        # each value as text: the same instant reads as UTC from a file and as Etc/UTC from the lake
        lake_rows, file_rows = (
            sorted(str([str(v) for v in row.values()]) for row in t.select(key).to_pylist()) for t in (on_lake, on_file)
        )
        assert lake_rows == file_rows, name


HOSTILE = [
    ("COPY (SELECT * FROM instances) TO '{leak}'", "COPY"),
    ("SELECT * FROM read_csv('/etc/passwd')", "read_csv"),
    ("ATTACH '{other}' AS other", "ATTACH"),
    ("INSTALL httpfs", "INSTALL"),
    ("LOAD postgres_scanner", "LOAD"),
    ("SET enable_external_access = true", "SET"),
    ("INSERT INTO instances (instance_id) VALUES ('x')", "INSERT"),
    ("DELETE FROM failures", "DELETE"),
    ("DROP TABLE instances", "DROP"),
    ("CALL ducklake_expire_snapshots('lake', older_than => now())", "CALL"),
    ("SELECT * FROM ducklake_expire_snapshots('lake', older_than => now())", "ducklake_expire_snapshots"),
    (
        "SELECT * FROM postgres_query('__ducklake_metadata_lake', 'SELECT pg_read_file(''/etc/passwd'')')",
        "postgres_query",
    ),
    ("CALL postgres_execute('__ducklake_metadata_lake', 'DROP TABLE ducklake_snapshot')", "CALL"),
    ("SELECT * FROM read_parquet('/etc/*.parquet')", "read_parquet"),
    ("USE memory", "USE"),
    ("DETACH lake", "DETACH"),
]


def test_hostile_sql_on_a_lake_is_refused(fleet_lake, tmp_path):
    db, _, _ = fleet_lake
    leak, other = tmp_path / "leak.csv", tmp_path / "other.duckdb"
    before = snapshots(db)
    for sql, word in HOSTILE:
        r = flightrec("sql", "--db", db, sql.format(leak=leak, other=other))
        assert r.returncode == 1, f"{word}: {sql!r} was not refused: {r.stdout}"
        assert r.stderr.startswith("flightrec sql:"), r.stderr
    assert not leak.exists() and not other.exists()
    assert snapshots(db) == before
    r = flightrec("sql", "--db", db, "--json", "SELECT count(*) AS n FROM instances")
    assert r.returncode == 0 and json.loads(r.stdout) == {"n": 3}


def test_the_reader_connection_itself_holds_the_walls(fleet_lake, tmp_path):
    """Past the statement check (as if it had a hole): the reader's own DuckDB refuses files, writes, settings."""
    db, _, _ = fleet_lake
    # the cursor is made ready for what these statements name (flightrec.db.lakecopy), as run_query does
    cur = lakes.reader_cursor(lakes.parse_db(db), texts=("instances", "log_lines"))
    try:
        assert cur.execute("SELECT count(*) FROM instances").fetchone() == (3,)
        assert cur.execute("SELECT count(*) FROM log_lines").fetchone()[0] > 0  # Parquet files of the lake: allowed
        for sql in (
            f"COPY (SELECT 1) TO '{tmp_path / 'x.csv'}'",
            "SELECT * FROM read_csv('/etc/passwd')",
            f"ATTACH '{tmp_path / 'y.duckdb'}' AS y",
            "SET enable_external_access = true",
            f"ATTACH '{db.replace('dbname=', 'dbname=other_')}' AS other",
            "ATTACH 'postgres:dbname=postgres host=127.0.0.1' AS pg (TYPE postgres)",
            "SET lock_configuration = false",
            "LOAD httpfs",
            "INSERT INTO instances (instance_id) VALUES ('x')",
            "CALL ducklake_expire_snapshots('lake', older_than => now())",
            "CALL postgres_execute('__ducklake_metadata_lake', 'DROP TABLE ducklake_snapshot')",
        ):
            with pytest.raises(duckdb.Error):
                cur.execute(sql)
                cur.fetchall()
    finally:
        cur.close()
    assert not (tmp_path / "x.csv").exists() and not (tmp_path / "y.duckdb").exists()
    assert run_query(db, "SELECT count(*) AS n FROM instances").to_pylist() == [{"n": 3}]


def test_a_reader_sees_each_new_commit(fleet_lake):
    db, _, _ = fleet_lake
    assert run_query(db, "SELECT count(*) AS n FROM lifecycle_events").to_pylist()[0]["n"] > 0
    before = run_query(db, "SELECT count(*) AS n FROM log_lines").to_pylist()[0]["n"]
    w = writer(db)
    w.execute(
        "INSERT INTO log_lines (instance_id, boot_id, event_id, seq, stage, source, line_no, ts_us, text) "
        "VALUES ('i-new', 'b', 'e', 1, 's', 'stdout', 1, 1, 'hello')"
    )
    w.execute("CREATE TABLE later AS SELECT 42 AS answer")
    w.close()
    assert run_query(db, "SELECT count(*) AS n FROM log_lines").to_pylist()[0]["n"] == before + 1
    assert run_query(db, "SELECT answer FROM later").to_pylist() == [{"answer": 42}]


def test_a_reader_finds_the_files_under_another_path(fleet_lake, tmp_path):
    """A reader on another host may mount the data folder elsewhere: --data-path says where."""
    db, data_path, ids = fleet_lake
    moved = tmp_path / "mounted-elsewhere"
    shutil.move(data_path, moved)
    r = flightrec("sql", "--db", db, "SELECT max(text) AS t FROM log_lines")
    assert r.returncode == 1  # the files are not where the catalog says
    r = flightrec("sql", "--db", db, "--data-path", str(moved), "SELECT max(text) AS t FROM log_lines")
    assert r.returncode == 0, r.stderr
    r = flightrec("sql", "--db", db, "SELECT max(text) AS t FROM log_lines", env={"FLIGHTREC_DATA_PATH": str(moved)})
    assert r.returncode == 0, r.stderr
    r = flightrec("timeline", ids["no_kernel"], "--db", db, "--data-path", str(moved))
    assert r.returncode == 0 and NO_KERNEL in r.stdout, r.stderr


def test_data_path_is_refused_for_a_database_file(tmp_path):
    r = flightrec("sql", "--db", str(tmp_path / "x.duckdb"), "--data-path", str(tmp_path), "SELECT 1")
    assert r.returncode == 1 and "--data-path" in r.stderr and "ducklake" in r.stderr


def test_timeline_of_an_instance_in_a_lake(fleet_lake):
    db, _, ids = fleet_lake
    r = flightrec("timeline", ids["no_kernel"], "--db", db)
    assert r.returncode == 0, r.stderr
    assert NO_KERNEL in r.stdout and "benchmark" in r.stdout
    r = flightrec("timeline", "no-such-instance", "--db", db)
    assert r.returncode == 1 and "no events" in r.stderr


def test_an_unreachable_lake_is_said_once_and_recovers(fleet_lake):
    db, _, _ = fleet_lake
    broken = db.replace("dbname=", "dbname=no_such_") + " connect_timeout=5"
    with pytest.raises(FlightrecError, match="cannot attach the lake"):
        run_query(broken, "SELECT 1 AS x")
    assert run_query(db, "SELECT count(*) AS n FROM instances").to_pylist() == [{"n": 3}]


# -- the dashboard ------------------------------------------------------------------


def _text(at) -> str:
    parts: list[str] = []
    for kind in ("markdown", "caption", "code", "info", "warning", "error", "title", "header", "subheader"):
        parts += [str(e.value) for e in getattr(at, kind)]
    return "\n".join(parts + [f"{m.label}={m.value}" for m in at.metric])


def test_dashboard_pages_render_from_a_lake(fleet_lake, open_page):
    db, _, ids = fleet_lake
    at = open_page(db)
    assert at.title[0].value == "Fleet"
    assert next(m.value for m in at.metric if m.label == "Instances") == "3"
    assert set(at.dataframe[0].value["instance_id"]) == {ids["ok"], ids["no_kernel"], ids["slow"]}
    at = open_page(db, "instance", instance=ids["no_kernel"])
    assert NO_KERNEL in list(at.dataframe[-1].value["text"])
    at = open_page(db, "failures", failure=ids["no_kernel_failure"])
    assert NO_KERNEL in [c.value for c in at.code]
    at = open_page(db, "throughput")
    assert "NVIDIA H100 80GB HBM3" in set(at.dataframe[0].value.index) | set(at.dataframe[0].value.get("gpu_model", []))
    at = open_page(db, "sql")
    assert set(at.dataframe[0].value["failure_class"]) == {"gpu_arch_unsupported", "below_min_rate"}
    for bad in ("DROP TABLE instances", "COPY instances TO '/tmp/flightrec-lake-leak.csv'"):
        next(t for t in at.text_area).input(bad)
        at.button(key="sql_run").click().run()
        assert at.error, f"{bad!r} was not refused"
    assert not Path("/tmp/flightrec-lake-leak.csv").exists()
    assert "Cannot read" not in _text(at)


def test_wait_sealed_on_a_lake(fleet_lake):
    db, _, ids = fleet_lake
    r = flightrec("wait-sealed", ids["no_kernel"], "--db", db, "--timeout", "5")
    assert r.returncode == 0 and "complete" in r.stdout, r.stderr
    r = flightrec("wait-sealed", "no-such-instance", "--db", db, "--timeout", "1")
    assert r.returncode == 3 and "no events" in r.stderr


def test_a_reader_survives_a_catalog_restart(pg_dir, tmp_path):
    from flightrec.broker.local import free_port
    from flightrec.catalog import LocalCatalog

    c = LocalCatalog(port=free_port(), data=pg_dir / "c")
    c.start()
    try:
        w = lakes.connect(lakes.parse_db(c.db, str(tmp_path / "files"), writing=True))
        w.execute("CREATE TABLE t AS SELECT range AS i FROM range(10)")
        w.close()
        assert run_query(c.reader_db, "SELECT sum(i) AS s FROM t").to_pylist() == [{"s": 45}]
        c.stop()
        with pytest.raises(FlightrecError):
            run_query(c.reader_db, "SELECT sum(i) AS s FROM t")
        c.start()
        assert run_query(c.reader_db, "SELECT sum(i) AS s FROM t").to_pylist() == [{"s": 45}]
    finally:
        c.stop()


def test_dashboard_command_serves_a_lake(fleet_lake):
    import time
    import urllib.request

    from flightrec.broker.local import free_port

    db, data_path, _ = fleet_lake
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "flightrec", "dashboard", "--db", db, "--data-path", data_path, "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONSAFEPATH": "1"},
    )
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            assert proc.poll() is None, proc.communicate()[1][-2000:]
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=2) as reply:
                    if reply.status == 200:
                        break
            except (TimeoutError, OSError):
                time.sleep(0.5)
        else:
            raise AssertionError("the dashboard did not answer")
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=30)
    assert f"on {db}" in err  # the lake string as given, not made into a file path


def test_the_dashboard_never_shows_a_password(fleet_lake, open_page, monkeypatch):
    db, data_path, _ = fleet_lake
    monkeypatch.setenv("PGPASSWORD", "")
    at = open_page(db + " password=s3cret-word")  # trust authentication ignores it; the page must not show it
    shown = "\n".join(str(c.value) for c in at.sidebar.caption) + _text(at)
    assert "password=***" in shown and "s3cret-word" not in shown
    at = open_page(db.replace("dbname=", "dbname=absent_") + " password=s3cret-word")
    assert at.error and "s3cret-word" not in at.error[0].value and "Cannot read" in at.error[0].value


def test_the_lake_s_own_listings_are_readable(fleet_lake):
    db, _, _ = fleet_lake
    r = flightrec("sql", "--db", db, "--json", "SELECT count(*) AS n FROM ducklake_snapshots('lake')")
    assert r.returncode == 0 and json.loads(r.stdout)["n"] >= 2, r.stderr
    r = flightrec(
        "sql",
        "--db",
        db,
        "--json",
        "SELECT sum(file_count) AS files FROM ducklake_table_info('lake') WHERE table_name = 'log_lines'",
    )
    assert r.returncode == 0 and int(json.loads(r.stdout)["files"]) == 1, r.stderr


def test_a_lake_not_written_yet_says_what_to_run(lake):
    db, data_path = lake
    before = flightrec("sql", "--db", db, "SELECT * FROM fleet")
    assert before.returncode == 1 and "no lake was written there yet" in before.stderr
    assert "flightrec materialize --db" in before.stderr and "Traceback" not in before.stderr
    lakes.connect(lakes.parse_db(db, data_path, writing=True)).close()  # a writer attached, made no tables yet
    empty = flightrec("sql", "--db", db, "SELECT count(*) FROM log_lines")
    assert empty.returncode == 1 and "the lake holds no tables yet" in empty.stderr, empty.stderr
