"""Read-only SQL over a flightrec database, whether or not a materializer holds it.

This is the one door readers (``flightrec sql``, the dashboard, ``timeline``)
use. Guarantees: the statement is one a reader may run (decided by DuckDB's own
parser, see ``flightrec.db.readonly``), cannot read or write files, and returns a
pyarrow Table. Parameters are bound,
never pasted into SQL text. ``prelude`` holds temp views (checked: one
``CREATE TEMP VIEW`` each) run first on the same connection.

While a materializer runs it holds DuckDB's write lock and no other process can
open the file; it then serves queries on a Unix socket next to the database
(Arrow Flight, see ``flightrec.db.live`` for the protocol both sides share and
``flightrec.db.serve`` for the server), answering from a snapshot of its
last commit. ``run_query`` asks that socket first
and opens the file read-only when nobody answers. A read on the file gives
way: a materializer that cannot get the file writes ``<db>.writer-waiting``
(:func:`writer_notice_path`) and every flightrec read on the file is
interrupted within ``GIVE_WAY_POLL_S`` and asked again live.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import duckdb
import pyarrow as pa
from flightrec.db.lake import (
    LakeLocation,
    forget_reader,
    is_catalog_away,
    mask_password,
    reader_cursor,
    still_to_run,
)
from flightrec.db.live import Params, query_live
from flightrec.db.location import Location, locate
from flightrec.db.readonly import check_prelude, check_read_only

from flightrec.errors import QueryError

log = logging.getLogger(__name__)
GIVE_WAY_POLL_S = 0.2  # how often a file-path read looks for a materializer waiting for the file
WRITER_START_S = 30.0  # how long a reader that gave way waits for that materializer's socket
STARTING_S = 5.0  # how long a read retries a file it cannot open yet (a materializer may be starting)
# The file path's own DuckDB instance: no files, no extensions, no Python objects, settings locked
# (after the time zone: the views' TIMESTAMPTZ columns come out in UTC whatever the machine's zone,
# as the dashboard says; DuckDB takes TimeZone only as a SET, not in the connect config).
READER_CONFIG = {
    "enable_external_access": False,
    "autoload_known_extensions": False,
    "autoinstall_known_extensions": False,
    "python_enable_replacements": False,
    "lock_configuration": True,
}
READER_TIME_ZONE = "UTC"


def writer_notice_path(db: str | Path) -> Path:
    """Where a materializer waiting for the file says so (``<db>.writer-waiting``, holding its pid)."""
    path = Path(db).absolute()
    return path.with_name(path.name + ".writer-waiting")


def writer_waiting(db: str | Path) -> int | None:
    """The pid of a live materializer waiting to open ``db`` for writing, or None."""
    try:
        pid = int(writer_notice_path(db).read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None  # a notice left by a materializer killed while it waited
    except PermissionError:
        pass
    return pid


class _GaveWay(Exception):
    """A file-path read was interrupted because a materializer wants the file."""


def _read_file(
    con: duckdb.DuckDBPyConnection, db: str | Path, sql: str, params: Params, prelude: Sequence[str]
) -> pa.Table:
    """Run the read on the file, interrupting it as soon as a materializer asks for the file."""
    done = threading.Event()
    asked: list[int] = []

    def watch() -> None:
        while not done.wait(GIVE_WAY_POLL_S):
            pid = writer_waiting(db)
            if pid is not None:
                asked.append(pid)
                con.interrupt()
                return

    watcher = threading.Thread(target=watch, name="flightrec-give-way", daemon=True)
    watcher.start()
    try:
        return execute_read_only(con, sql, params, prelude)
    except QueryError:
        if asked:
            raise _GaveWay(asked[0]) from None
        raise
    finally:
        done.set()
        watcher.join()


def open_read_only(db: str | Path) -> duckdb.DuckDBPyConnection:
    """Open the database file read-only with file access disabled."""
    path = Path(db)
    if not path.exists():
        raise QueryError(f"no database at {path}; run `flightrec materialize --db {path}` first")
    try:
        con = duckdb.connect(
            str(path), read_only=True, config={k: v for k, v in READER_CONFIG.items() if k != "lock_configuration"}
        )
    except duckdb.IOException as exc:
        raise QueryError(
            f"{path} is held by another process and it serves no queries: {exc}"
            if "lock" in str(exc).lower()
            else f"{path} is not a DuckDB database flightrec can read (check --db): {exc}"
        ) from exc
    try:  # another open connection of this process to the file shares its instance, already set and locked
        locked, zone = con.execute(
            "SELECT current_setting('lock_configuration'), current_setting('TimeZone')"
        ).fetchone()  # type: ignore[misc]  # a SELECT without FROM returns one row
        if not locked:
            if zone != READER_TIME_ZONE:
                con.execute(f"SET GLOBAL TimeZone = '{READER_TIME_ZONE}'")
            con.execute("SET lock_configuration = true")
    except BaseException:
        con.close()
        raise
    return con


class ResultTooLarge(QueryError):
    """A read's result passed the bytes a reader may have built for it."""


