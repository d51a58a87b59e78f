"""Readers cannot reach the writer: every statement type DuckDB reports is refused or proven harmless, on every path
(the file, the materializer's snapshot in the reader's process, a read's own bounded process, the dashboard)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import duckdb
import pytest
from flightrec.analytics import queries
from flightrec.db import snapshot
from flightrec.db.query import run_query
from flightrec.db.sandbox import ReadLimits
from flightrec.db.statement import open_read_only

from flightrec.errors import QueryError

LEAK = Path("/tmp/flightrec-a-isolation-leak")

# One or more statements per DuckDB statement type; each is checked to parse as that type.
SAMPLES: list[tuple[str, str]] = [
    ("SELECT", "SELECT count(*) AS n FROM instances"),
    ("SELECT", "SHOW TABLES"),
    ("SELECT", "SELECT * FROM checkpoint()"),
    ("SELECT", "SELECT * FROM force_checkpoint()"),
    ("SELECT", "SELECT * FROM enable_logging()"),
    ("SELECT", "SELECT * FROM truncate_duckdb_logs()"),
    ("SELECT", "SELECT * FROM query('SELECT * FROM checkpoint()')"),
    ("SELECT", "SELECT * FROM json_execute_serialized_sql(json_serialize_sql('SELECT 1'))"),
    ("SELECT", "SELECT setseed(0.5)"),
    ("SELECT", f"SELECT * FROM read_text('{LEAK}')"),
    ("INSERT", "INSERT INTO instances (instance_id) VALUES ('evil')"),
    ("UPDATE", "UPDATE instances SET state = 'evil'"),
    ("CREATE", "CREATE TABLE evil AS SELECT 1 AS x"),
    ("CREATE", "CREATE MACRO evil() AS 1"),
    ("CREATE", "CREATE SEQUENCE evil"),
    ("DELETE", "DELETE FROM instances"),
    ("DELETE", "TRUNCATE instances"),
    ("PREPARE", "PREPARE evil AS SELECT 1"),
    ("EXECUTE", "EXECUTE evil"),
    ("ALTER", "ALTER TABLE instances ADD COLUMN evil INTEGER"),
    ("TRANSACTION", "COMMIT"),
    ("TRANSACTION", "BEGIN TRANSACTION"),
    ("COPY", f"COPY instances TO '{LEAK}.csv'"),
    ("EXPLAIN", "EXPLAIN SELECT count(*) FROM instances"),
    ("EXPLAIN", "EXPLAIN ANALYZE SELECT count(*) FROM instances"),
    ("EXPLAIN", "EXPLAIN ANALYZE SET GLOBAL memory_limit = '2MB'"),
    ("EXPLAIN", "EXPLAIN ANALYZE SET default_order = 'DESC'"),
    ("EXPLAIN", "EXPLAIN ANALYZE SET lock_configuration = true"),
    ("EXPLAIN", "EXPLAIN ANALYZE SET threads = 1"),
    ("EXPLAIN", "EXPLAIN ANALYZE CHECKPOINT"),
    ("EXPLAIN", "EXPLAIN ANALYZE DELETE FROM instances"),
    ("EXPLAIN", "EXPLAIN ANALYZE SELECT * FROM checkpoint()"),
    ("DROP", "DROP TABLE instances"),
    ("EXPORT", f"EXPORT DATABASE '{LEAK}'"),
    ("SELECT", "PRAGMA show_tables"),  # DuckDB 1.5 parses describing PRAGMAs as SELECTs of pragma_*()
    ("SELECT", "PRAGMA table_info('instances')"),
    ("PRAGMA", "PRAGMA enable_profiling"),
    ("SET", "PRAGMA threads = 1"),
    ("PRAGMA", f"IMPORT DATABASE '{LEAK}'"),
    ("TRANSACTION", "COPY FROM DATABASE memory TO memory"),  # DuckDB 1.5: expanded into BEGIN ... COMMIT
    ("VACUUM", "VACUUM"),
    ("VACUUM", "ANALYZE"),
    ("CALL", "CALL checkpoint()"),
    ("CALL", "CHECKPOINT"),
    ("SET", "SET GLOBAL memory_limit = '2MB'"),
    ("SET", "SET default_order = 'DESC'"),
    ("SET", "SET lock_configuration = true"),
    ("SET", "RESET threads"),
    ("SET", "SET VARIABLE evil = 1"),
    ("SET", "USE system"),
    ("LOAD", "LOAD json"),
    ("LOAD", "INSTALL httpfs"),
    ("ATTACH", "ATTACH ':memory:' AS evil"),
    ("DETACH", "DETACH evil"),
    ("CREATE", "PIVOT instances ON state"),  # DuckDB 1.5: CREATE (an enum type) then SELECT
    (
        "MERGE_INTO",
        "MERGE INTO instances USING (SELECT 'i-1' AS instance_id) s USING (instance_id) WHEN MATCHED THEN DELETE",
    ),
    ("UNKNOWN", "UPDATE EXTENSIONS"),
]
# Types DuckDB's parser never yields for SQL text (built by the client APIs, or text of them parses as
# another type: ANALYZE as VACUUM, SET VARIABLE as SET, CREATE MACRO as CREATE, COPY FROM DATABASE as
# PRAGMA); they are refused because they are not on the allow-list.
NOT_FROM_TEXT = {
    "INVALID",
    "RELATION",
    "LOGICAL_PLAN",
    "EXTENSION",
    "ANALYZE",
    "VARIABLE_SET",
    "CREATE_FUNC",
    "COPY_DATABASE",
    "MULTI",
}
MUST_REFUSE = {sql for kind, sql in SAMPLES if kind not in ("SELECT", "EXPLAIN", "PRAGMA")} | {
    "SELECT * FROM checkpoint()",
    "SELECT * FROM force_checkpoint()",
    "SELECT * FROM enable_logging()",
    "SELECT * FROM truncate_duckdb_logs()",
    "SELECT * FROM query('SELECT * FROM checkpoint()')",
    "SELECT * FROM json_execute_serialized_sql(json_serialize_sql('SELECT 1'))",
    "SELECT setseed(0.5)",
    "EXPLAIN ANALYZE SET GLOBAL memory_limit = '2MB'",
    "EXPLAIN ANALYZE SET default_order = 'DESC'",
    "EXPLAIN ANALYZE SET lock_configuration = true",
    "EXPLAIN ANALYZE SET threads = 1",
    "EXPLAIN ANALYZE CHECKPOINT",
    "EXPLAIN ANALYZE DELETE FROM instances",
    "EXPLAIN ANALYZE SELECT * FROM checkpoint()",
    "PRAGMA enable_profiling",
    "PRAGMA threads = 1",
}
ALLOWED = {"SELECT", "EXPLAIN", "PRAGMA"}


def _type_of(sql: str) -> str:
    try:
        name = duckdb.extract_statements(sql)[0].type.name
        return name if name in duckdb.StatementType.__members__ else "UNKNOWN"
    except ValueError:
        return "UNKNOWN"
    except duckdb.IOException:  # DuckDB 1.5 reads IMPORT DATABASE's files while parsing: it never parses here
        return "PRAGMA" if sql.startswith("IMPORT DATABASE") else "IO_ERROR"


def test_the_samples_cover_every_statement_type():
    for kind, sql in SAMPLES:
        assert _type_of(sql) == kind, sql
    covered = {kind for kind, _ in SAMPLES} | NOT_FROM_TEXT
    assert set(duckdb.StatementType.__members__) <= covered, "a statement type DuckDB reports has no sample"
    assert not (NOT_FROM_TEXT & ALLOWED)


PATHS = {
    "client": lambda db, sql: run_query(db, sql),
    "apart": lambda db, sql: run_query(db, sql, limits=ReadLimits(seconds=30)),
    "dashboard": lambda db, sql: queries.console(db, sql),
}


def _attack(db: Path, paths: dict) -> dict[str, list[str]]:
    """Run every sample on every path; returns what was answered, per path. Refusals must say why."""
    answered: dict[str, list[str]] = {}
    for name, run in paths.items():
        for kind, sql in SAMPLES:
            try:
                run(db, sql)
            except QueryError as exc:
                assert str(exc).strip(), (name, sql)
                continue
            answered.setdefault(name, []).append(sql)
            assert kind in ALLOWED, f"{name} path ran {sql!r} ({kind})"
            assert sql not in MUST_REFUSE, f"{name} path ran {sql!r}"
    return answered


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _state(con: duckdb.DuckDBPyConnection) -> tuple:
    settings = con.execute("SELECT name, value FROM duckdb_settings() ORDER BY name").fetchall()
    data = con.execute("SELECT * FROM instances ORDER BY ALL").fetchall()
    catalog = con.execute(
        "SELECT database_name, schema_name, table_name FROM duckdb_tables() WHERE NOT temporary ORDER BY ALL"
    ).fetchall()
    seqs = con.execute("SELECT count(*) FROM duckdb_sequences()").fetchall()
    return settings, data, catalog, seqs


@pytest.mark.slow  # ~18 s: every statement type on every read path
def test_every_statement_type_is_refused_or_harmless_on_every_path(db):
    from flightrec.db.filestore import FileStore

    LEAK.unlink(missing_ok=True)
    store = FileStore(db, "g")
    store.con.execute("INSERT INTO instances (instance_id, state) VALUES ('i-1', 'running')")
    store.close()

    # The file path (no materializer): the file is not changed at all.
    before = _digest(db)
    answered = _attack(db, PATHS)
    assert "SELECT count(*) AS n FROM instances" in answered["client"]  # reads still work
    assert _digest(db) == before

    # While a materializer holds the file: reads go to its snapshot; the writer's settings, data and catalog are
    # what they were, the snapshot's bytes too, and it still commits.
    store = FileStore(db, "g")
    try:
        reference = _state(store.con)
        copy = snapshot.current(db).path
        before = _digest(copy)
        answered = _attack(db, PATHS)
        assert "EXPLAIN SELECT count(*) FROM instances" in answered["apart"]
        assert _state(store.con) == reference
        assert _digest(copy) == before
        store.con.execute("BEGIN TRANSACTION")
        store.con.execute("INSERT INTO instances (instance_id) VALUES ('i-2')")
        store.con.execute("COMMIT")
        store.con.execute("CHECKPOINT")
    finally:
        store.close()
    assert not list(LEAK.parent.glob(LEAK.name + "*"))


def test_the_writer_configuration_is_locked_even_for_a_statement_the_check_missed(db):
    # Defence in depth: the writer's own connections refuse a setting change (lock_configuration) and file
    # access, should any statement ever reach them (no reader's does: reads run in other processes).
    from flightrec.db.filestore import FileStore

    store = FileStore(db, "g")
    try:
        cur = store.con.cursor()
        for sql in (
            "SET GLOBAL memory_limit = '2MB'",
            "SET default_order = 'DESC'",
            "SET threads = 1",
            "SET lock_configuration = false",
            "SET enable_external_access = true",
        ):
            with pytest.raises(duckdb.Error, match="locked"):
                cur.execute(sql)
        for sql in ("SELECT * FROM read_text('/etc/hostname')", "SELECT * FROM glob('/etc/*')"):
            with pytest.raises(duckdb.Error, match="disabled"):
                cur.execute(sql)
        cur.close()
    finally:
        store.close()


def test_a_statement_the_check_missed_can_change_neither_a_snapshot_nor_a_setting(db):
    """Defence in depth on the snapshot path: a reader's connection to a copy is read-only, its settings locked and
    its file access off, whatever statement reaches it."""
    from flightrec.db.filestore import FileStore

    store = FileStore(db, "g")
    try:
        copy = snapshot.current(db).path
        before = _digest(copy)
        con = open_read_only(copy)
        try:
            for sql in ("INSERT INTO instances (instance_id) VALUES ('evil')", "CREATE TABLE evil AS SELECT 1"):
                with pytest.raises(duckdb.Error, match="(?i)read-only|read only"):
                    con.execute(sql)
            for sql in ("SET threads = 1", "SET enable_external_access = true", "SET GLOBAL memory_limit = '2MB'"):
                with pytest.raises(duckdb.Error, match="locked"):
                    con.execute(sql)
            with pytest.raises(duckdb.Error, match="disabled"):
                con.execute(f"COPY (SELECT 1) TO '{LEAK}.csv'")
        finally:
            con.close()
        assert _digest(copy) == before
    finally:
        store.close()
    assert not list(LEAK.parent.glob(LEAK.name + "*"))
