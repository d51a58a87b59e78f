"""A targeted purge: one instance's rows, or a leaked secret's text, taken out of every table of a database.

``purge_instance`` deletes every row whose ``instance_id`` is the instance (and the dead letters keyed by it) in
every table that has one; ``mask_text`` replaces each occurrence of a text by as many ``*`` as it has bytes, in
every text a table holds, nested ones included (lists of lines, tails, attributes), and in the dead letters' raw
bytes (same length: the Avro still decodes). The same statements run on a file and on a lake (its shared tables and
every shard's); both run in the caller's transaction.

Deleted rows stay on disk until they are written over: a file is compacted after a purge (db/compact.py), a lake
has its files written anew and its old snapshots expired at once (the CLI does both: ``flightrec purge``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

import duckdb
import pyarrow as pa
from flightrec.db.arrowviews import arrow_views

# bookkeeping that names no instance and holds no event text
SKIPPED = {"materializer_runs", "schema_version", "consumer_offsets", "claim", "retention_marks"}


def mask(secret: str) -> str:
    """What a purged text becomes: one ``*`` per byte of it (so the raw Avro of a record keeps its length)."""
    return "*" * len(secret.encode())


def _split(inner: str) -> list[str]:
    """Top-level comma-separated parts of a type's arguments."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(inner):
        if ch in "([":
            depth += 1
        elif ch in ")]":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(inner[start:i].strip())
            start = i + 1
    parts.append(inner[start:].strip())
    return [p for p in parts if p]


def _field(part: str) -> tuple[str, str]:
    m = re.match(r'\s*("(?:[^"]|"")*"|\w+)\s+(.*)$', part, re.S)
    if not m:
        raise ValueError(f"cannot read the struct field {part!r}")
    return m.group(1), m.group(2)


def masked(expr: str, kind: str) -> str | None:
    """An expression of ``expr`` (of DuckDB type ``kind``) with ``$secret`` replaced by ``$mask`` in every string
    it holds; None when it holds none. Handles VARCHAR, lists, structs and maps, nested."""
    kind = kind.strip()
    if kind == "VARCHAR":
        return f"replace({expr}, $secret, $mask)"
    if kind.endswith("[]"):
        inner = masked("x", kind[:-2])
        return None if inner is None else f"list_transform({expr}, x -> {inner})"
    if kind.startswith("STRUCT(") and kind.endswith(")"):
        fields = [_field(p) for p in _split(kind[7:-1])]
        made = [(name, masked(f"{expr}.{name}", t)) for name, t in fields]
        if all(m is None for _, m in made):
            return None
        body = ", ".join(f"{name}: {m if m is not None else f'{expr}.{name}'}" for name, m in made)
        return f"CASE WHEN {expr} IS NULL THEN NULL ELSE {{{body}}} END"
    if kind.startswith("MAP(") and kind.endswith(")"):
        k, v = _split(kind[4:-1])
        mk, mv = masked("e.key", k) or "e.key", masked("e.value", v) or "e.value"
        return f"map_from_entries(list_transform(map_entries({expr}), e -> {{key: {mk}, value: {mv}}}))"
    return None


def tables(con: duckdb.DuckDBPyConnection, database: str) -> list[tuple[str, str]]:
    """(schema, table) of every table of ``database`` a purge looks at."""
    rows = con.execute(
        "SELECT schema_name, table_name FROM duckdb_tables() WHERE database_name = ? AND NOT temporary ORDER BY ALL",
        [database],
    ).fetchall()
    return [(str(s), str(t)) for s, t in rows if t not in SKIPPED]


def _columns(con: duckdb.DuckDBPyConnection, database: str, schema: str, table: str) -> list[tuple[str, str]]:
    return [
        (str(c), str(t))
        for c, t in con.execute(
            "SELECT column_name, data_type FROM duckdb_columns() WHERE database_name = ? AND schema_name = ? "
            "AND table_name = ? ORDER BY column_index",
            [database, schema, table],
        ).fetchall()
    ]


def _name(database: str, schema: str, table: str) -> str:
    return f'"{database}"."{schema}"."{table}"'


