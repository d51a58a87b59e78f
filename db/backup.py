"""Backups of a database file, live or not, and their restore: one self-contained file, consistent at a commit.

``backup(db, to)`` takes what the readers read (flightrec.db.snapshot): while a materializer runs, the copy its
pointer names (``<db>.snapshots/current``) and that copy's write-ahead log, copied under a read lock on the copy
(the publisher never writes a copy someone reads; a copy taken for a newer snapshot meanwhile is let go and the
pointer read again). With no materializer running, the database file itself and its log, under a read lock on the
file (a materializer starting meanwhile waits, as it waits for readers). A file held for writing by a process that
publishes no snapshots (a materializer with ``--no-serve``, another DuckDB client) is refused, naming what to do.

The copy is made in a work folder beside the destination (``.<name>.partial-<pid>-<start>/``): its log folded
into it (DuckDB opens it and checkpoints: one file, no ``.wal``), opened read-only and checked to hold the tables
it held before the fold, row for row counted, then linked to its name (never replacing a file made there
meanwhile). A backup killed at any point leaves no file at the destination, only its work folder, which every
later backup or restore in that folder removes once the process that made it is gone.

``restore(backup, db)`` checks the backup is a flightrec database and puts it at ``db``, which must not exist: a
materializer started on it resumes at the offsets the backup holds and reads the rest from Kafka.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import duckdb
from flightrec.db import snapshot

from flightrec.errors import QueryError

POLL_S = 0.05
HELD_S = 3.0  # how long a file held for writing with no snapshot published is looked at again before refusing
_WORK = re.compile(r"^\..+\.partial-(\d+)-(\d*)$")  # a backup's or restore's work folder: its pid, its start


@dataclass(frozen=True)
class Backup:
    """What a backup holds (read back from the copy itself)."""

    path: Path
    instances: int
    events: int
    bytes: int
    live: bool  # taken from a running materializer's snapshot
    commits: int | None = None  # the database's commit number it holds


def _check_target(db: Path, to: Path) -> None:
    if to.exists():
        raise QueryError(f"{to} exists: a backup never overwrites; give a new file")
    if not to.parent.is_dir():
        raise QueryError(f"the folder {to.parent} does not exist; make it first")
    if to.absolute() == db.absolute():
        raise QueryError("the backup must be another file than the database")


def _sweep(folder: Path) -> None:
    """Remove the work folders of backups and restores whose process is gone (killed: nothing else removed them)."""
    for left in folder.iterdir():
        found = _WORK.match(left.name)
        if found and left.is_dir() and not snapshot.running(int(found[1]), found[2]):
            shutil.rmtree(left, ignore_errors=True)


@contextlib.contextmanager
def _workspace(to: Path) -> Iterator[Path]:
    """A work folder beside ``to`` (same file system: the result is linked into place), removed afterwards."""
    _sweep(to.parent)
    pid = os.getpid()
    work = to.with_name(f".{to.name}.partial-{pid}-{snapshot.process_start(pid)}")
    work.mkdir(mode=0o700)
    try:
        yield work
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _copy_out(fd: int, dst: Path) -> None:
    """Copy the whole file open at ``fd`` to the new file ``dst`` (fsync'd)."""
    out = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        snapshot.copy_range(fd, out, 0, os.fstat(fd).st_size)
        os.fsync(out)
    finally:
        os.close(out)


def _copy_locked(src: Path, dst: Path) -> bool:
    """Copy ``src`` and its write-ahead log to ``dst`` under a read lock on ``src``; False when a writer holds it.

    An open-file-description lock, which DuckDB's write lock (and the snapshot publisher's) excludes. Closing the
    descriptor drops this process's POSIX locks on ``src``: call it with no DuckDB connection of ``src`` open here."""
    fd = os.open(src, os.O_RDONLY)
    try:
        if not snapshot.ofd_lock(fd, fcntl.F_RDLCK):
            return False
        try:
            _copy_out(fd, dst)
            with contextlib.suppress(FileNotFoundError):
                wal = os.open(src.with_name(src.name + ".wal"), os.O_RDONLY)
                try:
                    if os.fstat(wal).st_size:
                        _copy_out(wal, dst.with_name(dst.name + ".wal"))
                finally:
                    os.close(wal)
        finally:
            snapshot.ofd_lock(fd, fcntl.F_UNLCK)
    finally:
        os.close(fd)
    return True


def _copy_published(db: Path, published: snapshot.Published, dst: Path) -> bool:
    """Copy the snapshot ``published`` names; False when it is no longer the current one (taken for a newer)."""
    assert published.path is not None
    try:
        fd = os.open(published.path, os.O_RDONLY)
    except FileNotFoundError:
        return False  # the materializer stopped and the copies went: read the pointer again
    try:
        if not snapshot.ofd_lock(fd, fcntl.F_RDLCK):
            return False  # the publisher writes it for a newer snapshot
        try:
            again = snapshot.current(db)
            if again is None or again.token != published.token:
                return False  # it may have been rewritten before the lock: read the pointer again
            _copy_out(fd, dst)
            wal = published.path.with_name(published.path.name + ".wal")
            if wal.exists():  # the publisher writes a copy's log only under its lock on the copy
                walfd = os.open(wal, os.O_RDONLY)
                try:
                    _copy_out(walfd, dst.with_name(dst.name + ".wal"))
                finally:
                    os.close(walfd)
        finally:
            snapshot.ofd_lock(fd, fcntl.F_UNLCK)
    finally:
        os.close(fd)
    return True


def _not_published(db: Path) -> QueryError:
    return QueryError(
        f"{db} is held for writing by a process that publishes no snapshot for readers (a materializer run with "
        "--no-serve, or another DuckDB client), and a backup copies either a snapshot or a file no one writes: "
        "restart the materializer without --no-serve (its snapshots are backed up while it runs), or stop it and "
        "run the backup again"
    )


def _take(db: Path, dst: Path, timeout: float) -> bool:
    """Copy the current snapshot of ``db`` (True) or, with no materializer running, ``db`` itself (False)."""
    deadline = time.monotonic() + timeout
    held_since: float | None = None
    while True:
        published = snapshot.current(db)
        if published is not None:
            if published.path is not None and _copy_published(db, published, dst):
                return True
            held_since = None
        elif _copy_locked(db, dst):
            return False
        elif held_since is None:
            held_since = time.monotonic()
        elif time.monotonic() - held_since > HELD_S:
            raise _not_published(db)
        for partial in (dst, dst.with_name(dst.name + ".wal")):
            partial.unlink(missing_ok=True)
        if time.monotonic() > deadline:
            raise QueryError(
                f"the materializer writing {db} published no snapshot within {timeout:g}s (it is starting, or "
                "readers hold every copy); run the backup again, or raise --timeout"
            )
        time.sleep(POLL_S)


def _table_rows(con: duckdb.DuckDBPyConnection) -> dict[str, int]:
    names = con.execute(
        "SELECT table_name FROM duckdb_tables() WHERE database_name = current_database() AND NOT internal"
    ).fetchall()
    return {n: int(con.execute(f'SELECT count(*) FROM "{n}"').fetchall()[0][0]) for (n,) in names}


def _fold(copy: Path) -> None:
    """Fold the copied write-ahead log into the copy (DuckDB replays it, CHECKPOINT writes it to the file), then open
    it read-only: the same tables with the same rows, and no log left."""
    try:
        con = duckdb.connect(str(copy))
        try:
            before = _table_rows(con)
            con.execute("CHECKPOINT")
        finally:
            con.close()
        con = duckdb.connect(str(copy), read_only=True)
        try:
            after = _table_rows(con)
        finally:
            con.close()
    except duckdb.Error as exc:
        raise QueryError(f"the copy does not open as a DuckDB database: {exc}") from exc
    if copy.with_name(copy.name + ".wal").exists() or after != before:
        raise QueryError(f"the copy did not fold its write-ahead log whole ({before} before, {after} after)")


def _place(copy: Path, to: Path) -> None:
    """Give the finished copy its name: a hard link, so a file made at ``to`` meanwhile is never replaced."""
    try:
        os.link(copy, to)
    except FileExistsError as exc:
        raise QueryError(f"{to} was made while the backup ran: a backup never overwrites; give a new file") from exc
    folder = os.open(to.parent, os.O_RDONLY)
    try:
        os.fsync(folder)
    finally:
        os.close(folder)


def _commits(path: Path) -> int | None:
    con = duckdb.connect(str(path), read_only=True)
    try:
        row = con.execute("SELECT sum(commits) FROM materializer_runs").fetchall()[0][0]
    except duckdb.Error:
        return None
    finally:
        con.close()
    return int(row) if row is not None else None


def describe(path: Path, live: bool = False) -> Backup:
    """Open a backup (or any flightrec database file) read-only and say what it holds; QueryError if it is none."""
    try:
        con = duckdb.connect(str(path), read_only=True)
    except duckdb.Error as exc:
        raise QueryError(f"{path} is not a DuckDB database: {exc}") from exc
    try:
        instances, events = con.execute(
            "SELECT (SELECT count(*) FROM instances), (SELECT count(*) FROM events_seen)"
        ).fetchall()[0]
        con.execute("SELECT max(version) FROM schema_version").fetchall()
    except duckdb.Error as exc:
        raise QueryError(f"{path} is not a flightrec database: {exc}") from exc
    finally:
        con.close()
    return Backup(path, int(instances), int(events), path.stat().st_size, live, _commits(path))


def backup(db: Path, to: Path, timeout: float = 120.0) -> Backup:
    """A consistent, self-contained copy of the database file ``db`` at ``to`` (a new file): the running
    materializer's current snapshot, or with none running the file itself."""
    db, to = db.absolute(), to.absolute()
    if not db.exists():
        raise QueryError(f"no database at {db}")
    _check_target(db, to)
    try:
        with _workspace(to) as work:
            copy = work / "backup.duckdb"
            live = _take(db, copy, timeout)
            _fold(copy)
            made = describe(copy, live)
            _place(copy, to)
    except OSError as exc:
        raise QueryError(f"cannot write the backup {to}: {exc} (nothing was left at {to})") from exc
    return Backup(to, made.instances, made.events, made.bytes, live, made.commits)


def restore(src: Path, db: Path) -> Backup:
    """Put the backup ``src`` at ``db`` (which must not exist), after checking it is a flightrec database."""
    db = db.absolute()
    found = describe(src)
    if db.exists() or db.with_name(db.name + ".wal").exists():
        raise QueryError(f"{db} exists: restore never overwrites a database; move it away first (or restore elsewhere)")
    if not db.parent.is_dir():
        raise QueryError(f"the folder {db.parent} does not exist; make it first")
    try:
        with _workspace(db) as work:
            copy = work / "restore.duckdb"
            fd = os.open(src, os.O_RDONLY)
            try:
                _copy_out(fd, copy)
            finally:
                os.close(fd)
            _place(copy, db)
    except OSError as exc:
        raise QueryError(f"cannot restore to {db}: {exc} (nothing was left at {db})") from exc
    return Backup(db, found.instances, found.events, found.bytes, False, found.commits)
