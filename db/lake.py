"""The DuckLake edge: load the offline extensions, attach the lake, read it locked down, maintain it."""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from importlib import metadata, resources
from pathlib import Path
from typing import Any

import duckdb
from flightrec.db.lakecopy import COPY, ShardCopy
from flightrec.db.lakelayout import ident

# the --db grammar's lake names, re-exported here (``X as X``) for the lake's callers
from flightrec.db.location import DATA_PATH_ENV as DATA_PATH_ENV
from flightrec.db.location import PREFIX as PREFIX
from flightrec.db.location import LakeLocation as LakeLocation
from flightrec.db.location import lake_location as lake_location
from flightrec.db.location import mask_password as mask_password
from flightrec.db.location import parse_db as parse_db
from flightrec.db.location import reader_data_path as reader_data_path
from flightrec.db.views import ALL_VIEWS

from flightrec.errors import LakeError

log = logging.getLogger(__name__)

# (import package, distribution to pip install, extension name): the extensions ship as PyPI wheels, loaded
# from the file inside the installed package, so nothing is ever INSTALLed from the internet.
EXTENSIONS: tuple[tuple[str, str, str], ...] = (
    ("duckdb_extension_ducklake", "duckdb-extension-ducklake", "ducklake"),
    ("duckdb_extension_postgres_scanner", "duckdb-extension-postgres-scanner", "postgres_scanner"),
)


def extension_file(package: str, dist: str, name: str) -> Path:
    """The ``.duckdb_extension`` file for this DuckDB version inside the installed wheel ``dist``.

    Raises LakeError saying what to pip install when the wheel is missing or built for another DuckDB.
    """
    want = duckdb.__version__
    hint = f"pip install '{dist}=={want}'"
    try:
        root = Path(str(resources.files(package)))
    except ModuleNotFoundError:
        raise LakeError(f"the DuckDB extension {name} is not installed: {hint}") from None
    exact = root / "extensions" / f"v{want}" / f"{name}.duckdb_extension"
    if exact.is_file():
        return exact
    try:
        have = metadata.version(dist)
    except metadata.PackageNotFoundError:
        have = "an unknown version"
    raise LakeError(f"the DuckDB extension {name} installed ({dist} {have}) is not built for duckdb {want}: {hint}")


def load_extensions(con: duckdb.DuckDBPyConnection) -> None:
    """LOAD the ducklake and postgres_scanner extensions from their wheels into ``con`` (offline; idempotent)."""
    loaded = {r[0] for r in con.execute("SELECT extension_name FROM duckdb_extensions() WHERE loaded").fetchall()}
    for package, dist, name in EXTENSIONS:
        if name in loaded or (name == "postgres_scanner" and "postgres" in loaded):
            continue
        path = extension_file(package, dist, name)
        try:
            con.execute(f"LOAD {_quote(str(path))}")
        except duckdb.Error as exc:
            raise LakeError(
                f"DuckDB could not load the {name} extension from {path}: {exc}; "
                f"reinstall it: pip install --force-reinstall '{dist}=={duckdb.__version__}'"
            ) from exc


CONNECT_TIMEOUT_S = 10  # how long a connection to a PostgreSQL catalog may take, unless the --db string says
_CATALOG_AWAY = re.compile(
    r"unable to connect|connection refused|could not connect|connection to server|"
    r"server closed the connection|terminating connection|no connection to the server|"
    r"connection (?:is |already |has been )?(?:closed|lost|reset)|broken pipe|"
    r"ssl syscall error|ssl connection has been closed|timed out|timeout expired|"
    r"no connection available|connection pool|failed to execute query \"rollback\"|"
    r"the database system is (?:starting up|shutting down|in recovery mode)"
)
# Answers of a catalog that is there but refuses: waiting does not help, the operator must act.
_CATALOG_REFUSES = re.compile(
    r"password authentication failed|no pg_hba\.conf entry|database \S+ does not exist|"
    r"role \S+ does not exist|permission denied|certificate verify failed"
)


