"""What a lake's catalog says of its tables without reading them: which never held a row."""

from __future__ import annotations

import duckdb


def _ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def never_written(con: duckdb.DuckDBPyConnection, alias: str = "lake") -> set[tuple[str, str]]:
    """(schema, table) of each table of the lake ``alias`` attached to ``con`` that never held a row: no row was ever
    inserted into it, inlined in the catalog or in a file (DuckLake's table stats: no ``next_row_id`` yet).

    Reading such a table through DuckLake costs catalog round trips that ``LIMIT 0`` skips (the scan of the catalog's
    inlined rows), and one catalog query answers for every table (BENCHMARKS.md, The lake). The answer is
    the catalog's latest: a table never written now was never written at any earlier snapshot either (row ids only
    grow), but rows the caller's own open transaction wrote are not counted."""
    meta = _ident(f"__ducklake_metadata_{alias}")
    rows = con.execute(
        f"""SELECT s.schema_name, t.table_name
            FROM {meta}.ducklake_table t
            JOIN {meta}.ducklake_schema s ON s.schema_id = t.schema_id AND s.end_snapshot IS NULL
            LEFT JOIN {meta}.ducklake_table_stats st ON st.table_id = t.table_id
            WHERE t.end_snapshot IS NULL AND coalesce(st.next_row_id, 0) = 0"""
    ).fetchall()
    return {(str(schema), str(table)) for schema, table in rows}
