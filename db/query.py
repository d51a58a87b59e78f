"""Read-only SQL over a flightrec database, whether or not a materializer holds it.

This is the one door readers (``flightrec sql``, the dashboard, ``timeline``, ``wait-sealed``)
use. Guarantees: the statement is one a reader may run (decided by DuckDB's own
parser, see ``flightrec.db.readonly``), cannot read or write files, and returns a
pyarrow Table whose schema metadata says how fresh it is (:class:`Freshness`). Parameters
are bound, never pasted into SQL text. ``prelude`` holds temp views (checked: one
``CREATE TEMP VIEW`` each) run first on the same connection.

No read runs in the materializer's process. While a materializer runs it holds DuckDB's
write lock on the file and no other process can open it; it publishes snapshots instead
(``flightrec.db.snapshot``: complete copies of the file as of a commit, made current within
about a second of each commit), and a read opens the newest snapshot read-only in the
reader's own process. With no materializer running, a read opens the file read-only and gives
way: a materializer that cannot get the file writes ``<db>.writer-waiting``
(:func:`writer_notice_path`) and every flightrec read on the file is interrupted within
``GIVE_WAY_POLL_S`` and asked again, on the snapshots that materializer publishes.

A read given :class:`~flightrec.db.sandbox.ReadLimits` (a reader's own SQL: ``flightrec sql``, the
dashboard's console) runs in a child process bounded by the OS (``flightrec.db.sandbox``), so that
nothing it does reaches the process that asked either.

The door does not look at the kind of location: each kind has a :class:`Reader`, chosen once by the location's type
(``READERS``): :class:`FileReader` here (snapshot, file, give way, bounded child), ``LakeReader`` in
``flightrec.db.lakeread`` (on a lake every read runs in the reader's own process, on its own attachment: there is no
writer's process to keep it out of). What a read does on any connection (the checks, the bounded result, the
freshness stamp) is ``flightrec.db.statement``'s.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

import duckdb
import pyarrow as pa
from flightrec.db import snapshot
from flightrec.db.lakeread import LakeReader
from flightrec.db.location import FileLocation, LakeLocation, Location, locate
from flightrec.db.readonly import check_read_only, parse_with
from flightrec.db.sandbox import Params, ReadLimits, Retry, Target, read_apart
from flightrec.db.statement import (
    FileBusy,
    Freshness,
    ResultTooLarge,
    execute_read_only,
    last_commit,
    open_read_only,
    stamped,
)
from flightrec.db.statement import freshness as freshness  # read by every caller of run_query

from flightrec.errors import QueryError

log = logging.getLogger(__name__)
GIVE_WAY_POLL_S = 0.2  # how often a file-path read looks for a materializer waiting for the file
WRITER_START_S = 30.0  # how long a reader waits for a starting materializer's first snapshot
STARTING_S = 5.0  # how long a read retries a file it cannot open yet (a materializer may be starting)
SNAPSHOT_IDLE_S = 1.0  # a snapshot this process keeps open is closed after this long unused (its copy is freed)


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


# ---- the file, with no materializer: give way when one asks for it -----------------------------------------


class _GaveWay(Retry):
    """A file-path read was interrupted because a materializer wants the file."""

    def __init__(self, pid: int) -> None:
        super().__init__("gave_way", f"gave the file up to the materializer (pid {pid}) that asked for it")
        self.pid = pid


def _read_file(
    con: duckdb.DuckDBPyConnection,
    db: str | Path,
    sql: str,
    params: Params,
    prelude: Sequence[str],
    max_bytes: int | None = None,
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
        return execute_read_only(con, sql, params, prelude, max_bytes)
    except QueryError:
        if asked:
            raise _GaveWay(asked[0]) from None
        raise
    finally:
        done.set()
        watcher.join()


# ---- a read in a process of its own (flightrec.db.sandbox calls this in the child) -------------------------


def _limited_config(limits: ReadLimits) -> dict[str, str | int]:
    return {
        "memory_limit": f"{limits.memory // 2}B",
        "threads": max(1, limits.threads),
        "temp_directory": "",  # never spills: a reader writes nothing to the disk the writer writes
    }


def _limit_hit(exc: QueryError, limits: ReadLimits, timed_out: bool) -> QueryError:
    """The one line for a read a limit stopped (``exc`` itself when none did)."""
    cause = exc.__cause__
    if isinstance(exc, ResultTooLarge):
        return QueryError(limits.result_message())
    if timed_out:
        return QueryError(limits.time_message())
    if isinstance(cause, duckdb.OutOfMemoryException):
        return QueryError(limits.memory_message())
    return exc


def read_target(target: Target, sql: str, params: Params, prelude: Sequence[str], limits: ReadLimits) -> pa.Table:
    """One read in the bounded child (flightrec.db.sandbox): open the target read-only, run, stamp its freshness."""
    try:
        con = open_read_only(target.path, _limited_config(limits))
    except FileBusy as exc:
        raise Retry("busy", str(exc)) from None
    parse_with(con.cursor())  # the check's syntax trees on this connection: no second DuckDB in this process
    fired = threading.Event()

    def stop() -> None:
        fired.set()
        con.interrupt()

    timer = threading.Timer(limits.seconds, stop)
    timer.daemon = True
    timer.start()
    try:
        if target.kind == "file":
            table = _read_file(con, target.db, sql, params, prelude, limits.result_bytes)
        else:
            table = execute_read_only(con, sql, params, prelude, limits.result_bytes)
        commits, commit_us = last_commit(con)
    except Retry:
        raise
    except QueryError as exc:
        raise _limit_hit(exc, limits, fired.is_set()) from None
    finally:
        timer.cancel()
        con.close()
    return stamped(table, Freshness(target.kind, commits, commit_us))


# ---- snapshots this process keeps open (reads of its own SQL: the dashboard's pages, timeline, the gate) ------


class _OpenCopy:
    """A snapshot copy open read-only in this process: reused while it is the newest, closed when idle."""

    def __init__(self, path: Path, token: str) -> None:
        self.path = path
        self.token = token
        self.con = open_read_only(path)
        self.commits, self.commit_us = last_commit(self.con)
        self.users = 0
        self.used = time.monotonic()


_copies: dict[Path, _OpenCopy] = {}  # database -> its newest copy this process opened
_retired: list[_OpenCopy] = []  # copies no longer the newest, closed once their reads end
_copies_lock = threading.Lock()
_closer: threading.Thread | None = None


def _take_copy(db: Path, published: snapshot.Published) -> _OpenCopy:
    """The open copy the pointer names (FileBusy while the materializer writes it)."""
    assert published.path is not None
    with _copies_lock:
        held = _copies.get(db)
        if held is None or held.token != published.token:
            if held is not None:
                _retired.append(_copies.pop(db))
            _close_idle(time.monotonic())
            if any(h.path == published.path for h in _retired):
                # DuckDB would hand back the instance still open on that path (as of an older publish)
                raise FileBusy(f"{published.path} is still read here as of an older publish")
            held = _copies[db] = _OpenCopy(published.path, published.token)
            _start_closer()
        held.users += 1
        held.used = time.monotonic()
        return held


def _give_copy(held: _OpenCopy) -> None:
    with _copies_lock:
        held.users -= 1
        held.used = time.monotonic()
        _close_idle(time.monotonic())


def _close_idle(now: float) -> None:
    """(under the lock) Close retired copies no read uses, and kept ones unused for SNAPSHOT_IDLE_S."""
    for held in [h for h in _retired if h.users == 0]:
        _retired.remove(held)
        held.con.close()
    for db, held in list(_copies.items()):
        if held.users == 0 and now - held.used >= SNAPSHOT_IDLE_S:
            del _copies[db]
            held.con.close()


def _start_closer() -> None:
    """(under the lock) A thread that frees idle copies, so an idle reader never keeps one from the publisher."""
    global _closer
    if _closer is not None and _closer.is_alive():
        return

    def close_idle() -> None:
        while True:
            time.sleep(SNAPSHOT_IDLE_S / 2)
            with _copies_lock:
                _close_idle(time.monotonic())
                if not _copies and not _retired:
                    return

    _closer = threading.Thread(target=close_idle, name="flightrec-snapshot-closer", daemon=True)
    _closer.start()


def _read_snapshot(
    db: Path, published: snapshot.Published, sql: str, params: Params, prelude: Sequence[str]
) -> pa.Table:
    try:
        held = _take_copy(db, published)
    except FileBusy as exc:
        raise Retry("busy", str(exc)) from None
    try:
        cur = held.con.cursor()
        try:
            table = execute_read_only(cur, sql, params, prelude)
        finally:
            cur.close()
    finally:
        _give_copy(held)
    behind = snapshot.behind_s(db, held.commits or 0, held.commit_us)
    return stamped(table, Freshness("snapshot", held.commits, held.commit_us, behind))


def _read_file_here(db: Path, sql: str, params: Params, prelude: Sequence[str]) -> pa.Table:
    try:
        con = open_read_only(db)
    except FileBusy as exc:
        raise Retry("busy", str(exc)) from None
    try:
        table = _read_file(con, db, sql, params, prelude)
        commits, commit_us = last_commit(con)
    finally:
        con.close()
    return stamped(table, Freshness("file", commits, commit_us))


# ---- the one door -----------------------------------------------------------------------------------------


class Reader(Protocol):
    """How a read reaches one kind of location: :func:`run_query` asks the location's reader (READERS) and nothing
    else about where the database is. Guarantees of every reader: the statement is checked before it runs (here, or
    in the bounded child with ``limits``); the result is stamped with its :class:`Freshness`."""

    def read(self, sql: str, params: Params, prelude: Sequence[str], limits: ReadLimits | None) -> pa.Table:
        """Run one read-only statement after the ``prelude`` (temp views); ``limits``: bounded as they say, where the
        kind of location runs reads apart."""
        ...


class FileReader:
    """A DuckDB file: the newest snapshot while a materializer runs, else the file itself, read-only (given up within
    ``GIVE_WAY_POLL_S`` when a materializer asks for it; the read is then asked again, on its snapshots). With
    ``limits`` the read runs in a child process bounded by them (flightrec.db.sandbox)."""

    def __init__(self, loc: FileLocation) -> None:
        self.db = loc.path.absolute()

    def read(self, sql: str, params: Params, prelude: Sequence[str], limits: ReadLimits | None) -> pa.Table:
        if limits is None:
            check_read_only(sql)  # with limits, the child checks it
        return _read_db_file(self.db, sql, params, prelude, limits)


# The reader of each kind of location, chosen once per read by the location's type.
READERS: dict[type, Callable[[Any], Reader]] = {FileLocation: FileReader, LakeLocation: LakeReader}


def reader(loc: Location) -> Reader:
    """The reader of ``loc``."""
    return READERS[type(loc)](loc)


def run_query(
    db: str | Path | Location,
    sql: str,
    params: Params = None,
    prelude: Sequence[str] = (),
    limits: ReadLimits | None = None,
) -> pa.Table:
    """Run one read-only statement against the database and return its rows as Arrow, stamped with its freshness,
    through the reader of its kind of location (:class:`FileReader`, ``flightrec.db.lakeread.LakeReader``)."""
    return reader(locate(db)).read(sql, params, prelude, limits)


def _read_db_file(db: Path, sql: str, params: Params, prelude: Sequence[str], limits: ReadLimits | None) -> pa.Table:
    """The read on a file: a snapshot while a materializer runs, else the file; retried while that changes."""
    deadline = time.monotonic() + STARTING_S
    last = ""
    while True:
        published = snapshot.current(db)
        if published is not None:
            if published.path is not None:
                try:
                    return _snapshot_read(db, published, sql, params, prelude, limits)
                except Retry:  # the copy was taken for a newer snapshot meanwhile: the pointer names another one
                    time.sleep(0.01)
                    continue
            if last != "starting":  # a materializer is starting: its first snapshot is on its way
                deadline, last = time.monotonic() + WRITER_START_S, "starting"
        elif writer_waiting(db) is None:
            try:
                return _file_read(db, sql, params, prelude, limits)
            except Retry as exc:
                last = str(exc)
                if exc.why == "gave_way":
                    log.info("%s; reading its snapshot instead", exc)
                    deadline = time.monotonic() + WRITER_START_S
        if time.monotonic() >= deadline:
            raise QueryError(_not_readable(db, published, last))
        time.sleep(0.05 if published is not None else 0.2)


def _not_readable(db: Path, published: snapshot.Published | None, last: str) -> str:
    if published is not None:
        return (
            f"the materializer (pid {published.pid}) writing {db} has not published a snapshot for readers yet; "
            "run the query again in a moment"
        )
    waiting = writer_waiting(db)
    if waiting is not None:
        return (
            f"a materializer (pid {waiting}) is taking {db} and has not published a snapshot yet; "
            "run the query again in a moment"
        )
    if not db.exists():
        return f"no database at {db}; run `flightrec materialize --db {db}` first"
    return (
        f"{db} is held by a process that publishes no snapshots for readers (a materializer with --no-serve, "
        f"or another DuckDB client): {last}"
    )


def _snapshot_read(
    db: Path,
    published: snapshot.Published,
    sql: str,
    params: Params,
    prelude: Sequence[str],
    limits: ReadLimits | None,
) -> pa.Table:
    if limits is None:
        return _read_snapshot(db, published, sql, params, prelude)
    assert published.path is not None
    table = read_apart(read_target, Target("snapshot", published.path, db), sql, params, prelude, limits)
    fresh = freshness(table)
    commits = fresh.commits if fresh is not None else None
    commit_us = fresh.commit_us if fresh is not None else None
    return stamped(table, Freshness("snapshot", commits, commit_us, snapshot.behind_s(db, commits or 0, commit_us)))


def _file_read(db: Path, sql: str, params: Params, prelude: Sequence[str], limits: ReadLimits | None) -> pa.Table:
    if not db.exists():
        raise QueryError(f"no database at {db}; run `flightrec materialize --db {db}` first")
    if limits is None:
        return _read_file_here(db, sql, params, prelude)
    return read_apart(read_target, Target("file", db, db), sql, params, prelude, limits)
