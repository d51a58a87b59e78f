"""The read-only door: what check_read_only and check_prelude let through, on a real DuckDB file."""

from __future__ import annotations

import duckdb
import pytest
from flightrec.db.query import check_prelude, check_read_only, run_query

from flightrec.errors import QueryError


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT 1",
        "WITH x AS (SELECT 1 AS a) SELECT * FROM x",
        "EXPLAIN SELECT 1",
        "PRAGMA show_tables",
        "pragma table_info('t')",
        "PRAGMA database_size",
    ],
)
def test_reads_pass(sql):
    check_read_only(sql)


@pytest.mark.parametrize(
    "sql, why",
    [
        ("INSERT INTO t VALUES (1)", "not INSERT"),
        ("SELECT 1; SELECT 2", "one statement"),
        ("PRAGMA disable_checkpoint_on_shutdown", "only PRAGMAs that read"),
        ("/* hidden */ PRAGMA enable_profiling", "only PRAGMAs that read"),
        ("SET threads = 1", "not SET"),
        ("ATTACH 'x.db'", "not ATTACH"),
        ("COPY t TO 'x.csv'", "not COPY"),
    ],
)
def test_writes_and_settings_are_refused(sql, why):
    with pytest.raises(QueryError, match=why):
        check_read_only(sql)


@pytest.mark.parametrize(
    "stmt",
    ["COMMIT", "INSERT INTO t VALUES (1)", "CREATE TABLE u (a INT)", "CREATE TEMP VIEW v AS SELECT 1; DROP TABLE t"],
)
def test_a_prelude_is_only_temp_views(stmt):
    with pytest.raises(QueryError, match="prelude"):
        check_prelude(stmt)


def test_the_file_path_reads_with_views_and_refuses_files(tmp_path):
    db = tmp_path / "f.duckdb"
    con = duckdb.connect(str(db))
    con.execute("CREATE TABLE t AS SELECT 41 AS a")
    con.close()
    t = run_query(db, "SELECT a + $one AS b FROM v", {"one": 1}, prelude=["CREATE TEMP VIEW v AS SELECT a FROM t"])
    assert t.to_pylist() == [{"b": 42}]
    with pytest.raises(QueryError, match="read_csv"):
        run_query(db, "SELECT * FROM read_csv('/etc/passwd')")
    # Behind the check, the file path's own connection has file access off and its settings locked.
    from flightrec.db.query import open_read_only

    con = open_read_only(db)
    try:
        with pytest.raises(duckdb.Error, match="(?i)disabled"):
            con.execute("SELECT * FROM read_csv('/etc/passwd')")
        with pytest.raises(duckdb.Error, match="locked"):
            con.execute("SET threads = 1")
    finally:
        con.close()
    with pytest.raises(QueryError, match="no database"):
        run_query(tmp_path / "missing.duckdb", "SELECT 1")


def test_snapshot_reads_survive_a_materializer_restart_and_keep_parameter_types(tmp_path):
    """While a store holds the file, reads go to its snapshot, in this process and in a bounded one of their own;
    after a restart, the new store's; dates, timestamps and decimals arrive as themselves."""
    import datetime as dt
    import decimal

    from flightrec.db import snapshot
    from flightrec.db.filestore import FileStore
    from flightrec.db.query import freshness
    from flightrec.db.sandbox import ReadLimits

    db = tmp_path / "fr.duckdb"
    when = dt.datetime(2026, 12, 2, 23, 0, tzinfo=dt.UTC)
    sql = "SELECT typeof(?) AS a, typeof(?) AS b, typeof(?) AS c, ?::VARCHAR AS d"
    params = [dt.date(2026, 12, 2), when, decimal.Decimal("1.25"), when]
    for _ in range(2):
        store = FileStore(db, "g")
        try:
            assert snapshot.current(db) is not None
            for limits in (None, ReadLimits()):
                t = run_query(db, sql, params, limits=limits)
                row = t.to_pylist()[0]
                assert row["a"] == "DATE" and row["b"].startswith("TIMESTAMP") and row["c"].startswith("DECIMAL")
                assert freshness(t).source == "snapshot"
        finally:
            store.close()
        assert snapshot.current(db) is None
    # With no materializer, the same read is answered from the file.
    t = run_query(db, "SELECT ? + 1 AS n", [41])
    assert t.to_pylist() == [{"n": 42}] and freshness(t).source == "file"
