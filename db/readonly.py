"""Which SQL a reader may run: decided by DuckDB's own parser, from an allow-list of what statements do.

A statement passes when DuckDB parses it as exactly one statement of an allowed
type and the syntax tree (``json_serialize_sql``) of the query DuckDB made of it
calls only table functions that read and no scalar function that changes state:

- ``SELECT`` (also ``SHOW``, ``DESCRIBE``, ``SUMMARIZE``, ``FROM t``, ``VALUES``, and a
  PRAGMA that describes, which DuckDB itself turns into a SELECT of ``pragma_*()``),
  with every table function on :data:`READ_TABLE_FUNCTIONS` and no function on
  :data:`WRITING_FUNCTIONS`;
- ``EXPLAIN`` / ``EXPLAIN ANALYZE`` of such a SELECT, and of nothing else: the explained
  statement is cut where DuckDB's lexer says it begins (``duckdb.tokenize``).

No text pattern decides anything: DuckDB nests ``/* */`` comments, and its lexer and
parser read comments, casing and whitespace as DuckDB will when it runs the text
(``tests/test_readonly_parse.py`` wraps refused statements in generated comments).
Everything else is refused with the reason: SET/RESET/USE, CALL and CHECKPOINT,
ATTACH/DETACH, COPY, EXPORT/IMPORT, LOAD/INSTALL, transactions, CREATE/ALTER/DROP,
DML, PREPARE/EXECUTE, VACUUM/ANALYZE, PRAGMAs that change something, statement types
this DuckDB adds later, and a query whose tree cannot be checked. This is the first of
several walls: behind it every read opens the file or the materializer's snapshot read-only,
its configuration locked and its file access off, in a process apart from the materializer
(see flightrec.db.query).
"""

from __future__ import annotations

import functools
import json
import threading
from collections.abc import Callable
from typing import Any

import duckdb

from flightrec.errors import QueryError

# Statement types a reader may run (by DuckDB's StatementType name); anything else is refused.
ALLOWED_TYPES = frozenset({"SELECT", "EXPLAIN", "PRAGMA"})

# PRAGMAs that only describe the database; the others change settings or state.
READ_PRAGMAS = frozenset(
    {
        "table_info",
        "show_tables",
        "show_tables_expanded",
        "database_list",
        "database_size",
        "storage_info",
        "metadata_info",
        "version",
        "platform",
        "functions",
        "collations",
        "user_agent",
    }
)

# Table functions that only read (catalog listings, generators, JSON walkers). Not here, so refused:
# checkpoint/force_checkpoint, logging/profiling switches, query()/query_table() and
# json_execute_serialized_sql (they run SQL text the check never sees), file readers, Python scans.
READ_TABLE_FUNCTIONS = frozenset(
    {
        "range",
        "generate_series",
        "unnest",
        "repeat",
        "repeat_row",
        "summary",
        "json_each",
        "json_tree",
        "histogram",
        "histogram_values",
        "test_all_types",
        "test_vector_types",
        "icu_calendar_names",
        "pg_timezone_names",
        "duckdb_columns",
        "duckdb_constraints",
        "duckdb_databases",
        "duckdb_dependencies",
        "duckdb_functions",
        "duckdb_indexes",
        "duckdb_keywords",
        "duckdb_schemas",
        "duckdb_sequences",
        "duckdb_settings",
        "duckdb_tables",
        "duckdb_types",
        "duckdb_views",
        "duckdb_memory",
        "duckdb_temporary_files",
        "duckdb_optimizers",
        "duckdb_variables",
        "duckdb_prepared_statements",
        "pragma_collations",
        "pragma_database_size",
        "pragma_metadata_info",
        "pragma_platform",
        "pragma_show",
        "pragma_storage_info",
        "pragma_table_info",
        "pragma_user_agent",
        "pragma_version",
        # a DuckLake's own listings (snapshots, files per table), for `flightrec sql --db 'ducklake:…'`
        "ducklake_snapshots",
        "ducklake_table_info",
        "ducklake_current_snapshot",
        "ducklake_settings",
    }
)

