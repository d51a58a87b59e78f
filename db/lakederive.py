"""A lake commit's derived rows, computed once for every shard it writes: the shards' Deltas joined into one
(:func:`join_shards`), the member's own derived rows kept between commits (:class:`OwnedRows`), each derived row
written to the shard of its instance (:class:`ShardRewrite`, :func:`derive_together`).

Guarantees: the same rows as writing the shards one after another (``LakeStore`` falls back to that when
:func:`join_shards` says no); each derived row lands in the shard table of its instance, or nothing is written.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import duckdb
import pyarrow as pa
import pyarrow.compute as pc
from flightrec.db.classify import RuleTable
from flightrec.db.derive import BOOT_ONLY_KINDS, Rewrite, affected_keys, arrow_views, recompute, replace_rows
from flightrec.db.fold import Delta
from flightrec.db.lakelayout import never_written

from flightrec.errors import LakeError

# What the derivation reads of the derived tables (db/derive): all of boots and instances, the keys of failures
# (running_stages is only written). Each is kept in a temporary table of the member's connection (OwnedRows).
KEPT: dict[str, str] = {"boots": "*", "instances": "*", "failures": "instance_id, boot_id, stage"}


# The event tables the derivation reads several times a commit, always for the new events' instances only (their
# failures, states, stages, facts, results): read once a commit into temporary tables of those instances' rows
# when the commit has an event not of BOOT_ONLY_KINDS (a log-only commit reads lifecycle_events once, for seals).
# events_seen and log_lines are read where they are needed (each once or twice, by boot or by failing stage).
PREFETCHED: tuple[str, ...] = ("lifecycle_events", "throughput", "process_exits", "instance_facts")


class OwnedRows:
    """The derived rows of the shards a member owns, kept between commits in temporary tables of its connection
    (``_kept_boots``...), so the derivation reads no lake table of them: on a lake every table read costs catalog
    round trips, and a union of every shard's tables costs them once per shard.

    Guarantees: the kept rows are those of the lake's tables for the owned shards at the last successful commit.
    They are written in the commit's transaction (rolled back with it) and read again from the lake after any
    failed attempt, a commit written shard after shard (past them), a new claim or release (the epochs), or a new
    connection (the catalog came back)."""

    def __init__(self) -> None:
        self._key: tuple[object, ...] | None = None

    def ready(self, con: duckdb.DuckDBPyConnection, schemas: Mapping[str, int]) -> None:
        """Make the kept tables hold the rows of ``schemas`` (each owned shard's schema and its claim's epoch)."""
        key = (con, tuple(sorted(schemas.items())))
        if key == self._key:
            return
        self._key = None
        first, *rest = sorted(schemas)
        alias = first.split(".", 1)[0]  # each schema is the lake's alias and the shard's schema: lake.part_3
        # a table that never held a row is not read (lakelayout.never_written: one question to the catalog for all of
        # them, where a read of each empty table costs its round trips; BENCHMARKS.md, The lake): a new lake, a new
        # shard
        empty = {f"{alias}.{schema}.{table}" for schema, table in never_written(con, alias)}
        for name, columns in KEPT.items():  # shard by shard: a union of lake tables reads each slower
            none = " LIMIT 0" if f"{first}.{name}" in empty else ""
            con.execute(f"CREATE OR REPLACE TEMP TABLE _kept_{name} AS SELECT {columns} FROM {first}.{name}{none}")
            for schema in rest:
                if f"{schema}.{name}" not in empty:
                    con.execute(f"INSERT INTO temp.main._kept_{name} BY NAME SELECT {columns} FROM {schema}.{name}")
        self._key = key

    def forget(self) -> None:
        """The kept rows may differ from the lake's (an attempt failed): read them again before the next use."""
        self._key = None


def fresh_instances(con: duckdb.DuckDBPyConnection, ids: pa.Array) -> pa.Array:
    """Those of ``ids`` with no kept row (OwnedRows, ready): no boots, instances or failures row in the owned shards
    before this commit, so none in any derived table of their shard either (running_stages rows are written with an
    instance's instances row, in the same recompute)."""
    with arrow_views(con, _fresh_ids=pa.table({"instance_id": ids})):
        kept = " UNION ALL ".join(f"SELECT instance_id FROM temp.main._kept_{name}" for name in KEPT)
        return con.sql(f"SELECT instance_id FROM _fresh_ids ANTI JOIN ({kept}) USING (instance_id)").to_arrow_table()[
            "instance_id"
        ]


