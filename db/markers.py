"""What a materializer leaves to tell others something they cannot ask it for: files beside its database file, and
on a lake (which has no file to put one beside) a row of its own."""

from __future__ import annotations

import os
from pathlib import Path

import duckdb

DISK_FULL_SUFFIX = ".disk-full"
REPLAYING_SUFFIX = ".replaying"


def disk_full_path(db: str | os.PathLike[str]) -> Path:
    """The empty file beside a database file that says its materializer waits for disk space (consumers/diskfull.py;
    an empty file needs no data block, so it can be made on a full disk). Its time is when the wait began."""
    return Path(f"{os.fspath(db)}{DISK_FULL_SUFFIX}")


def disk_full_since_us(db: str | os.PathLike[str]) -> int | None:
    """When the materializer of a database file began to wait for disk space (its marker's time, Unix µs); None when
    it does not wait (no marker) or ``db`` is no file (a lake's string)."""
    if str(db).startswith("ducklake:"):
        return None
    try:
        return disk_full_path(db).stat().st_mtime_ns // 1000
    except OSError:
        return None


def replaying_path(db: str | os.PathLike[str]) -> Path:
    """The empty file beside a database file that a replay makes before the file and takes away once it reached the
    end offsets it set out for: while it is there, the file holds part of the topics only (db/store.py refuses to
    open it as if it were whole)."""
    return Path(f"{os.fspath(db)}{REPLAYING_SUFFIX}")


def unfinished_replay(db: str | os.PathLike[str]) -> str:
    """What a database file left by a replay that did not finish is, and what to do (an error's message)."""
    wal = f"{os.fspath(db)}.wal"
    return (
        f"{os.fspath(db)} is a replay that did not finish (stopped before the end offsets it set out for: a full "
        f"disk, a signal, a kill): it holds part of the topics only. Delete it ({os.fspath(db)}, {wal} and "
        f"{replaying_path(db)}) and replay again, or replay into another --db; nothing is lost (the topics and the "
        "archive still hold every event)"
    )


# A lake's replay marker: one row per replay under way, made before its first event and deleted once it reached the
# end offsets it set out for (in the lake's transactions: LakeStore.transaction).
LAKE_REPLAYS_DDL = "CREATE TABLE IF NOT EXISTS main.replays_unfinished (run_id VARCHAR, started_us BIGINT)"


def lake_replay_begins(con: duckdb.DuckDBPyConnection, run_id: str, started_us: int) -> None:
    """Mark the lake as being built by the replay ``run_id`` (before it writes any event; the lake holds none, so
    the row of an earlier replay stopped before its first commit is let go)."""
    con.execute(LAKE_REPLAYS_DDL)
    con.execute("DELETE FROM main.replays_unfinished")
    con.execute("INSERT INTO main.replays_unfinished VALUES (?, ?)", [run_id, started_us])


def lake_replay_ends(con: duckdb.DuckDBPyConnection, run_id: str) -> None:
    """The replay ``run_id`` reached its end offsets: the lake is whole."""
    con.execute(LAKE_REPLAYS_DDL)
    con.execute("DELETE FROM main.replays_unfinished WHERE run_id = ?", [run_id])


def lake_replay_unfinished(con: duckdb.DuckDBPyConnection) -> int | None:
    """When a replay that has not finished (stopped, killed, or still running) began building the lake (Unix µs);
    None when none did."""
    con.execute(LAKE_REPLAYS_DDL)
    row = con.execute("SELECT min(started_us) FROM main.replays_unfinished").fetchone()
    return None if row is None else row[0]


def unfinished_lake_replay(where: str) -> str:
    """What a lake left by a replay that did not finish is, and what to do (an error's message)."""
    return (
        f"the lake {where} is a replay that did not finish (stopped before the end offsets it set out for: a full "
        "disk, a signal, a kill; or it still runs): it holds part of the topics only. Replay again into a new lake "
        "(`flightrec catalog` makes one per --db string) and point the readers at it; nothing is lost (the topics "
        "and the archive still hold every event)"
    )