# Scalar functions that change state (sequences, the random seed, the log) or run SQL text.
WRITING_FUNCTIONS = frozenset(
    {
        "nextval",
        "setval",
        "setseed",
        "write_log",
        "query",
        "query_table",
        "enable_logging",
        "disable_logging",
        "truncate_duckdb_logs",
        "json_execute_serialized_sql",
        "checkpoint",
        "force_checkpoint",
    }
)

_parser_lock = threading.Lock()
_parser: duckdb.DuckDBPyConnection | None = None


def parse_with(con: duckdb.DuckDBPyConnection) -> None:
    """Make the check serialize syntax trees on ``con`` (a read's own process: the connection it reads with, rather
    than a DuckDB instance of its own, which costs time to make at every read)."""
    global _parser
    with _parser_lock:
        _parser = con


def _parse(sql: str) -> list[Any]:
    """DuckDB's own statements for ``sql`` (its parser: nested comments, casing, whitespace as DuckDB reads them)."""
    try:
        return list(duckdb.extract_statements(sql))
    except duckdb.Error as exc:
        raise QueryError(f"the query does not parse: {exc}") from exc
    except ValueError:  # a statement type the Python enum lacks (e.g. UPDATE EXTENSIONS)
        return [None]


def _type(statement: Any) -> str:
    try:
        return str(statement.type.name)
    except (AttributeError, ValueError):
        return "UNKNOWN"


def statement_types(sql: str) -> list[str]:
    """DuckDB's statement type names for ``sql`` ('UNKNOWN' for a type this package does not know)."""
    return [_type(s) for s in _parse(sql)]


def _words(sql: str) -> list[tuple[int, Any, str]]:
    """DuckDB's lexer's tokens of ``sql``: (position, kind, text up to the next token, blanks and comments included).

    Comments are not tokens, so however they nest they can neither hide a word nor make one.
    """
    tokens = duckdb.tokenize(sql)
    return [
        (pos, kind, sql[pos : tokens[i + 1][0] if i + 1 < len(tokens) else len(sql)])
        for i, (pos, kind) in enumerate(tokens)
    ]


def _keyword(word: tuple[int, Any, str], *names: str) -> bool:
    """Whether the token is one of the keywords ``names`` (its text up to the first non-word character)."""
    text = word[2]
    n = 0
    while n < len(text) and (text[n].isalnum() or text[n] == "_"):
        n += 1
    return word[1] == duckdb.token_type.keyword and text[:n].upper() in names


def _paren(word: tuple[int, Any, str]) -> int:
    """+1 for an opening, -1 for a closing parenthesis token, else 0 (the token's own first character: the text
    after it may hold comments, and a comment's parentheses are no token)."""
    if word[1] != duckdb.token_type.operator or not word[2]:
        return 0
    return {"(": 1, ")": -1}.get(word[2][0], 0)


def _after_parens(words: list[tuple[int, Any, str]], i: int) -> int:
    """The index after the parenthesised group starting at ``words[i]`` (len(words) when it never closes)."""
    depth = 0
    for j in range(i, len(words)):
        depth += _paren(words[j])
        if depth <= 0:
            return j + 1
    return len(words)


def _header_is(prefix: str, kind: str) -> bool:
    """Whether ``prefix`` followed by a plain SELECT is one statement of ``kind`` to DuckDB's parser: the cut was
    made where the wrapped query begins, and nothing of the prefix hides inside it."""
    try:
        statements = duckdb.extract_statements(prefix + "\nSELECT 1")
    except (duckdb.Error, ValueError):
        return False
    return len(statements) == 1 and _type(statements[0]) == kind


def _explained(sql: str) -> str:
    """The statement an EXPLAIN [ANALYZE] [(options)] wraps, cut where DuckDB's lexer says it begins ('' if unsure)."""
    words = _words(sql)
    i = 1  # words[0] is EXPLAIN (the statement's type says so)
    if i < len(words) and _keyword(words[i], "ANALYZE", "ANALYSE"):
        i += 1
    if i < len(words) and _paren(words[i]) == 1:
        i = _after_parens(words, i)
    if i >= len(words) or not _header_is(sql[: words[i][0]], "EXPLAIN"):
        return ""
    return sql[words[i][0] :]