def is_catalog_away(exc: BaseException) -> bool:
    """Whether an error says the lake's catalog (PostgreSQL) did not answer: down, restarting, unreachable, or it
    dropped the connection (or ours to it was closed after such an error). Such an error is retriable: attach
    again once the catalog is back. A catalog that answers with a refusal (a wrong password, no such database)
    is not away."""
    text = str(exc).lower()
    return bool(_CATALOG_AWAY.search(text)) and not _CATALOG_REFUSES.search(text)


def attach(con: duckdb.DuckDBPyConnection, loc: LakeLocation, *, alias: str = "lake", read_only: bool = False) -> None:
    """ATTACH the lake as ``alias`` (READ_ONLY for readers) and USE it, so unqualified table names are the lake's."""
    load_extensions(con)
    options = []
    if loc.data_path:
        if "://" not in loc.data_path and not read_only:
            Path(loc.data_path).mkdir(parents=True, exist_ok=True)
        options.append(f"DATA_PATH {_quote(loc.data_path)}")
    if read_only:
        options.append("READ_ONLY")
        if loc.data_path:  # a reader on another host may reach the same files under another path
            options.append("OVERRIDE_DATA_PATH TRUE")
    target = loc.attach
    if target.startswith(PREFIX + "postgres:") and "connect_timeout" not in target:
        target += f" connect_timeout={CONNECT_TIMEOUT_S}"  # libpq waits for TCP's own timeout (minutes) without it
    sql = f"ATTACH {_quote(target)} AS {ident(alias)}" + (f" ({', '.join(options)})" if options else "")
    try:
        con.execute(sql)
    except duckdb.Error as exc:
        cause = " ".join(mask_password(str(exc)).split())
        hint = "; is its PostgreSQL running and reachable (`flightrec catalog status`)?" if is_catalog_away(exc) else ""
        if "explicitly disabled" in cause:  # a reader on a catalog no writer has made a lake in
            hint = (
                f"; no lake was written there yet: run `flightrec materialize --db '{loc.describe()}' "
                "--data-path DIR` first"
            )
        raise LakeError(f"cannot attach the lake {loc.describe()}: {cause}{hint}") from None
    con.execute(f"USE {ident(alias)}")


def connect(
    loc: LakeLocation, *, read_only: bool = False, config: Mapping[str, Any] | None = None, alias: str = "lake"
) -> duckdb.DuckDBPyConnection:
    """A new in-memory DuckDB connection with the lake attached as ``alias`` and in use."""
    con = duckdb.connect(":memory:", config=dict(config or {}))
    try:
        attach(con, loc, alias=alias, read_only=read_only)
    except BaseException:
        con.close()
        raise
    return con


# A reader's DuckDB: no extension loaded or installed behind our back, no Python objects as tables.
READER_CONFIG: dict[str, str | bool | int | float | list[str]] = {
    "autoload_known_extensions": False,
    "autoinstall_known_extensions": False,
    "python_enable_replacements": False,
}


def data_path_of(con: duckdb.DuckDBPyConnection, alias: str = "lake") -> str:
    """The data path in use by the lake attached as ``alias`` (the catalog's, or the override)."""
    row = con.execute("SELECT data_path FROM ducklake_settings(?)", [alias]).fetchone()
    if not row or not row[0]:
        raise LakeError(f"the lake attached as {alias} names no data path")
    return str(row[0])


def open_reader(loc: LakeLocation, alias: str = "lake") -> duckdb.DuckDBPyConnection:
    """A locked-down read-only connection to the lake: attached READ_ONLY, then file access off except for the
    lake's own data path, no extension loading, configuration locked (no SET can undo any of it)."""
    con = duckdb.connect(":memory:", config=READER_CONFIG)
    try:
        attach(con, loc, alias=alias, read_only=True)
        data = data_path_of(con, alias)
        con.execute("SET allowed_directories = ?", [[data]])
        con.execute("SET enable_external_access = false")
        con.execute("SET TimeZone = 'UTC'")  # TIMESTAMPTZ columns in UTC whatever the machine's zone, as on a file
        con.execute("SET lock_configuration = true")
    except BaseException:
        con.close()
        raise
    return con