class ShardRewrite(Rewrite):
    """Derived rows written to the shard of their instance (``mine`` maps each shard's schema, ``lake.part_3``, to
    its instance ids), and to the kept rows (OwnedRows). Rows of ``fresh`` instances (fresh_instances) are only
    inserted: a lake's DELETE costs catalog round trips even where it finds nothing (for each table and shard)."""

    def __init__(self, mine: Mapping[str, pa.Array], fresh: pa.Array | None = None) -> None:
        self.mine = mine
        self.fresh = fresh if fresh is not None else pa.array([], pa.string())

    def replace(self, con: duckdb.DuckDBPyConnection, table: str, keys: pa.Table, rows: Sequence[pa.Table]) -> None:
        placed = 0
        stored = keys.filter(pc.invert(pc.is_in(keys["instance_id"], self.fresh))) if len(self.fresh) else keys
        for schema, ids in self.mine.items():
            here = [part.filter(pc.is_in(part["instance_id"], ids)) for part in rows]
            placed += sum(part.num_rows for part in here)
            replace_rows(con, f"{schema}.{table}", stored.filter(pc.is_in(stored["instance_id"], ids)), here)
        if placed != sum(part.num_rows for part in rows):  # an instance of no shard of the commit, or of two
            raise LakeError(f"derived {table} rows of instances outside this commit's shards; nothing was written")
        if table in KEPT:
            columns = KEPT[table]
            kept = rows if columns == "*" else [part.select(columns.split(", ")) for part in rows]
            replace_rows(con, f"temp.main._kept_{table}", keys, kept)


def derive_together(
    con: duckdb.DuckDBPyConnection,
    rules: RuleTable,
    owned: OwnedRows,
    schemas: Mapping[str, int],
    mine: Mapping[str, pa.Array],
    new: pa.Table,
    main: str,
) -> int:
    """The derived rows of the new events ``new`` of a commit's shards (``mine``) in one pass, inside the commit's
    transaction; returns failure rows written. The derivation reads the derived tables kept for the owned shards
    (``schemas``, OwnedRows), the small event tables' rows of the new events' instances read once from the lake's
    ``main`` schema (PREFETCHED), and writes each row to its instance's shard (ShardRewrite)."""
    owned.ready(con, schemas)
    # only where an event can change more than its boot's counts: else the derivation reads them once or not at all
    prefetch = PREFETCHED if not pc.all(pc.is_in(new["kind"], pa.array(BOOT_ONLY_KINDS))).as_py() else ()
    with arrow_views(con, _pre_instances=pa.table({"instance_id": pc.unique(new["instance_id"])})):
        for name in prefetch:  # this transaction's own rows included
            con.execute(
                f"CREATE OR REPLACE TEMP TABLE _pre_{name} AS "
                f"SELECT * FROM {main}.{name} SEMI JOIN _pre_instances USING (instance_id)"
            )
    # the plain names, for the derivation only (a plain name finds a temporary view before the search path); made in
    # the transaction, so a failed one takes them with its rollback (a statement after a failed one would fail too)
    shadows = {**{n: f"_kept_{n}" for n in KEPT}, **{n: f"_pre_{n}" for n in prefetch}}
    for name, table in shadows.items():
        con.execute(f"CREATE OR REPLACE TEMP VIEW {name} AS SELECT * FROM temp.main.{table}")
    fresh = fresh_instances(con, pc.unique(new["instance_id"]))  # before anything of the commit is derived
    written = recompute(con, rules, affected_keys(con, new), ShardRewrite(mine, fresh))
    for name in shadows:
        con.execute(f"DROP VIEW temp.main.{name}")
    for name in prefetch:
        con.execute(f"DROP TABLE temp.main._pre_{name}")
    return written


def join_shards(
    shards: list[int], deltas: Mapping[int, Delta], views: Mapping[int, dict[str, pa.Table]]
) -> tuple[Delta, dict[str, pa.Table]] | None:
    """The shards' Deltas (one or several) joined into one, with its views; None when an event id or an instance is
    in two shards' Deltas (written shard after shard: the second copy of an event is then a duplicate or a
    conflict, as on a file; an instance's derived rows are in each shard)."""
    if not shards:
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