def _view_body(stmt: str) -> str | None:
    """The query of ``CREATE [OR REPLACE] TEMP|TEMPORARY VIEW name [(columns)] AS query``, by DuckDB's lexer; else
    None."""
    words = _words(stmt)
    i = 0
    if not (words and _keyword(words[0], "CREATE")):
        return None
    i = 1
    if i + 1 < len(words) and _keyword(words[i], "OR") and _keyword(words[i + 1], "REPLACE"):
        i += 2
    if not (i + 1 < len(words) and _keyword(words[i], "TEMP", "TEMPORARY") and _keyword(words[i + 1], "VIEW")):
        return None
    i += 2
    while i < len(words) and not _keyword(words[i], "AS"):  # the name (dotted, quoted), then (columns)
        i = _after_parens(words, i) if _paren(words[i]) == 1 else i + 1
    if i + 1 >= len(words) or not _header_is(stmt[: words[i + 1][0]], "CREATE"):
        return None
    return stmt[words[i + 1][0] :]


def _syntax_tree(sql: str) -> dict[str, Any]:
    global _parser
    with _parser_lock:
        if _parser is None:
            _parser = duckdb.connect(":memory:", config={"enable_external_access": False})
        text = _parser.execute("SELECT json_serialize_sql(?)", [sql]).fetchall()[0][0]
    tree: dict[str, Any] = json.loads(text)
    return tree


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
        raise QueryError(
            f"{what} calls table functions readers may not use: {', '.join(bad)}; query the tables and views instead"
        )
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
    """Raise QueryError unless ``sql`` is exactly one statement a reader may run (see the module doc).

    Judged only from DuckDB's parse: the statement's type, and the syntax tree of the query DuckDB
    made of it (a describing PRAGMA comes back as its SELECT of ``pragma_*()``); for EXPLAIN, the
    statement DuckDB's lexer finds after EXPLAIN [ANALYZE] [(options)], judged the same way.
    """
    statements = _parse(sql)
    if len(statements) != 1:
        raise QueryError(f"one statement at a time, please (got {len(statements)})")
    statement, kind = statements[0], _type(statements[0])
    if kind == "SELECT":
        check_query(statement.query)
    elif kind == "EXPLAIN":
        inner = _explained(sql)
        inner_statements = _parse(inner) if inner.strip() else []
        inner_kinds = [_type(s) for s in inner_statements] or ["nothing"]
        if inner_kinds != ["SELECT"]:
            raise QueryError(
                f"only read-only queries are allowed here: EXPLAIN of a SELECT, not of "
                f"{' and '.join(inner_kinds)} (EXPLAIN ANALYZE runs its statement)"
            )
        check_query(inner_statements[0].query, "the explained query")
    elif kind == "PRAGMA":  # a describing PRAGMA parses as a SELECT: this one changes something
        raise QueryError("only PRAGMAs that read are allowed here: " + ", ".join(sorted(READ_PRAGMAS)))
    else:
        raise QueryError(
            f"only read-only queries are allowed here, not {kind}: "
            "use SELECT, EXPLAIN SELECT, or a PRAGMA that describes the database"
        )


@_cached
def check_prelude(stmt: str) -> None:
    """Raise QueryError unless ``stmt`` is exactly one ``CREATE [OR REPLACE] TEMP VIEW ... AS <query>``
    whose query passes :func:`check_query` (a view's body runs whenever a later query names it)."""
    kinds = statement_types(stmt)
    body = _view_body(stmt) if kinds == ["CREATE"] else None
    if body is None:
        raise QueryError(f"a prelude may only hold single CREATE TEMP VIEW statements, not {stmt[:80]!r}")
    check_query(body, "a prelude view")