_readers: dict[LakeLocation, tuple[duckdb.DuckDBPyConnection, ShardCopy]] = {}
_readers_lock = threading.Lock()


def reader_cursor(loc: LakeLocation, alias: str = "lake", texts: Sequence[str] = ()) -> duckdb.DuckDBPyConnection:
    """A new cursor (its own transaction, temp views and default database) on this process's shared reader of
    ``loc``, reading in the reader's copy of the shards (flightrec.db.lakecopy): the lake's latest snapshot for
    statements with these ``texts`` (the statement and its prelude) that read copied tables. Close it after use."""
    try:
        with _readers_lock:
            reader = _readers.get(loc)
            if reader is None:
                con = open_reader(loc, alias)
                try:
                    copy = ShardCopy(alias, views=ALL_VIEWS)
                    copy.build(con)
                except BaseException:
                    con.close()
                    raise
                reader = _readers[loc] = (con, copy)
            cur = reader[0].cursor()
    except duckdb.Error as exc:
        raise _unreadable(loc, exc) from None
    try:
        cur.execute(f"USE {COPY}")
        reader[1].refresh(cur, texts)
    except duckdb.Error as exc:  # the catalog went away since: say so; the next read attaches afresh
        cur.close()
        forget_reader(loc)
        raise _unreadable(loc, exc) from None
    return cur


def _unreadable(loc: LakeLocation, exc: duckdb.Error) -> LakeError:
    cause = " ".join(mask_password(str(exc)).split())
    return LakeError(
        f"cannot read the lake {loc.describe()}: {cause}; is its PostgreSQL running and reachable "
        f"(`flightrec catalog status`)?"
    )


def still_to_run(loc: LakeLocation, prelude: Sequence[str]) -> tuple[str, ...]:
    """The statements of ``prelude`` that this process's reader of ``loc`` has not defined in its layout already
    (flightrec.db.lakecopy: the reader's own views are defined there once, not at every statement)."""
    with _readers_lock:
        reader = _readers.get(loc)
    ready = reader[1].ready if reader is not None else frozenset()
    return tuple(stmt for stmt in prelude if stmt not in ready)


def reader_snapshot(loc: LakeLocation) -> int | None:
    """The lake snapshot this process's reader of ``loc`` last brought its copy to (None before its first read)."""
    with _readers_lock:
        reader = _readers.get(loc)
    return reader[1].seen if reader is not None else None


def forget_reader(loc: LakeLocation) -> None:
    """Drop the shared reader of ``loc`` so that the next read attaches afresh. Not closed here: cursors other
    threads still hold keep it until they finish."""
    with _readers_lock:
        _readers.pop(loc, None)


# -- maintenance -----------------------------------------------------------------------------------------

MAINTENANCE_INTERVAL = timedelta(minutes=10)  # how often a materializer runs maintain() (docs/lake.md)
KEEP_SNAPSHOTS = timedelta(hours=1)  # snapshots younger than this stay (time travel, slow readers)
FILE_GRACE = timedelta(minutes=10)  # retired files stay this long after their snapshot expired
REWRITE_DELETED = 0.5  # a Parquet file with this share of its rows deleted (retention, a purge) is written anew
ORPHAN_GRACE = timedelta(hours=1)  # with orphans=True: a file no snapshot names goes once this old
# (younger: it may be another writer's uncommitted transaction's)


@dataclass(frozen=True)
class Maintenance:
    """What one maintain() pass did."""

    files_before: int
    files_after: int
    rows_flushed: int
    files_merged: int
    snapshots_expired: int
    files_deleted: int
    orphans_deleted: int
    conflicts_retried: int
    files_rewritten: int = 0  # files written anew without their deleted rows


