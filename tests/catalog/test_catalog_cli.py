"""`flightrec catalog start|status|stop` as a user runs them: real processes, a real PostgreSQL, real errors."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import duckdb
import pytest
from flightrec.broker.local import free_port
from flightrec.catalog import READER, LocalCatalog, find_bin_dir
from flightrec.db import lake as lakes

from flightrec.errors import CatalogError


def flightrec(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "flightrec", *args],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONSAFEPATH": "1", **(env or {})},
        timeout=180,
    )


def test_start_status_stop_round_trip_and_the_db_string_works(pg_dir, tmp_path):
    port, data = str(free_port()), str(pg_dir / "c")
    try:
        r = flightrec("catalog", "start", "--port", port, "--data", data)
        assert r.returncode == 0, r.stderr
        assert f"started on 127.0.0.1:{port}" in r.stdout
        db = r.stdout.strip().splitlines()[-1]
        assert db == f"ducklake:postgres:dbname=flightrec host=127.0.0.1 port={port} user=flightrec"
        assert r.stdout.strip().splitlines()[-2] == f"readers may use: {db}_reader"
        r = flightrec("catalog", "start", "--port", port, "--data", data)
        assert r.returncode == 0 and "already running" in r.stdout, r.stderr
        assert r.stdout.strip().splitlines()[-1] == db
        r = flightrec("catalog", "status", "--port", port, "--data", data)
        assert r.returncode == 0 and "running and answering" in r.stdout
        # the printed string is what `--db` takes: a lake made through it keeps its rows
        con = lakes.connect(lakes.parse_db(db, str(tmp_path / "files"), writing=True))
        con.execute("CREATE TABLE t AS SELECT range AS i FROM range(5)")
        con.close()
        con = lakes.connect(lakes.parse_db(db), read_only=True)
        assert con.execute("SELECT sum(i) FROM t").fetchone() == (10,)
        con.close()
    finally:
        r = flightrec("catalog", "stop", "--port", port, "--data", data)
    assert r.returncode == 0 and "stopped" in r.stdout, r.stdout + r.stderr
    r = flightrec("catalog", "status", "--port", port, "--data", data)
    assert r.returncode == 3 and "no catalog running" in r.stdout
    r = flightrec("catalog", "stop", "--port", port, "--data", data)
    assert r.returncode == 0 and "no catalog running" in r.stdout
    # a restart finds the same cluster and the lake in it
    try:
        r = flightrec("catalog", "start", "--port", port, "--data", data)
        assert r.returncode == 0, r.stderr
        con = lakes.connect(lakes.parse_db(db), read_only=True)
        assert con.execute("SELECT count(*) FROM t").fetchone() == (5,)
        con.close()
    finally:
        flightrec("catalog", "stop", "--port", port, "--data", data)


def test_two_catalogs_side_by_side(pg_dir):
    a = LocalCatalog(port=free_port(), data=pg_dir / "a")
    b = LocalCatalog(port=free_port(), data=pg_dir / "b")
    try:
        a.start()
        b.start()
        assert a.status().answering and b.status().answering
        a.stop()
        assert not a.status().running
        assert b.status().answering
    finally:
        a.stop()
        b.stop()


def test_port_in_use_is_named(pg_dir):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        r = flightrec("catalog", "start", "--port", str(port), "--data", str(pg_dir / "c"))
    assert r.returncode == 1
    assert f"port {port} is in use" in r.stderr and "--port" in r.stderr


def test_data_folder_not_writable_is_named(pg_dir):
    locked = pg_dir / "locked"
    locked.mkdir(mode=0o500)  # nobody may create a folder in it, and `postgres` may not even pass through
    locked.chmod(0o500)
    r = flightrec("catalog", "start", "--port", str(free_port()), "--data", str(locked / "c"))
    assert r.returncode == 1
    assert f"data folder {locked / 'c'}" in r.stderr and "--data" in r.stderr


def test_no_postgresql_says_what_to_install(tmp_path):
    with pytest.raises(CatalogError, match="apt-get install postgresql"):
        find_bin_dir(path=str(tmp_path), debian_glob=str(tmp_path / "postgresql" / "*" / "bin"))
    assert (find_bin_dir() / "initdb").exists()  # this machine has one: the fixtures rely on it


def test_a_server_that_will_not_start_reports_its_log(pg_dir):
    c = LocalCatalog(port=free_port(), data=pg_dir / "c")
    c.start()
    c.stop()
    with open(c.pgdata / "postgresql.conf", "a") as f:
        f.write("\nno_such_setting_here = 1\n")
    with pytest.raises(CatalogError) as err:
        c.start()
    text = str(err.value)
    assert "did not start" in text and "no_such_setting_here" in text.splitlines()[0]
    assert "--- last lines of the PostgreSQL log ---" in text
    assert not c.status().running


def test_databases_for_lakes(pg_catalog):
    db = pg_catalog.create_database("lake_cli_test")
    assert db.endswith(f"port={pg_catalog.port} user=flightrec") and "dbname=lake_cli_test" in db
    assert pg_catalog.create_database("lake_cli_test") == db  # idempotent
    pg_catalog.drop_database("lake_cli_test")
    assert not pg_catalog.psql("SELECT 1 FROM pg_database WHERE datname = 'lake_cli_test'").strip()
    with pytest.raises(CatalogError, match="lower-case"):
        pg_catalog.create_database("x'; DROP")


def test_lake_fixture_gives_a_fresh_lake_each_time(lake):
    db, data_path = lake
    con = duckdb.connect()
    lakes.attach(con, lakes.parse_db(db, data_path, writing=True))
    assert con.execute("SELECT count(*) FROM duckdb_tables() WHERE database_name = 'lake'").fetchone() == (0,)
    con.execute("CREATE TABLE fresh AS SELECT 1 AS x")
    con.close()


def test_log_cause_names_what_explains_the_fatal_line():
    from flightrec.catalog.local import _START_MARK, log_cause

    old = '2026-12-01 LOG:  unrecognized configuration parameter "old" in file "x" line 1\n'
    text = (
        old + f"{_START_MARK} on port 1 ===\n"
        "2026-12-02 UTC [1] LOG:  starting PostgreSQL 15.18\n"
        '2026-12-02 UTC [1] LOG:  could not bind IPv4 address "127.0.0.1": Address already in use\n'
        '2026-12-02 UTC [1] WARNING:  could not create listen socket for "127.0.0.1"\n'
        "2026-12-02 UTC [1] FATAL:  could not create any TCP/IP sockets\n"
    )
    cause = log_cause(text)
    assert cause.startswith('could not bind IPv4 address "127.0.0.1": Address already in use')
    assert cause.endswith("could not create any TCP/IP sockets") and '"old"' not in cause
    assert log_cause("2026 LOG:  database system is ready\n") == ""


def test_the_reader_role_reads_and_nothing_else(pg_catalog, lake, tmp_path):
    db, data_path = lake
    w = lakes.connect(lakes.parse_db(db, data_path, writing=True))
    w.execute("CREATE TABLE t AS SELECT range AS i FROM range(3)")
    w.close()
    reader_db = db.replace("user=flightrec", f"user={READER}")
    assert reader_db.endswith(f"user={READER}")
    r = lakes.connect(lakes.parse_db(reader_db), read_only=True)
    assert r.execute("SELECT sum(i) FROM t").fetchone() == (3,)
    with pytest.raises(duckdb.Error, match="permission denied"):  # PostgreSQL itself refuses server files
        r.execute("SELECT * FROM postgres_query('__ducklake_metadata_lake', 'SELECT pg_read_file(''/etc/hostname'')')")
    r.close()
    # a writer through the reader's role cannot commit: PostgreSQL refuses the catalog rows
    w = lakes.connect(lakes.parse_db(reader_db, data_path, writing=True))
    with pytest.raises(duckdb.Error):
        w.execute("INSERT INTO t VALUES (99)")
    w.close()
    check = lakes.connect(lakes.parse_db(db), read_only=True)
    assert check.execute("SELECT count(*) FROM t").fetchone() == (3,)
    check.close()
