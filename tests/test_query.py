"""The read-only door: what check_read_only and check_prelude let through, on a real DuckDB file."""

from __future__ import annotations

import duckdb
import pytest
from flightrec.db.query import run_query
from flightrec.db.readonly import check_prelude, check_read_only

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
    from flightrec.db.statement import open_read_only

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


def test_run_query_reads_through_the_reader_of_the_location_s_kind_and_never_asks_which_kind():
    """db/query.py's door does not branch on file vs lake: every kind of location has a reader (READERS), and
    nothing else in the module names a kind of location, tests it with isinstance or looks at a Target's kind."""
    import ast
    import typing
    from pathlib import Path

    from flightrec.db import query
    from flightrec.db.lakeread import LakeReader
    from flightrec.db.location import Location

    assert set(query.READERS) == set(typing.get_args(Location))
    assert query.READERS[typing.get_args(Location)[1]] is LakeReader
    tree = ast.parse(Path(query.__file__).read_text())
    kinds = {cls.__name__ for cls in typing.get_args(Location)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "isinstance":
            named = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
            assert not named & kinds, f"query.py line {node.lineno} asks which kind of location it reads"
    uses = [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Name) and n.id in kinds]
    readers = next(n for n in tree.body if isinstance(n, ast.AnnAssign) and getattr(n.target, "id", "") == "READERS")
    outside = [line for line in uses if not readers.lineno <= line <= readers.end_lineno]
    # the file reader's own signature names its location: FileReader.__init__
    file_reader = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "FileReader")
    outside = [line for line in outside if not file_reader.lineno <= line <= file_reader.end_lineno]
    assert not outside, f"query.py names a kind of location outside READERS at lines {outside}"


def test_a_read_goes_to_the_reader_chosen_for_its_location(tmp_path, monkeypatch):
    """The door hands the statement, parameters, prelude and limits to the chosen reader, once, and returns its
    result (a reader that records its calls stands in for the file's: the dispatch is what is tested here)."""
    import pyarrow as pa
    from flightrec.db import query
    from flightrec.db.location import FileLocation

    calls = []

    class Recording:
        def __init__(self, loc: FileLocation) -> None:
            self.loc = loc

        def read(self, sql, params, prelude, limits):
            calls.append((self.loc.path, sql, params, tuple(prelude), limits))
            return pa.table({"x": [1]})

    monkeypatch.setitem(query.READERS, FileLocation, Recording)
    db = tmp_path / "f.duckdb"
    out = run_query(db, "SELECT ?", [1], ("CREATE OR REPLACE TEMP VIEW v AS SELECT 1",))
    assert out.to_pylist() == [{"x": 1}]
    assert calls == [(db, "SELECT ?", [1], ("CREATE OR REPLACE TEMP VIEW v AS SELECT 1",), None)]
