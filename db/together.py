"""A commit of several shards of a lake in one pass: their Deltas joined, their derived rows computed once.

Guarantees: the same rows as writing the shards one after another (``LakeStore`` falls back to that when
:func:`join_shards` says no); each derived row lands in the shard table of its instance, or nothing is written.
"""

from __future__ import annotations

import dataclasses
from typing import Mapping, Sequence

import duckdb
import pyarrow as pa
import pyarrow.compute as pc

from flightrec.db.classify import RuleTable
from flightrec.db.derive import Rewrite, affected_keys, recompute, replace_rows
from flightrec.db.fold import Delta
from flightrec.errors import LakeError

DERIVED_TABLES: tuple[str, ...] = ("instances", "boots", "failures", "running_stages")  # what db/derive rewrites


class ShardRewrite(Rewrite):
    """Derived rows written to the shard of their instance: ``mine`` maps each shard's schema (``lake.part_3``) to
    its instance ids."""

    def __init__(self, mine: Mapping[str, pa.Array]) -> None:
        self.mine = mine

    def replace(self, con: duckdb.DuckDBPyConnection, table: str, keys: pa.Table, rows: Sequence[pa.Table]) -> None:
        placed = 0
        for schema, ids in self.mine.items():
            here = [part.filter(pc.is_in(part["instance_id"], ids)) for part in rows]
            placed += sum(part.num_rows for part in here)
            replace_rows(con, f"{schema}.{table}", keys.filter(pc.is_in(keys["instance_id"], ids)), here)
        if placed != sum(part.num_rows for part in rows):  # an instance of no shard of the commit, or of two
            raise LakeError(f"derived {table} rows of instances outside this commit's shards; nothing was written")


def derive_together(
    con: duckdb.DuckDBPyConnection, rules: RuleTable, mine: Mapping[str, pa.Array], new: pa.Table
) -> int:
    """The derived rows of several shards' new events ``new`` in one pass (inside the commit's transaction); returns
    failure rows written. The derivation reads each derived table by its plain name, which finds a temporary view
    over these shards' tables before the search path; it writes each row to its instance's shard (ShardRewrite)."""
    made = []
    try:
        for name in DERIVED_TABLES:
            union = " UNION ALL BY NAME ".join(f"SELECT * FROM {schema}.{name}" for schema in sorted(mine))
            con.execute(f"CREATE OR REPLACE TEMP VIEW {name} AS {union}")
            made.append(name)
        return recompute(con, rules, affected_keys(con, new), ShardRewrite(mine))
    finally:
        for name in made:
            con.execute(f"DROP VIEW IF EXISTS temp.main.{name}")


def join_shards(
    shards: list[int], deltas: Mapping[int, Delta], views: Mapping[int, dict[str, pa.Table]]
) -> tuple[Delta, dict[str, pa.Table]] | None:
    """The shards' Deltas joined into one, with its views, when a commit writes several shards; None when it writes
    one, or when an event id or an instance is in two shards' Deltas (written shard after shard: the second copy of
    an event is then a duplicate or a conflict, as on a file; an instance's derived rows are in each shard)."""
    if len(shards) < 2:
        return None
    try:
        joined = {k: pa.concat_tables([views[s][k] for s in shards]) for k in views[shards[0]]}
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        return None
    ids = joined["_d_events"].column("event_id")
    if pc.count_distinct(ids).as_py() != len(ids):
        return None
    instances = [pc.unique(views[s]["_d_events"].column("instance_id")) for s in shards]
    if sum(len(i) for i in instances) != pc.count_distinct(pa.chunked_array(instances)).as_py():
        return None  # an instance in two shards (not keyed by its id): its derived rows in each, as shard by shard
    parts = [deltas[s] for s in shards]
    delta = dataclasses.replace(
        parts[0],
        **{k[len("_d_") :]: v for k, v in joined.items()},
        offsets={tp: o for d in parts for tp, o in d.offsets.items()},
        origins={e: o for d in parts for e, o in d.origins.items()},
        messages=sum(d.messages for d in parts),
        duplicates=sum(d.duplicates for d in parts),
        skipped=sum(d.skipped for d in parts),
    )
    return delta, joined
