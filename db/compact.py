"""Compaction: a database file rewritten with only what it holds, so that the space deletes left goes back to the disk.

DuckDB reuses the blocks that deleted rows free for the rows that come next, but a file never shrinks by itself: a
retention pass over months of history, or a purge, leaves it as large as before. :func:`compact_file` is the one way
flightrec returns that space (``flightrec compact --db PATH``, and a materializer at a quiet moment:
consumers/upkeep.py): every table, view and sequence is copied into ``PATH.compacting`` (DuckDB's ``COPY FROM
DATABASE``, which keeps each column's compression), the copy's row counts are checked against the original, the
copy is synced to disk and then renamed over the original.

Safe under kills: until the rename the original is untouched and valid (a killed compaction leaves
``PATH.compacting``, removed by the next one); the rename is atomic, so the path always names a complete database.
It needs free space for the copy (about what the file keeps) and the file to itself: a writer's own compaction
closes its connection first (readers of the file's path are asked to leave, as a materializer asks them).
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

import duckdb
from flightrec.db.filestore import LockHeld, connect_giving_way

from flightrec.errors import MaterializeError

log = logging.getLogger(__name__)
SUFFIX = ".compacting"  # the copy being made, next to the database


class FileBusy(MaterializeError):
    """Another process (a materializer) holds the file: ``holder`` says who."""

    def __init__(self, message: str, holder: str) -> None:
        super().__init__(message)
        self.holder = holder


@dataclass(frozen=True)
class Compaction:
    """What one compaction did: the file's bytes before and after (its WAL included), how long it took."""

    path: Path
    bytes_before: int
    bytes_after: int
    seconds: float
    rows: int

    def summary(self) -> str:
        return (
            f"compacted {self.path}: {self.bytes_before / 2**20:.1f} MiB -> {self.bytes_after / 2**20:.1f} MiB "
            f"({self.rows:,} rows) in {self.seconds:.1f} s"
        )


def copy_path(path: Path) -> Path:
    return path.with_name(path.name + SUFFIX)


def file_bytes(path: Path) -> int:
    """The database's bytes on disk: the file and its write-ahead log."""
    total = 0
    for p in (path, Path(f"{path}.wal")):
        with contextlib.suppress(OSError):
            total += p.stat().st_size
    return total


def free_bytes(con: duckdb.DuckDBPyConnection) -> tuple[int, int]:
    """(the file's blocks in bytes, those of them free) as DuckDB counts them: what a compaction would return."""
    row = con.execute("SELECT block_size, total_blocks, free_blocks FROM pragma_database_size()").fetchone()
    if row is None:
        return 0, 0
    size, total, free = (int(v or 0) for v in row)
    return size * total, size * free


def remove_leftovers(path: Path) -> None:
    """Remove what a killed compaction left beside ``path`` (never the database itself)."""
    copy = copy_path(path)
    for p in (copy, Path(f"{copy}.wal")):
        p.unlink(missing_ok=True)


def _connect(path: Path, lock_wait: float) -> duckdb.DuckDBPyConnection:
    """The file, opened for writing; FileBusy naming the holder after ``lock_wait`` s (readers are asked to leave)."""
    try:
        return connect_giving_way(path, lock_wait, "to compact it")
    except LockHeld as held:
        raise FileBusy(f"{path} is held by {held.holder}", held.holder) from held.__cause__


def _tables(con: duckdb.DuckDBPyConnection, database: str) -> list[tuple[str, str]]:
    return [
        (str(s), str(t))
        for s, t in con.execute(
            "SELECT schema_name, table_name FROM duckdb_tables() WHERE database_name = ? AND NOT temporary",
            [database],
        ).fetchall()
    ]


def _rows(con: duckdb.DuckDBPyConnection, database: str, tables: list[tuple[str, str]]) -> dict[tuple[str, str], int]:
    def count(s: str, t: str) -> int:
        return int(con.execute(f'SELECT count(*) FROM "{database}"."{s}"."{t}"').fetchall()[0][0])

    return {(s, t): count(s, t) for s, t in tables}


def _sync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _copy(con: duckdb.DuckDBPyConnection, copy: Path, memory_limit: str) -> int:
    """Copy the database ``con`` has open into the file ``copy``; returns its rows (checked against the source)."""
    con.execute(f"SET memory_limit = '{memory_limit}'")
    con.execute("CHECKPOINT")
    source = str(con.execute("SELECT current_database()").fetchall()[0][0])
    con.execute(f"ATTACH '{str(copy).replace(chr(39), chr(39) * 2)}' AS flightrec_compacted")
    try:
        con.execute(f'COPY FROM DATABASE "{source}" TO flightrec_compacted')
        tables = _tables(con, source)
        before, after = _rows(con, source, tables), _rows(con, "flightrec_compacted", tables)
        if before != after:
            wrong = {k: (before[k], after.get(k)) for k in before if before[k] != after.get(k)}
            raise MaterializeError(f"the compacted copy's rows differ from the original's ({wrong}); nothing changed")
    finally:
        con.execute("DETACH flightrec_compacted")  # checkpoints the copy and closes it
    return sum(before.values())


def compact_file(path: str | os.PathLike[str], *, lock_wait: float = 30.0, memory_limit: str = "512MB") -> Compaction:
    """Rewrite the database file at ``path`` with only what it holds and put it in the original's place.

    Raises FileBusy when another process holds the file (a running materializer compacts by itself: see
    consumers/upkeep.py), MaterializeError for anything else; in every case the original is left as it was."""
    path = Path(path)
    if not path.is_file():
        raise MaterializeError(f"no database file at {path}")
    started = time.monotonic()
    before = file_bytes(path)
    remove_leftovers(path)
    copy = copy_path(path)
    try:
        con = _connect(path, lock_wait)
        try:
            rows = _copy(con, copy, memory_limit)
        finally:
            con.close()
        if Path(f"{path}.wal").exists() or Path(f"{copy}.wal").exists():
            raise MaterializeError(f"{path}: a write-ahead log is still there after closing; nothing changed")
        mode = path.stat()
        os.chmod(copy, mode.st_mode & 0o7777)
        with contextlib.suppress(PermissionError):
            os.chown(copy, mode.st_uid, mode.st_gid)
        _sync(copy)
        os.replace(copy, path)
        _sync(path.parent)
    except (duckdb.Error, OSError) as exc:
        raise MaterializeError(f"could not compact {path}: {exc}; the file is as it was") from exc
    finally:
        remove_leftovers(path)
    done = Compaction(path, before, file_bytes(path), time.monotonic() - started, rows)
    log.info("%s", done.summary())
    return done