def live_files(con: duckdb.DuckDBPyConnection, alias: str = "lake") -> int:
    """Parquet data files of the lake's current snapshot, all tables together."""
    return int(con.execute("SELECT coalesce(sum(file_count), 0) FROM ducklake_table_info(?)", [alias]).fetchall()[0][0])


def _seconds(delta: timedelta) -> int:
    return max(0, int(delta.total_seconds()))


def maintain(
    con: duckdb.DuckDBPyConnection,
    alias: str = "lake",
    *,
    keep_snapshots: timedelta = KEEP_SNAPSHOTS,
    file_grace: timedelta = FILE_GRACE,
    orphans: bool = False,
    orphan_grace: timedelta = ORPHAN_GRACE,
    retries: int = 8,
    rewrite_deleted: float = REWRITE_DELETED,
) -> Maintenance:
    """Compact and tidy the lake while writers keep writing; each step is its own short transaction.

    1. flush rows DuckLake inlined into the catalog (small commits) out to Parquet;
    2. write anew the files with at least ``rewrite_deleted`` of their rows deleted (retention, a purge), without
       them, and merge adjacent small Parquet files of each table into larger ones;
    3. expire snapshots older than ``keep_snapshots`` (their files become unreferenced);
    4. delete the files retired more than ``file_grace`` ago (a reader still on an old snapshot keeps them);
    5. with ``orphans``, delete orphans older than ``orphan_grace``: files under the data path no snapshot
       names, left by a transaction that never committed (a writer killed mid-commit, a commit that failed when
       the catalog went away). Off by default: DuckLake takes every file under the data path that this catalog
       does not list for an orphan, so on a folder shared by two lakes it would delete the other lake's files.

    A step that loses a commit race with a writer (DuckLake's per-table conflict check) is retried; the
    writers are never blocked or asked to stop. ``con`` must have the lake attached read-write as ``alias``.
    """
    conflicts = 0

    def step(sql: str) -> list[dict[str, Any]]:
        nonlocal conflicts
        for attempt in range(retries + 1):
            try:
                rows: list[dict[str, Any]] = con.execute(sql, [alias]).to_arrow_table().to_pylist()
                return rows
            except duckdb.Error as exc:
                if "conflict" not in str(exc).lower() or attempt == retries:
                    raise LakeError(f"lake maintenance failed in {sql.split('(')[0].split()[-1]}: {exc}") from exc
                conflicts += 1
                time.sleep(min(2.0, 0.05 * 2**attempt))
        raise AssertionError("unreachable")

    before = live_files(con, alias)
    flushed = step("FROM ducklake_flush_inlined_data(?)")
    rewritten = step(f"FROM ducklake_rewrite_data_files(?, delete_threshold => {float(rewrite_deleted)})")
    merged = step("FROM ducklake_merge_adjacent_files(?)")
    expired = step(
        f"FROM ducklake_expire_snapshots(?, older_than => now() - INTERVAL '{_seconds(keep_snapshots)} seconds')"
    )
    deleted = step(
        f"FROM ducklake_cleanup_old_files(?, older_than => now() - INTERVAL '{_seconds(file_grace)} seconds')"
    )
    deleted_orphans = (
        step(
            f"FROM ducklake_delete_orphaned_files(?, older_than => now() - INTERVAL '{_seconds(orphan_grace)} seconds')"
        )
        if orphans
        else []
    )
    result = Maintenance(
        files_before=before,
        files_after=live_files(con, alias),
        rows_flushed=sum(int(r["rows_flushed"] or 0) for r in flushed),
        files_merged=sum(int(r["files_processed"] or 0) for r in merged),
        snapshots_expired=len(expired),
        files_deleted=len(deleted),
        orphans_deleted=len(deleted_orphans),
        conflicts_retried=conflicts,
        files_rewritten=sum(int(r["files_processed"] or 0) for r in rewritten),
    )
    log.info("lake maintenance: %s", result)
    return result


def _quote(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"
