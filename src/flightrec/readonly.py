"""Which SQL a reader may run: decided by DuckDB's own parser, from an allow-list of what statements do.

A statement passes when DuckDB parses it as exactly one statement of an allowed
type and, for queries, its syntax tree (``json_serialize_sql``) calls only
table functions that read and no scalar function that changes state:

- ``SELECT`` (also ``SHOW``, ``DESCRIBE``, ``SUMMARIZE``, ``FROM t``, ``VALUES``, which
  DuckDB parses as SELECT), with every table function on :data:`READ_TABLE_FUNCTIONS`
  and no function on :data:`WRITING_FUNCTIONS`;
- ``EXPLAIN`` / ``EXPLAIN ANALYZE`` of such a SELECT, and of nothing else;
- ``PRAGMA`` of one that only describes (:data:`READ_PRAGMAS`).

Everything else is refused with the reason: SET/RESET/USE, CALL and CHECKPOINT,
ATTACH/DETACH, COPY, EXPORT/IMPORT, LOAD/INSTALL, transactions, CREATE/ALTER/DROP,
DML, PREPARE/EXECUTE, VACUUM/ANALYZE, statement types this DuckDB adds later, and a
query whose tree cannot be checked. This is the first of several walls: the live
path also runs reads in a read-only transaction on a database whose configuration
is locked and whose file access is off (see flightrec.consumers.serve).
"""

from __future__ import annotations

import functools
import json
import re
import threading
from typing import Any, Callable

import duckdb

from flightrec.errors import QueryError

# Statement types a reader may run (by DuckDB's StatementType name); anything else is refused.
ALLOWED_TYPES = frozenset({"SELECT", "EXPLAIN", "PRAGMA"})

# PRAGMAs that only describe the database; the others change settings or state.
READ_PRAGMAS = frozenset({"table_info", "show", "show_tables", "show_tables_expanded", "database_list",
                          "database_size", "storage_info", "metadata_info", "version", "platform", "functions",
                          "collations", "user_agent"})

# Table functions that only read (catalog listings, generators, JSON walkers). Not here, so refused:
# checkpoint/force_checkpoint, logging/profiling switches, query()/query_table() and
# json_execute_serialized_sql (they run SQL text the check never sees), file readers, Python scans.
READ_TABLE_FUNCTIONS = frozenset({
    "range", "generate_series", "unnest", "repeat", "repeat_row", "summary", "json_each", "json_tree",
    "histogram", "histogram_values", "test_all_types", "test_vector_types", "icu_calendar_names",
    "pg_timezone_names", "duckdb_columns", "duckdb_constraints", "duckdb_databases", "duckdb_dependencies",
    "duckdb_functions", "duckdb_indexes", "duckdb_keywords", "duckdb_schemas", "duckdb_sequences",
    "duckdb_settings", "duckdb_tables", "duckdb_types", "duckdb_views", "duckdb_memory",
    "duckdb_temporary_files", "duckdb_optimizers", "duckdb_variables", "duckdb_prepared_statements",
    "pragma_collations", "pragma_database_size", "pragma_metadata_info", "pragma_platform", "pragma_show",
    "pragma_storage_info", "pragma_table_info", "pragma_user_agent", "pragma_version",
    # a DuckLake's own listings (snapshots, files per table), for `flightrec sql --db 'ducklake:…'`
    "ducklake_snapshots", "ducklake_table_info", "ducklake_current_snapshot", "ducklake_settings",
})

# Scalar functions that change state (sequences, the random seed, the log) or run SQL text.
WRITING_FUNCTIONS = frozenset({"nextval", "setval", "setseed", "write_log", "query", "query_table",
                               "json_execute_serialized_sql", "checkpoint", "force_checkpoint"})

_COMMENT = r"(?:\s+|--[^\n]*(?:\n|$)|/\*.*?\*/)*"
_PRAGMA = re.compile(_COMMENT + r"PRAGMA\s+(\w+)", re.IGNORECASE | re.DOTALL)
_PRAGMA_ARGS = re.compile(r"\s*(?:\(\s*(?:'[^']*'|\"[^\"]*\"|\w+)?\s*\))?\s*;?\s*\Z")
_EXPLAIN = re.compile(_COMMENT + r"EXPLAIN" + _COMMENT + r"(?:ANALY[SZ]E\b)?" + _COMMENT
                      + r"(?:\((?:[^()'\"]|'[^']*'|\"[^\"]*\")*\))?", re.IGNORECASE | re.DOTALL)
_VIEW = re.compile(_COMMENT + r"CREATE\s+(?:OR\s+REPLACE\s+)?TEMP(?:ORARY)?\s+VIEW\s+"
                   r"(?:\"[^\"]*\"|\w+)(?:\s*\.\s*(?:\"[^\"]*\"|\w+))*\s*(?:\([^()]*\))?\s*AS\b(.*)\Z",
                   re.IGNORECASE | re.DOTALL)

_parser_lock = threading.Lock()
_parser: duckdb.DuckDBPyConnection | None = None


