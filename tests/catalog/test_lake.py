"""The lake helper: the --db grammar, the offline extensions, attaching read-write and read-only."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest
from flightrec.db import lake as lakes

from flightrec.errors import FlightrecError, LakeError

DB = "ducklake:postgres:dbname=flightrec host=10.0.0.5 port=5432 user=flightrec"


def test_the_db_string_names_a_lake_or_a_file():
    from flightrec.db.location import FileLocation, locate

    assert locate(DB).shared and locate("ducklake:/srv/meta.ducklake").shared
    assert locate("flightrec.duckdb") == FileLocation(Path("flightrec.duckdb"))
    assert locate(Path("/x/ducklake:y")) == FileLocation(Path("/x/ducklake:y"))
    assert locate(locate(DB)) == locate(DB)


def test_parse_db_file_and_lake(tmp_path):
    assert lakes.parse_db("a/flightrec.duckdb", env={}) == Path("a/flightrec.duckdb")
    loc = lakes.parse_db(DB, str(tmp_path / "d"), env={})
    assert loc == lakes.LakeLocation(attach=DB, data_path=str(tmp_path / "d")) and loc.db == DB
    # the environment stands in for the flag, the flag beats it; relative folders become absolute
    assert lakes.parse_db(DB, env={"FLIGHTREC_DATA_PATH": "/srv/lake"}).data_path == "/srv/lake"
    assert lakes.parse_db(DB, "/a", env={"FLIGHTREC_DATA_PATH": "/srv/lake"}).data_path == "/a"
    assert lakes.parse_db(DB, "rel", env={}).data_path == str(Path("rel").resolve())
    assert lakes.parse_db(DB, "s3://bucket/lake", env={}).data_path == "s3://bucket/lake"
    # a reader needs no data path (the catalog recorded it); a writer does
    assert lakes.parse_db(DB, env={}) == lakes.LakeLocation(attach=DB, data_path=None)
    with pytest.raises(LakeError, match="--data-path DIR or set FLIGHTREC_DATA_PATH"):
        lakes.parse_db(DB, writing=True, env={})
    with pytest.raises(LakeError, match="not for the database file"):
        lakes.parse_db("x.duckdb", "/srv/lake", env={})
    with pytest.raises(LakeError, match="catalog start"):
        lakes.parse_db("ducklake:", env={})
    assert issubclass(LakeError, FlightrecError)
    assert lakes.lake_location(DB, "/srv/lake", writing=True, env={}).data_path == "/srv/lake"
    with pytest.raises(LakeError, match="database file, not a lake"):
        lakes.lake_location("x.duckdb", env={})


def test_describe_masks_a_password():
    loc = lakes.LakeLocation(attach=DB + " password=s3cret", data_path="/d")
    assert "s3cret" not in loc.describe() and "password=***" in loc.describe() and "/d" in loc.describe()
    assert "s3cret" not in repr(loc) and "password=***" in repr(loc)


def test_extensions_load_offline_from_the_wheels():
    con = duckdb.connect()
    con.execute("SET autoinstall_known_extensions = false")
    con.execute("SET autoload_known_extensions = false")
    lakes.load_extensions(con)
    lakes.load_extensions(con)  # idempotent
    loaded = {r[0] for r in con.execute("SELECT extension_name FROM duckdb_extensions() WHERE loaded").fetchall()}
    assert {"ducklake", "postgres_scanner"} <= loaded
    for package, dist, name in lakes.EXTENSIONS:
        path = lakes.extension_file(package, dist, name)
        assert path.is_file() and f"v{duckdb.__version__}" in str(path)


def test_a_missing_extension_wheel_says_what_to_pip_install():
    with pytest.raises(LakeError, match=rf"pip install 'duckdb-extension-nothing=={duckdb.__version__}'"):
        lakes.extension_file("duckdb_extension_nothing", "duckdb-extension-nothing", "nothing")
    # installed, but no file for this DuckDB version inside
    with pytest.raises(LakeError, match="not built for duckdb"):
        lakes.extension_file("duckdb_extension_ducklake", "duckdb-extension-ducklake", "no_such_extension")


def test_an_unreachable_catalog_is_named(tmp_path):
    from flightrec.broker.local import free_port

    loc = lakes.parse_db(
        f"ducklake:postgres:dbname=x host=127.0.0.1 port={free_port()} user=flightrec "
        f"password=hidden connect_timeout=3",
        str(tmp_path),
        env={},
    )
    with pytest.raises(LakeError, match="(?s)cannot attach the lake .*Connection refused.*catalog status") as err:
        lakes.connect(loc)
    assert "hidden" not in str(err.value) and "password=***" in str(err.value)
    assert lakes.mask_password("a password='x y' b PASSWORD=z") == "a password=*** b PASSWORD=***"


def test_attach_write_then_read_only(lake):
    db, data_path = lake
    w = lakes.connect(lakes.parse_db(db, data_path, writing=True))
    w.execute("CREATE TABLE events AS SELECT range AS i, 'line ' || range AS text FROM range(1000)")
    w.close()
    assert any(Path(data_path).rglob("*.parquet"))
    r = lakes.connect(lakes.parse_db(db, env={}), read_only=True)
    assert r.execute("SELECT count(*), sum(i) FROM events").fetchone() == (1000, 499500)
    with pytest.raises(duckdb.Error, match="read-only"):
        r.execute("INSERT INTO events VALUES (1, 'x')")
    r.close()


def test_is_catalog_away_reads_postgresql_s_words():
    away = [
        'IO Error: Failed to query most recent snapshot for DuckLake: Unable to connect to Postgres at "dbname=x": '
        'connection to server at "127.0.0.1", port 5432 failed: Connection refused',
        "IO Error: server closed the connection unexpectedly\n\tThis probably means the server terminated",
        "FATAL: terminating connection due to administrator command",
        "FATAL: the database system is shutting down",
        "FATAL: the database system is starting up",
        "Connection Error: Connection already closed!",
        "IO Error: SSL connection has been closed unexpectedly",
        "IO Error: SSL SYSCALL error: EOF detected",
        'connection to server at "10.0.0.7", port 5432 failed: Connection timed out',
        # the catalog stopped between a commit's statements: PostgreSQL could not even roll back (seen in CI)
        'TransactionContext Error: Failed to commit: Failed to execute query "ROLLBACK": ',
    ]
    other = [
        "TransactionContext Error: Transaction conflict: cannot update a table deleted by another transaction",
        "Catalog Error: Table with name nope does not exist!",
        "Permission Error: permission denied for table ducklake_snapshot",
        "Invalid Input Error: data_path is not set",
        'IO Error: Unable to connect to Postgres at "x": connection to server at "127.0.0.1", port 5432 failed: '
        'FATAL:  password authentication failed for user "flightrec"',
        'connection to server at "127.0.0.1", port 5432 failed: FATAL:  database "nope" does not exist',
    ]
    assert all(lakes.is_catalog_away(RuntimeError(t)) for t in away)
    assert not any(lakes.is_catalog_away(RuntimeError(t)) for t in other)
