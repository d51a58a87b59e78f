"""Read-only SQL over a flightrec database, whether or not a materializer holds it.

This is the one door readers (``flightrec sql``, the dashboard, ``timeline``)
use. Guarantees: the statement runs read-only, cannot read or write files, and
returns a pyarrow Table. Parameters are bound, never pasted into SQL text.

While a materializer runs it holds DuckDB's write lock and no other process can
open the file; the materializer then serves queries on a local endpoint (see
``flightrec.consumers``), and ``run_query`` uses it. Otherwise the file is
opened read-only here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import duckdb
import pyarrow as pa

from flightrec.errors import QueryError

READ_STATEMENTS = {"SELECT", "EXPLAIN", "PRAGMA"}


def check_read_only(sql: str) -> None:
    """Raise QueryError unless ``sql`` is exactly one read statement (SELECT, EXPLAIN, PRAGMA)."""
    try:
        statements = duckdb.extract_statements(sql)
    except duckdb.Error as exc:
        raise QueryError(f"the query does not parse: {exc}") from exc
    if len(statements) != 1:
        raise QueryError(f"one statement at a time, please (got {len(statements)})")
    kind = statements[0].type.name
    if kind not in READ_STATEMENTS:
        raise QueryError(f"only read-only queries are allowed here, not {kind}")


def open_read_only(db: str | Path) -> duckdb.DuckDBPyConnection:
    """Open the database file read-only with file access disabled."""
    path = Path(db)
    if not path.exists():
        raise QueryError(f"no database at {path}; run `flightrec materialize --db {path}` first")
    try:
        return duckdb.connect(str(path), read_only=True, config={"enable_external_access": False})
    except duckdb.IOException as exc:
        raise QueryError(
            f"{path} is held by another process and it serves no queries: {exc}", ) from exc


def execute_read_only(con: duckdb.DuckDBPyConnection, sql: str, params: Sequence[Any] | dict[str, Any] | None = None,
                      prelude: Sequence[str] = ()) -> pa.Table:
    """Run trusted ``prelude`` statements (temp views), then the checked user statement."""
    check_read_only(sql)
    try:
        for stmt in prelude:
            con.execute(stmt)
        return con.execute(sql, params).fetch_arrow_table() if params else con.execute(sql).fetch_arrow_table()
    except duckdb.Error as exc:
        raise QueryError(f"{type(exc).__name__}: {exc}") from exc


def run_query(db: str | Path, sql: str, params: Sequence[Any] | dict[str, Any] | None = None,
              prelude: Sequence[str] = ()) -> pa.Table:
    """Run one read-only statement against the database and return its rows as Arrow."""
    check_read_only(sql)
    con = open_read_only(db)
    try:
        return execute_read_only(con, sql, params, prelude)
    finally:
        con.close()
