"""The one Store interface: what the materializer writes through, on a file (FileStore) or a lake (LakeStore)."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Protocol

import duckdb
from flightrec.db.classify import RuleTable
from flightrec.db.filestore import FileStore
from flightrec.db.fold import Delta
from flightrec.db.lakestore import LakeStore
from flightrec.db.location import FileLocation, Location
from flightrec.db.markers import (
    lake_replay_begins,
    lake_replay_unfinished,
    replaying_path,
    unfinished_lake_replay,
    unfinished_replay,
)
from flightrec.db.snapshot import Publisher
from flightrec.db.stats import Stats

from flightrec.errors import MaterializeError


class Store(Protocol):
    """A writable database of the materialized tables and the consumer offsets.

    Guarantees of every implementation: ``commit`` writes the Deltas' rows and the offsets after them in one
    transaction each (nothing counted twice, nothing of a failed commit kept); ``offsets`` are the ones stored
    with the rows; the schema is migrated to the code's version when the store opens (db/migrate.py).
    """

    con: duckdb.DuckDBPyConnection  # the writer's connection (the writer thread only)
    totals: Stats  # this run's commits, summed
    run_id: str

    def describe(self) -> str:
        """The database for messages (any password masked)."""
        ...

    def offsets(self) -> dict[tuple[str, int], int]:
        """The next offset to read per (topic, partition) of this consumer group."""
        ...

    def commit(self, deltas: Mapping[int, Delta]) -> Stats:
        """Write each shard's (partition number's) Delta and the offsets after it; returns what was written."""
        ...

    def close(self) -> None:
        """Record the run and let the database go."""
        ...


def open_store(
    loc: Location,
    group: str,
    *,
    rules: RuleTable | None = None,
    replay: bool = False,
    memory_limit: str = "512MB",
    lock_wait: float = 30.0,
    views: tuple[str, ...] = (),
    publish: bool = True,
    snapshots: Publisher | None = None,
    again: bool = False,
) -> Store:
    """The store of ``loc`` (in the writer thread). A replay builds a new database: an existing file, or a lake
    that holds events, is refused (MaterializeError) before anything is written; a file a replay left unfinished is
    refused to every writer (db/markers.py). ``again``: the same run opens its store again (a compaction, a full
    disk), so its own file is no refusal. ``publish``: a file's store publishes snapshots for readers
    (flightrec.db.snapshot); a lake's readers attach it themselves. ``snapshots``: the publisher of the file's store
    before (``FileStore.detach``), taken over once the file is open."""
    mode = "replay" if replay else "materialize"
    if isinstance(loc, FileLocation):
        if not again:
            _check_new_file(loc, replay)
        return FileStore(loc.path, group, rules, mode, memory_limit, lock_wait, views, publish, snapshots)
    store = LakeStore(loc, group, rules, mode, memory_limit, views)
    try:
        _check_lake(store, replay, again)
    except BaseException:
        store.close()
        raise
    return store


def _check_lake(store: LakeStore, replay: bool, again: bool) -> None:
    """The lake's version of :func:`_check_new_file`: a replay needs a lake without events and marks it as its own
    until it is whole (a row, db/markers.py); any other writer refuses a lake a replay left unfinished."""
    if again:
        return
    if replay:
        if store.holds_events():
            raise MaterializeError(
                f"the lake {store.describe()} already holds events; replay builds a new lake: "
                "give a new catalog database (`flightrec catalog` makes one per --db string)"
            )
        store.transaction(
            "mark the lake as a replay's", lambda: lake_replay_begins(store.con, store.run_id, store.started_us)
        )
    elif store.transaction("look for an unfinished replay", lambda: lake_replay_unfinished(store.con)) is not None:
        raise MaterializeError(unfinished_lake_replay(store.describe()))


def _check_new_file(loc: FileLocation, replay: bool) -> None:
    """Refuse a file a replay left unfinished, and for a replay any existing file. A replay's marker is made before
    its file, so that a replay stopped at any point is known as one; one left beside no file is stale."""
    marker = replaying_path(loc.path)
    if loc.exists():
        if marker.exists():
            raise MaterializeError(unfinished_replay(loc.path))
        if replay:
            raise MaterializeError(
                f"{loc.path} exists; replay builds a new database: replay into another --db, or delete it (and "
                f"{loc.path}.wal) to build it again"
            )
    elif replay:
        with contextlib.suppress(OSError):  # no folder: the store says so
            marker.touch()
    else:
        marker.unlink(missing_ok=True)
