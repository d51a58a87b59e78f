"""Backups of a database file, live or not, and their restore: one consistent file, at a commit.

``backup(db, to)`` is the one door (the readers' snapshot of the readers-apart work can take its place: it is the
same thing, a consistent copy of the file at a commit). While a materializer holds the file, the copy is made by
the materializer itself, in its writer thread between two commits: it checkpoints (the WAL folded into the file)
and copies the file's bytes, with no commit of its own in between; only its alert sender may commit meanwhile,
small updates that go to the WAL, not the file. The command asks for it with a request file beside the database
(``<db>.backup-request-<id>``) and waits for the answer (``<db>.backup-done-<id>``). With no materializer, the
command holds the file read-only (a materializer starting meanwhile waits) and copies it, its WAL folded in.

``restore(backup, db)`` checks the backup is a flightrec database and puts it at ``db``, which must not exist: a
materializer started on it resumes at the offsets the backup holds and reads the rest from Kafka.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import duckdb

from flightrec.errors import QueryError

REQUEST = ".backup-request-"
DONE = ".backup-done-"
POLL_S = 0.1


@dataclass(frozen=True)
class Backup:
    """What a backup holds (read back from the copy itself)."""

    path: Path
    instances: int
    events: int
    bytes: int
    live: bool  # made by a running materializer


def _request_path(db: Path, rid: str) -> Path:
    return db.with_name(db.name + REQUEST + rid)


def _done_path(db: Path, rid: str) -> Path:
    return db.with_name(db.name + DONE + rid)


def _check_target(db: Path, to: Path) -> None:
    if to.exists():
        raise QueryError(f"{to} exists: a backup never overwrites; give a new file")
    if not to.parent.is_dir():
        raise QueryError(f"the folder {to.parent} does not exist; make it first")
    if to.absolute() == db.absolute():
        raise QueryError("the backup must be another file than the database")


def copy_file(src: Path, to: Path) -> None:
    """Copy ``src``'s bytes to ``to`` through a partial file renamed at the end (fsync'd): ``to`` appears whole.

    The copy is made by a child process (cp): DuckDB holds its file with a POSIX (fcntl) lock, which the kernel
    drops as soon as the holding process closes *any* descriptor of that file, so the materializer must never
    open and close its own database file (a read here once released its lock to every other process)."""
    partial = to.with_name(to.name + ".partial")
    if partial.exists():
        raise FileExistsError(f"{partial} exists (another backup to the same file under way?)")
    subprocess.run(["cp", "--", str(src), str(partial)], check=True, capture_output=True, timeout=3600)
    fd = os.open(partial, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        os.link(partial, to)  # not rename: a file made at ``to`` meanwhile is never replaced
    finally:
        partial.unlink(missing_ok=True)


def checkpoint_and_copy(con: duckdb.DuckDBPyConnection, src: Path, to: Path) -> bool:
    """The live copy (the materializer's writer thread, between commits): fold the WAL into the file and copy it;
    where DuckDB will not checkpoint now (a transaction of another thread under way), copy the file and its WAL
    as they are (no commit of the writer comes in between) for the asker to fold. True when the WAL was copied."""
    with contextlib.suppress(duckdb.TransactionException):
        con.execute("CHECKPOINT")
    wal = src.with_name(src.name + ".wal")
    copy_file(src, to)
    if wal.exists():
        copy_file(wal, to.with_name(to.name + ".wal"))
        return True
    return False


def fold_wal(path: Path) -> None:
    """Fold a copied WAL into its database file (in the asking process: the copy is its own file)."""
    if path.with_name(path.name + ".wal").exists():
        con = duckdb.connect(str(path))
        try:
            con.execute("CHECKPOINT")
        finally:
            con.close()


def serve_requests(con: duckdb.DuckDBPyConnection, db: Path) -> int:
    """Answer the backup requests beside ``db`` (the materializer's writer thread); how many were answered."""
    served = 0
    for req in sorted(db.parent.glob(db.name + REQUEST + "*")):
        rid = req.name[len(db.name + REQUEST) :]
        try:
            if req.stat().st_uid != os.getuid():  # only this user's requests: a copy goes where the asker says
                continue
        except OSError:
            continue
        try:
            to = Path(json.loads(req.read_text())["to"])
            _check_target(db, to)
            answer: dict[str, object] = {"ok": True, "wal": checkpoint_and_copy(con, db, to)}
        except (OSError, ValueError, KeyError, duckdb.Error, QueryError, subprocess.SubprocessError) as exc:
            answer = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        with contextlib.suppress(OSError):
            _done_path(db, rid).write_text(json.dumps(answer))
            req.unlink()
        served += 1
    return served


def _held(db: Path) -> bool:
    """Whether another process holds the file for writing (a materializer)."""
    try:
        duckdb.connect(str(db), read_only=True).close()
    except duckdb.IOException as exc:
        if "lock" in str(exc).lower():
            return True
        raise QueryError(f"{db} is not a DuckDB database flightrec can read: {exc}") from exc
    return False


def _ask_materializer(db: Path, to: Path, timeout: float) -> None:
    rid = uuid.uuid4().hex[:12]
    req, done = _request_path(db, rid), _done_path(db, rid)
    req.write_text(json.dumps({"to": str(to.absolute()), "pid": os.getpid()}))
    deadline = time.monotonic() + timeout
    try:
        while not done.exists():
            if time.monotonic() > deadline:
                raise QueryError(
                    f"the materializer holding {db} did not answer the backup request within {timeout:g}s "
                    "(a flightrec older than the backups?); stop it and run the backup again, or raise --timeout"
                )
            time.sleep(POLL_S)
        answer = json.loads(done.read_text() or "{}")
    finally:
        req.unlink(missing_ok=True)
        done.unlink(missing_ok=True)
    if not answer.get("ok"):
        raise QueryError(f"the materializer could not back {db} up: {answer.get('error')}")
    fold_wal(to)


def _copy_offline(db: Path, to: Path) -> None:
    """No materializer: hold the file read-only while copying it (and its WAL), then fold the WAL into the copy."""
    holder = duckdb.connect(str(db), read_only=True)  # a materializer starting now waits for this
    try:
        wal = db.with_name(db.name + ".wal")
        copy_file(db, to)
        if wal.exists():
            copy_file(wal, to.with_name(to.name + ".wal"))
    finally:
        holder.close()
    fold_wal(to)


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
    return Backup(path, int(instances), int(events), path.stat().st_size, live)


def backup(db: Path, to: Path, timeout: float = 120.0) -> Backup:
    """A consistent copy of the database file ``db`` at ``to`` (a new file), whether a materializer holds it or not."""
    if not db.exists():
        raise QueryError(f"no database at {db}")
    _check_target(db, to)
    live = _held(db)
    if live:
        _ask_materializer(db, to, timeout)
    else:
        _copy_offline(db, to)
    return describe(to, live)


def restore(src: Path, db: Path) -> Backup:
    """Put the backup ``src`` at ``db`` (which must not exist), after checking it is a flightrec database."""
    found = describe(src)
    if db.exists() or db.with_name(db.name + ".wal").exists():
        raise QueryError(f"{db} exists: restore never overwrites a database; move it away first (or restore elsewhere)")
    if not db.parent.is_dir():
        raise QueryError(f"the folder {db.parent} does not exist; make it first")
    copy_file(src, db)
    return Backup(db, found.instances, found.events, found.bytes, False)
