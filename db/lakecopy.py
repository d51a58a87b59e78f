"""A lake reader's copy of the shards' tables in its own memory, brought up to date once per lake snapshot.

The rewritten tables of a lake (instances, boots, failures, …) live once per shard (``part_<p>``, see
db/lakestore.py) and ``main`` unites them in views. Every statement that names them binds one DuckLake table per
shard and table, each a catalog round trip, so a page's query cost many times what it costs on a file
(BENCHMARKS.md, The lake). A reader process therefore reads in its in-memory database (``USE memory``), laid out
as the lake and defined as statements need it:

* a shard table is copied (``memory.part_<p>.<table>``) the first time a statement reads it;
* ``main``'s views are defined there with the lake's own SQL, so they read the copies, except where the reader
  has its own definition (``views``, the statements a file reader runs before each query): then that one, so a
  statement need not define it again (:attr:`ShardCopy.ready`);
* the small event tables of the lake's ``main`` (EVENT_COPIES) are copied too (``memory.main.<table>``), and
  brought up to date with the rows later snapshots added;
* every other table of the lake's ``main`` (log lines, events seen) is a view there that reads the lake itself.

What a statement reads is told from the identifiers in its text and its prelude (every word that names a table
or view of the lake, wherever it stands: a name in a comment or a string only costs a copy or a definition more;
``lake.main.<name>`` reads the lake itself either way), and from what the views so named read in turn.

Guarantees: before a statement that reads shard tables runs (:meth:`ShardCopy.refresh` with the statement's text
and its prelude), every shard table it reads, through views too, is a copy of the lake's latest snapshot, all of
them of the same snapshot. A table is copied again only when a later snapshot changed it (``ducklake_snapshots``
lists which; an event table that only gained rows gets those rows), and the whole layout is defined again after a
table or view was made, altered or dropped. One thread
refreshes at a time; statements running meanwhile keep reading what they started with (DuckDB's MVCC).
"""

from __future__ import annotations

import contextlib
import logging
import re
import threading
import time
from collections.abc import Iterable, Sequence

import duckdb
from flightrec.db.lakelayout import ident, never_written

log = logging.getLogger(__name__)

COPY = "memory"  # the reader's in-memory database, where reads run
# Changes a commit of rows or maintenance makes (by table id): the tables they name are copied again. Any other kind
# (a table or view made, altered or dropped, a schema) changes the layout, which is then defined again.
ROW_CHANGES = frozenset(
    {
        "tables_inserted_into",
        "tables_deleted_from",
        "inlined_insert",
        "inlined_delete",
        "tables_compacted",
        "flushed_inlined",
        "merge_adjacent",
    }
)
ADDED_ROWS = frozenset({"tables_inserted_into", "inlined_insert"})  # changes that only add rows
# The event tables of main a reader copies too: rows per boot or stage, not per line (log_lines and events_seen stay
# in the lake). The materializer only adds to them, so a copy takes the rows later snapshots added (DuckLake's
# change feed) rather than the whole table again; a snapshot that did anything else to one copies it again.
EVENT_COPIES = frozenset({"lifecycle_events", "throughput", "process_exits", "manager_events", "instance_facts"})


def _words(text: str) -> set[str]:
    """Every identifier-like word of ``text``, lower case (DuckDB's names are case-insensitive)."""
    return {w.lower() for w in re.findall(r"\w+", text)}


def _view(stmt: str) -> tuple[str, str] | None:
    """(name, body) of a reader's ``CREATE OR REPLACE TEMP VIEW name AS body``; None for any other statement."""
    m = re.match(r"\s*CREATE OR REPLACE TEMP VIEW (\w+) AS\b", stmt, re.IGNORECASE)
    return (m.group(1), stmt[m.end() :]) if m else None


def _rollback(con: duckdb.DuckDBPyConnection) -> None:
    # on a connection the catalog dropped this fails too; the error to report is the first one
    with contextlib.suppress(duckdb.Error):
        con.execute("ROLLBACK")