def execute_read_only(
    con: duckdb.DuckDBPyConnection,
    sql: str,
    params: Params = None,
    prelude: Sequence[str] = (),
    max_bytes: int | None = None,
) -> pa.Table:
    """Run the checked ``prelude`` statements (temp views), then the checked user statement.

    ``max_bytes``: the result is built batch by batch and given up (ResultTooLarge) once it holds more
    (a result lives outside DuckDB's memory limit).
    """
    check_read_only(sql)
    for stmt in prelude:
        check_prelude(stmt)
    try:
        for stmt in prelude:
            con.execute(stmt)
    except duckdb.BinderException as exc:  # a view names a column the file's tables do not have (yet)
        raise QueryError(
            f"the readers' views do not fit the tables of this database ({' '.join(str(exc).split())}): "
            "it was probably written by an older flightrec; a materializer adds the new columns when it "
            "opens it (`flightrec materialize --db …`)"
        ) from exc
    except duckdb.Error as exc:
        raise QueryError(f"{type(exc).__name__}: {exc}") from exc
    try:
        rel = con.sql(sql, params=params) if params else con.sql(sql)
        if rel is None:
            return pa.table({})
        if max_bytes is None:
            return rel.to_arrow_table()
        reader = rel.to_arrow_reader(1 << 16)
        batches, size = [], 0
        for batch in reader:
            size += batch.nbytes
            if size > max_bytes:
                raise ResultTooLarge(f"its result passed {max_bytes >> 20} MiB")
            batches.append(batch)
        return pa.Table.from_batches(batches, schema=reader.schema)
    except duckdb.Error as exc:
        raise QueryError(f"{type(exc).__name__}: {exc}") from exc


def run_query(db: str | Path | Location, sql: str, params: Params = None, prelude: Sequence[str] = ()) -> pa.Table:
    """Run one read-only statement against the database and return its rows as Arrow.

    Live through the materializer's socket when one serves ``db``; else on the file, read-only,
    giving the file up within ``GIVE_WAY_POLL_S`` when a materializer asks for it (then the
    read is asked again, live, once that materializer serves).
    """
    check_read_only(sql)
    loc = locate(db)
    if isinstance(loc, LakeLocation):
        return _read_lake(loc, sql, params, prelude)
    db = loc.path
    deadline = time.monotonic() + STARTING_S
    while True:
        live = query_live(db, sql, params, prelude)
        if live is not None:
            return live
        waiting = writer_waiting(db)
        if waiting is not None:
            if time.monotonic() < deadline:
                time.sleep(0.2)
                continue
            raise QueryError(
                f"a materializer (pid {waiting}) is taking {db} and does not serve yet; "
                "run the query again in a moment (it will be answered live)"
            )
        try:
            con = open_read_only(db)
        except QueryError:
            # A materializer may be starting (lock taken, socket not yet up): retry briefly.
            if time.monotonic() < deadline and Path(db).exists():
                time.sleep(0.2)
                continue
            raise
        try:
            return _read_file(con, db, sql, params, prelude)
        except _GaveWay as exc:
            log.info("gave %s up to the materializer (pid %s) that asked for it; asking it instead", db, exc)
            deadline = time.monotonic() + WRITER_START_S
        finally:
            con.close()


def _read_lake(loc: LakeLocation, sql: str, params: Params, prelude: Sequence[str]) -> pa.Table:
    """Run the read on this process's locked-down read-only attachment of the lake (flightrec.db.lake)."""
    cur = reader_cursor(loc, texts=(sql, *prelude))
    try:
        return execute_read_only(cur, sql, params, still_to_run(loc, prelude))
    except QueryError as exc:
        if is_catalog_away(exc):  # the next read attaches afresh
            forget_reader(loc)
        hint = ""
        if "does not exist" in str(exc) and not _lake_has_tables(cur):
            hint = (
                f"; the lake holds no tables yet: a materializer makes them when it starts "
                f"(`flightrec materialize --db '{loc.describe()}' --data-path DIR`)"
            )
        raise QueryError(mask_password(str(exc)) + hint) from None
    finally:
        cur.close()


def _lake_has_tables(cur: duckdb.DuckDBPyConnection) -> bool:
    try:
        return bool(cur.execute("SELECT count(*) FROM duckdb_tables() WHERE database_name = 'lake'").fetchall()[0][0])
    except duckdb.Error:
        return True  # cannot tell: no hint