def purge_instance(con: duckdb.DuckDBPyConnection, database: str, instance: str) -> dict[str, int]:
    """Delete every row of ``instance`` in every table of ``database``; rows deleted by table."""
    out: dict[str, int] = {}
    for schema, table in tables(con, database):
        cols = {c for c, _ in _columns(con, database, schema, table)}
        where = []
        if "instance_id" in cols:
            where.append("instance_id = $instance")
        if table == "dead_letters" and "key" in cols:
            where.append("key = CAST($instance AS BLOB)")
        if not where:
            continue
        n = con.execute(
            f"DELETE FROM {_name(database, schema, table)} WHERE {' OR '.join(where)}", {"instance": instance}
        ).fetchall()[0][0]
        if n:
            out[f"{schema}.{table}"] = out.get(f"{schema}.{table}", 0) + int(n)
    return out


def _has(expr: str, kind: str) -> str | None:
    """A condition true where ``expr`` holds ``$secret`` in a string (the rows an UPDATE must touch)."""
    changed = masked(expr, kind)
    return None if changed is None else f"({expr} IS DISTINCT FROM {changed})"


def mask_text(con: duckdb.DuckDBPyConnection, database: str, secret: str) -> dict[str, int]:
    """Replace ``secret`` by :func:`mask` in every string of every table of ``database``; rows changed by table."""
    if not secret:
        raise ValueError("an empty text cannot be purged")
    params = {"secret": secret, "mask": mask(secret)}
    out: dict[str, int] = {}
    for schema, table in tables(con, database):
        cols = _columns(con, database, schema, table)
        sets = [(c, masked(f'"{c}"', t), _has(f'"{c}"', t)) for c, t in cols]
        sets = [(c, m, h) for c, m, h in sets if m is not None and h is not None]
        if sets:
            assignments = ", ".join(f'"{c}" = {m}' for c, m, _ in sets)
            where = " OR ".join(str(h) for _, _, h in sets)
            n = con.execute(
                f"UPDATE {_name(database, schema, table)} SET {assignments} WHERE {where}", params
            ).fetchall()[0][0]
            if n:
                out[f"{schema}.{table}"] = int(n)
        if table == "dead_letters":
            n = _mask_dead_letters(con, _name(database, schema, table), secret.encode())
            if n:
                out[f"{schema}.{table}"] = out.get(f"{schema}.{table}", 0) + n
    return out


def _mask_dead_letters(con: duckdb.DuckDBPyConnection, name: str, secret: bytes) -> int:
    """The dead letters' raw key and value with ``secret`` replaced by as many ``*`` bytes (their length kept)."""
    rows = con.execute(
        f'SELECT topic, "partition", "offset", key, value FROM {name} '
        "WHERE contains(hex(value), $hex) OR contains(hex(key), $hex)",
        {"hex": secret.hex().upper()},
    ).fetchall()
    star = b"*" * len(secret)
    fixed = [
        {"topic": t, "partition": p, "offset": o, "key": k.replace(secret, star) if k else k,
         "value": v.replace(secret, star) if v else v}
        for t, p, o, k, v in rows
        if (k and secret in k) or (v and secret in v)
    ]  # fmt: skip
    if not fixed:
        return 0
    table = pa.Table.from_pylist(
        fixed,
        schema=pa.schema(
            [("topic", pa.string()), ("partition", pa.int32()), ("offset", pa.int64()), ("key", pa.binary()),
             ("value", pa.binary())]
        ),
    )  # fmt: skip
    with arrow_views(con, _purged_dead=table):
        con.execute(f"""UPDATE {name} d SET key = p.key, value = p.value FROM _purged_dead p
                        WHERE d.topic = p.topic AND d."partition" = p."partition" AND d."offset" = p."offset" """)
    return len(fixed)


def mask_bytes(values: Iterable[bytes | None], secret: bytes) -> list[bytes | None]:
    """Each value with ``secret`` replaced by as many ``*`` bytes (the archive's raw records). Pure."""
    star = b"*" * len(secret)
    return [v.replace(secret, star) if v else v for v in values]
