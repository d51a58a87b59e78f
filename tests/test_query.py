"""The read-only door: what check_read_only and check_prelude let through, on a real DuckDB file."""

from __future__ import annotations

import duckdb
import pytest

from flightrec.errors import QueryError
from flightrec.query import check_prelude, check_read_only, run_query


@pytest.mark.parametrize("sql", [
    "SELECT 1", "WITH x AS (SELECT 1 AS a) SELECT * FROM x", "EXPLAIN SELECT 1", "PRAGMA show_tables",
    "pragma table_info('t')", "PRAGMA database_size",
])
def test_reads_pass(sql):
    check_read_only(sql)


@pytest.mark.parametrize("sql, why", [
    ("INSERT INTO t VALUES (1)", "not INSERT"),
    ("SELECT 1; SELECT 2", "one statement"),
    ("PRAGMA disable_checkpoint_on_shutdown", "only PRAGMAs that read"),
    ("/* hidden */ PRAGMA enable_profiling", "only PRAGMAs that read"),
    ("SET threads = 1", "not SET"),
    ("ATTACH 'x.db'", "not ATTACH"),
    ("COPY t TO 'x.csv'", "not COPY"),
])
def test_writes_and_settings_are_refused(sql, why):
    with pytest.raises(QueryError, match=why):
        check_read_only(sql)


@pytest.mark.parametrize("stmt", ["COMMIT", "INSERT INTO t VALUES (1)", "CREATE TABLE u (a INT)",
                                  "CREATE TEMP VIEW v AS SELECT 1; DROP TABLE t"])
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
    from flightrec.query import open_read_only

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