def statement_types(sql: str) -> list[str]:
    """DuckDB's statement type names for ``sql`` ('UNKNOWN' for a type this package does not know)."""
    try:
        statements = duckdb.extract_statements(sql)
    except duckdb.Error as exc:
        raise QueryError(f"the query does not parse: {exc}") from exc
    except ValueError:  # a statement type the Python enum lacks (e.g. UPDATE EXTENSIONS)
        return ["UNKNOWN"]
    out = []
    for s in statements:
        try:
            out.append(s.type.name)
        except ValueError:
            out.append("UNKNOWN")
    return out


def _syntax_tree(sql: str) -> dict[str, Any]:
    global _parser
    with _parser_lock:
        if _parser is None:
            _parser = duckdb.connect(":memory:", config={"enable_external_access": False})
        text = _parser.execute("SELECT json_serialize_sql(?)", [sql]).fetchone()[0]
    return json.loads(text)


def _functions(node: Any, table: set[str], scalar: set[str]) -> None:
    if isinstance(node, dict):
        if node.get("type") == "TABLE_FUNCTION" and isinstance(node.get("function"), dict):
            table.add(str(node["function"].get("function_name", "")).lower())
        elif node.get("class") == "FUNCTION" and "function_name" in node:
            scalar.add(str(node["function_name"]).lower())
        for value in node.values():
            _functions(value, table, scalar)
    elif isinstance(node, list):
        for value in node:
            _functions(value, table, scalar)


def check_query(sql: str, what: str = "the query") -> None:
    """Raise QueryError unless ``sql`` is one SELECT whose functions all only read."""
    try:
        tree = _syntax_tree(sql)
    except duckdb.Error as exc:
        raise QueryError(f"{what} cannot be checked: {exc}") from exc
    if tree.get("error"):
        raise QueryError(f"{what} cannot be checked (only plain SELECT queries can): {tree.get('error_message')}")
    if len(tree.get("statements") or ()) != 1:
        raise QueryError(f"one statement at a time, please (got {len(tree.get('statements') or ())})")
    table: set[str] = set()
    scalar: set[str] = set()
    _functions(tree, table, scalar)
    bad = sorted(table - READ_TABLE_FUNCTIONS)
    if bad:
        raise QueryError(f"{what} calls table functions readers may not use: {', '.join(bad)}; "
                         "query the tables and views instead")
    bad = sorted(scalar & WRITING_FUNCTIONS)
    if bad:
        raise QueryError(f"{what} calls functions that change state: {', '.join(bad)}; readers may not")


def _cached(check: Callable[[str], None]) -> Callable[[str], None]:
    """Remember texts that passed (the dashboard asks the same queries and views again and again);
    a refusal is an exception, so it is never remembered. Long texts are checked every time."""
    passed = functools.lru_cache(maxsize=1024)(check)

    @functools.wraps(check)
    def run(sql: str) -> None:
        if len(sql) <= 65536:
            passed(sql)
        else:
            check(sql)

    return run


@_cached
def check_read_only(sql: str) -> None:
    """Raise QueryError unless ``sql`` is exactly one statement a reader may run (see the module doc)."""
    kinds = statement_types(sql)
    if len(kinds) != 1:
        raise QueryError(f"one statement at a time, please (got {len(kinds)})")
    kind = kinds[0]
    pragma = _PRAGMA.match(sql)
    if pragma and kind in ("SELECT", "PRAGMA"):  # DuckDB 1.5 parses a describing PRAGMA as a SELECT of pragma_*()
        _check_pragma(sql, pragma)
        return
    if kind not in ALLOWED_TYPES:
        raise QueryError(f"only read-only queries are allowed here, not {kind}: "
                         "use SELECT, EXPLAIN SELECT, or a PRAGMA that describes the database")
    if kind == "SELECT":
        check_query(sql)
    elif kind == "EXPLAIN":
        m = _EXPLAIN.match(sql)
        inner = sql[m.end():] if m else ""
        inner_kinds = statement_types(inner) if inner.strip() else ["nothing"]
        if inner_kinds != ["SELECT"]:
            raise QueryError(f"only read-only queries are allowed here: EXPLAIN of a SELECT, not of "
                             f"{' and '.join(inner_kinds)} (EXPLAIN ANALYZE runs its statement)")
        check_query(inner, "the explained query")
    else:  # a PRAGMA statement that does not start with the word (the regex above takes those)
        raise QueryError("only PRAGMAs that read are allowed here: " + ", ".join(sorted(READ_PRAGMAS)))


def _check_pragma(sql: str, m: re.Match[str]) -> None:
    """A describing PRAGMA from the allow-list, whose one argument (if any) is a plain name or literal."""
    if m.group(1).lower() not in READ_PRAGMAS or not _PRAGMA_ARGS.match(sql, m.end()):
        raise QueryError("only PRAGMAs that read are allowed here, with at most one name or quoted "
                         "argument: " + ", ".join(sorted(READ_PRAGMAS)))


@_cached
def check_prelude(stmt: str) -> None:
    """Raise QueryError unless ``stmt`` is exactly one ``CREATE [OR REPLACE] TEMP VIEW ... AS <query>``
    whose query passes :func:`check_query` (a view's body runs whenever a later query names it)."""
    kinds = statement_types(stmt)
    m = _VIEW.match(stmt)
    if kinds != ["CREATE"] or not m:
        raise QueryError(f"a prelude may only hold single CREATE TEMP VIEW statements, not {stmt[:80]!r}")
    check_query(m.group(1), "a prelude view")
