"""A lake's layout: a schema per shard holding the tables commits rewrite, what marks a layout as made, what the
catalog says of its tables without reading them (which never held a row), and how its names are quoted in SQL."""

from __future__ import annotations

import hashlib
import re

import duckdb
from flightrec.db.migrate import schema_sql

# Tables rewritten by commits (DELETE/UPDATE, which conflict per table in DuckLake): one copy per shard.
SHARD_TABLES: tuple[str, ...] = ("instances", "boots", "failures", "heartbeats", "running_stages", "consumer_offsets")
CLAIM_SQL = """CREATE TABLE IF NOT EXISTS {schema}.claim (
    owner          VARCHAR,   -- the member (one process) holding the shard
    epoch          BIGINT,    -- bumped by every claim; a commit must still see its own
    claimed_us     BIGINT,
    last_commit_us BIGINT
)"""


def ident(name: str) -> str:
    """``name`` as a quoted SQL identifier (a lake's alias, a schema, a table): the one quoting of the db package."""
    return '"' + name.replace('"', '""') + '"'


def shard_schema(shard: int) -> str:
    """The lake schema holding one shard's rewritten tables."""
    return f"part_{shard}"


def ddl() -> dict[str, str]:
    """Each table's CREATE TABLE statement of db/schema.sql without its keys (DuckLake has none), then its
    ALTER TABLE statements; by table name, with ``{schema}`` where the table's schema goes."""
    text = re.sub(r"--[^\n]*", "", schema_sql())
    out: dict[str, str] = {}
    for stmt in (s.strip() for s in text.split(";")):
        m = re.match(r"CREATE TABLE IF NOT EXISTS (\w+)|ALTER TABLE (\w+)", stmt)
        if not m:
            continue
        name = m.group(1) or m.group(2)
        stmt = re.sub(r",\s*PRIMARY KEY \([^)]*\)", "", stmt)
        stmt = re.sub(r"\s+PRIMARY KEY", "", stmt)
        stmt = re.sub(r"\s+USING COMPRESSION \w+", "", stmt)  # DuckDB's storage; a lake's Parquet has its own
        stmt = re.sub(rf"^(CREATE TABLE IF NOT EXISTS|ALTER TABLE) {name}\b", rf"\1 {{schema}}.{name}", stmt)
        out[name] = out.get(name, "") + stmt + ";\n"
    return out


def mark(kind: str, *parts: str) -> str:
    """The comment marking a part of a lake's layout as made from ``parts`` (LakeStore.add_shards)."""
    return f"flightrec {kind} " + hashlib.sha256("\0".join(parts).encode()).hexdigest()[:20]


def marks(con: duckdb.DuckDBPyConnection, alias: str) -> dict[str, str]:
    """The layout's marks (LakeStore.add_shards): each shard schema's (a comment on its ``claim`` table), and
    ``main``'s (the views': a comment on ``main.claims``)."""
    rows = con.execute(
        "SELECT schema_name, comment FROM duckdb_tables() WHERE database_name = ? AND table_name = 'claim' "
        "UNION ALL SELECT schema_name, comment FROM duckdb_views() "
        "WHERE database_name = ? AND schema_name = 'main' AND view_name = 'claims'",
        [alias, alias],
    ).fetchall()
    return {str(schema): str(comment) for schema, comment in rows if comment}


def union_views(shards: list[int]) -> list[str]:
    """main.<table> for each shard table (and main.claims, with each row's shard): the union of every shard's."""
    out = []
    for name in SHARD_TABLES:
        union = " UNION ALL BY NAME ".join(f"SELECT * FROM {shard_schema(s)}.{name}" for s in shards)
        out.append(f"CREATE OR REPLACE VIEW main.{name} AS {union}")
    union = " UNION ALL BY NAME ".join(f"SELECT {s} AS shard, * FROM {shard_schema(s)}.claim" for s in shards)
    out.append(f"CREATE OR REPLACE VIEW main.claims AS {union}")
    return out


def never_written(con: duckdb.DuckDBPyConnection, alias: str = "lake") -> set[tuple[str, str]]:
    """(schema, table) of each table of the lake ``alias`` attached to ``con`` that never held a row: no row was ever
    inserted into it, inlined in the catalog or in a file (DuckLake's table stats: no ``next_row_id`` yet).

    Reading such a table through DuckLake costs catalog round trips that ``LIMIT 0`` skips (the scan of the catalog's
    inlined rows), and one catalog query answers for every table (BENCHMARKS.md, The lake). The answer is
    the catalog's latest: a table never written now was never written at any earlier snapshot either (row ids only
    grow), but rows the caller's own open transaction wrote are not counted."""
    meta = ident(f"__ducklake_metadata_{alias}")
    rows = con.execute(
        f"""SELECT s.schema_name, t.table_name
            FROM {meta}.ducklake_table t
            JOIN {meta}.ducklake_schema s ON s.schema_id = t.schema_id AND s.end_snapshot IS NULL
            LEFT JOIN {meta}.ducklake_table_stats st ON st.table_id = t.table_id
            WHERE t.end_snapshot IS NULL AND coalesce(st.next_row_id, 0) = 0"""
    ).fetchall()
    return {(str(schema), str(table)) for schema, table in rows}