class ShardCopy:
    """The copy of one attached lake (alias ``alias``) in the same connection's in-memory database."""

    def __init__(self, alias: str = "lake", views: Sequence[str] = ()) -> None:
        self.alias = alias
        self.views = tuple(views)  # the reader's view statements (CREATE OR REPLACE TEMP VIEW name AS …)
        self.own = [named for named in map(_view, self.views) if named]  # (name, body), in definition order
        self.main_tables: list[str] = []  # the lake's tables in main (the events)
        self.lake_views: dict[str, str] = {}  # the lake's views in main: name -> body, in creation order
        self.shards: dict[str, list[str]] = {}  # copied table name -> the schemas holding one (main: an event table)
        self.deps: dict[str, set[str]] = {}  # name in main -> the other names of main its definition reads
        self.reads: dict[str, frozenset[str]] = {}  # name in main -> the shard tables it reads, through views
        self.defined: set[str] = set()  # names defined in memory.main so far (lazily: what statements named)
        self.from_own: set[str] = set()  # those of them defined with the reader's own statement
        self.copied: dict[str, int] = {}  # shard table name -> the snapshot its copies hold
        self.seen: int | None = None  # the snapshot the layout was last read at
        self.lock = threading.Lock()
        self.tables_copied = 0  # all refreshes together (tests, benchmarks)
        self.tables_appended = 0  # event tables brought up to date with the rows snapshots added
        self.copied_empty: set[tuple[str, str]] = set()  # (schema, table) copied as never written: columns only

    @property
    def ready(self) -> frozenset[str]:
        """The reader's view statements the layout has defined: a statement need not run them."""
        from_own = self.from_own
        return frozenset(stmt for stmt in self.views if (v := _view(stmt)) and v[0] in from_own)

    def build(self, con: duckdb.DuckDBPyConnection) -> None:
        """Read the lake's layout (nothing is defined or copied until a statement needs it)."""
        with self.lock:
            self._build(con)

    def _build(self, con: duckdb.DuckDBPyConnection) -> None:
        con.execute("BEGIN TRANSACTION")  # the layout as of one snapshot, which it then records
        try:
            seen = self._latest(con)
            tables = con.execute(
                "SELECT schema_name, table_name FROM duckdb_tables() WHERE database_name = ?", [self.alias]
            ).fetchall()
            views = con.execute(
                "SELECT view_name, sql FROM duckdb_views() WHERE database_name = ? AND schema_name = 'main' "
                "AND NOT internal ORDER BY view_oid",
                [self.alias],
            ).fetchall()
            con.execute("COMMIT")
        except BaseException:
            _rollback(con)
            raise
        shards: dict[str, list[str]] = {}
        for schema, table in tables:
            if schema != "main" or table in EVENT_COPIES:
                shards.setdefault(table, []).append(schema)
        schemas = {s for names in shards.values() for s in names} - {"main"}
        lake_views = {
            name: re.split(r"\bAS\b", sql, maxsplit=1, flags=re.IGNORECASE)[1].strip().rstrip(";")
            for name, sql in views
        }
        main_tables = [t for s, t in tables if s == "main" and t not in EVENT_COPIES]
        texts = {**lake_views, **{name: f"{lake_views.get(name, '')}\n{body}" for name, body in self.own}}
        names = set(texts) | set(main_tables)
        deps, direct = {}, {}
        for name, body in texts.items():
            words = _words(body)
            deps[name] = {o for o in names if o != name and o.lower() in words}
            direct[name] = {t for t in shards if t.lower() in words}
        reads: dict[str, frozenset[str]] = {}
        for name in texts:  # the shard tables each view reads through the others
            found: set[str] = set()
            for other in self._closure({name}, deps):
                found |= direct.get(other, set())
            reads[name] = frozenset(found)
        for schema in sorted(schemas):  # what a former layout defined stays until replaced: a statement that is
            con.execute(f"CREATE SCHEMA IF NOT EXISTS {COPY}.{ident(schema)}")  # running may still read it
        self.main_tables, self.lake_views, self.shards, self.deps, self.reads = (
            main_tables,
            lake_views,
            shards,
            deps,
            reads,
        )
        self.defined, self.from_own, self.copied, self.seen = set(), set(), {}, seen

    @staticmethod
    def _closure(start: set[str], deps: dict[str, set[str]]) -> set[str]:
        seen, todo = set(start), list(start)
        while todo:
            for other in deps.get(todo.pop(), ()):
                if other not in seen:
                    seen.add(other)
                    todo.append(other)
        return seen

    def _named_in(self, words: set[str]) -> set[str]:
        """The names of main (tables and views, the lake's and the reader's) among ``words``, and what they read."""
        every = set(self.main_tables) | set(self.lake_views) | {name for name, _ in self.own}
        return self._closure({n for n in every if n.lower() in words}, self.deps)

    def needs(self, texts: Iterable[str]) -> set[str]:
        """The shard tables statements with these texts read: named through a view of main, or directly."""
        return self._needs(_words("\n".join(texts)))

    def _needs(self, words: set[str]) -> set[str]:
        out = {t for name in self._named_in(words) for t in self.reads.get(name, ())}
        return out | {t for t in self.shards if t.lower() in words}

    def _define(self, con: duckdb.DuckDBPyConnection, words: set[str]) -> None:
        """Define in memory.main what these texts read and is not defined yet: the lake's tables as views reading
        the lake, its views (over the copies), the reader's own views; each on its own (a view that does not fit
        this lake is left out: the statement's own prelude defines it, or it fails saying what is missing)."""
        want = self._named_in(words) - self.defined
        if not want:
            return
        a = ident(self.alias)
        own = dict(self.own)
        order = [(t, f"FROM {a}.main.{ident(t)}", False) for t in self.main_tables if t in want]
        order += [(v, body, False) for v, body in self.lake_views.items() if v in want and v not in own]
        order += [(v, body, True) for v, body in self.own if v in want]
        defined, from_own = set(), set()
        while order:  # a view reading one made after it (by the lake's order) is defined once that one is
            failed = []
            for name, body, mine in order:
                try:
                    con.execute(f"CREATE OR REPLACE VIEW {COPY}.main.{ident(name)} AS {body}")
                except duckdb.Error as exc:
                    failed.append((name, body, mine))
                    log.debug("view %s not defined in the reader's copy (yet: %s)", name, exc)
                    continue
                defined.add(name)
                if mine:
                    from_own.add(name)
            if len(failed) == len(order):
                break
            order = failed
        # new sets, not changed ones: `ready` reads them from other threads without the lock
        self.defined, self.from_own = self.defined | defined, self.from_own | from_own

    def refresh(self, con: duckdb.DuckDBPyConnection, texts: Iterable[str]) -> int:
        """Bring the layout to the lake's latest snapshot, copy what statements with these texts read as of that
        snapshot where the copy is older, and define what they name; returns the shard tables copied."""
        words = _words("\n".join(texts))
        with self.lock:
            latest = self._latest(con)
            if self.seen is None or (latest != self.seen and self._changes(con, self.seen, latest) is None):
                self._build(con)  # first use, or a table or view was made, altered or dropped since
                latest = max(latest, self.seen or latest)
            self.seen = latest
            n = 0
            stale = {t: self.copied.get(t) for t in self._needs(words) if self.copied.get(t) != latest}
            if stale:
                started = time.perf_counter()
                todo = self._changed(con, stale, latest)
                if todo is None:  # the layout changed after the check above: read it again, copy all needed
                    self._build(con)
                    latest = self.seen or latest
                    stale = {t: None for t in self._needs(words)}
                    todo = {(s, t) for t in stale for s in self.shards.get(t, ())}, {}
                n = self._copy(con, *todo, set(stale), latest)
                log.debug(
                    "lake copy at snapshot %d: %d tables in %.0f ms", latest, n, (time.perf_counter() - started) * 1e3
                )
            self._define(con, words)
            return n

    def _latest(self, con: duckdb.DuckDBPyConnection) -> int:
        return int(con.execute(f"SELECT id FROM {ident(self.alias)}.current_snapshot()").fetchall()[0][0])

    def _changes(
        self, con: duckdb.DuckDBPyConnection, after: int, upto: int
    ) -> dict[int, list[tuple[int, str]]] | None:
        """Table id -> the (snapshot, kind) of each change of its rows in (after, upto]; None if a snapshot changed the
        layout, or if some of them are gone (expired by maintenance: what they changed cannot be told, so everything
        is)."""
        rows = con.execute(
            "SELECT snapshot_id, changes FROM ducklake_snapshots(?) WHERE snapshot_id > ? AND snapshot_id <= ?",
            [self.alias, after, upto],
        ).fetchall()
        if len({int(r[0]) for r in rows}) != upto - after:  # snapshot ids are consecutive
            return None
        ids: dict[int, list[tuple[int, str]]] = {}
        for snapshot, changes in rows:
            for kind, values in (changes or {}).items():
                if kind not in ROW_CHANGES:
                    return None
                for v in values:
                    if str(v).isdigit():
                        ids.setdefault(int(v), []).append((int(snapshot), kind))
        return ids

    def _changed(
        self, con: duckdb.DuckDBPyConnection, stale: dict[str, int | None], latest: int
    ) -> tuple[set[tuple[str, str]], dict[str, int]] | None:
        """What to do for the stale tables: (schema, table) to copy (all shards of one never copied, else those a
        snapshot after its copy changed) and the event tables that only gained rows since the snapshot their copy
        holds (table -> that snapshot); None when a snapshot since changed the layout."""
        out = {(s, t) for t, at in stale.items() if at is None for s in self.shards.get(t, ())}
        since = [at for at in stale.values() if at is not None]
        if not since:
            return out, {}
        ids = self._changes(con, min(since), latest)
        if ids is None:
            return None
        if not ids:
            return out, {}
        try:  # schema names by id: the catalog's own table (DuckLake's specification), attached with the lake
            names = con.execute(
                f"""SELECT t.table_id, s.schema_name, t.table_name
                    FROM ducklake_table_info(?) t
                    JOIN {ident("__ducklake_metadata_" + self.alias)}.ducklake_schema s
                      ON s.schema_id = t.schema_id AND s.end_snapshot IS NULL
                    WHERE t.table_id IN (SELECT unnest(?::BIGINT[]))""",
                [self.alias, sorted(ids)],
            ).fetchall()
        except duckdb.Error as exc:
            log.debug("cannot tell which shard tables changed (%s): copying them all", exc)
            return out | {(s, t) for t, at in stale.items() if at is not None for s in self.shards.get(t, ())}, {}
        added: dict[str, int] = {}
        for table_id, schema, table in names:
            at = stale.get(table)
            if at is None or schema not in self.shards.get(table, ()):
                continue
            kinds = {kind for snapshot, kind in ids[int(table_id)] if snapshot > at}
            if not kinds:
                continue
            if schema == "main" and kinds <= ADDED_ROWS:
                added[table] = at
            else:
                out.add((schema, table))
        return out, {t: at for t, at in added.items() if ("main", t) not in out}

    def _copy(
        self,
        con: duckdb.DuckDBPyConnection,
        changed: set[tuple[str, str]],
        added: dict[str, int],
        tables: set[str],
        latest: int,
    ) -> int:
        """Copy ``changed`` as of snapshot ``latest`` and add to the event tables of ``added`` the rows the snapshots
        after theirs (up to ``latest``) added, in one transaction; ``tables`` are then at ``latest``."""
        a = ident(self.alias)
        copies = set(
            con.execute(
                "SELECT schema_name, table_name FROM duckdb_tables() WHERE database_name = ?", [COPY]
            ).fetchall()
        )
        con.execute("BEGIN TRANSACTION")
        try:
            empty = never_written(con, self.alias) & changed if changed else set()
            for schema, table in sorted(changed):
                target = f"{COPY}.{ident(schema)}.{ident(table)}"
                if (schema, table) not in copies:
                    con.execute(f"DROP VIEW IF EXISTS {target}")
                con.execute(  # a table that never held a row: its columns only, no scan (lakelayout.never_written)
                    f"CREATE OR REPLACE TABLE {target} AS "
                    f"FROM {a}.{ident(schema)}.{ident(table)} AT (VERSION => {int(latest)})"
                    + (" LIMIT 0" if (schema, table) in empty else "")
                )
            for table, at in sorted(added.items()):
                con.execute(
                    f"INSERT INTO {COPY}.main.{ident(table)} BY NAME "
                    "SELECT * EXCLUDE (snapshot_id, rowid, change_type) "
                    f"FROM {a}.table_changes(?, ?, ?) WHERE change_type = 'insert'",
                    [table, int(at) + 1, int(latest)],
                )
            con.execute("COMMIT")
        except BaseException:
            _rollback(con)
            raise
        for t in tables:
            self.copied[t] = latest
        self.tables_copied += len(changed)
        self.tables_appended += len(added)
        self.copied_empty = (self.copied_empty - changed) | empty
        return len(changed)
