"""Files a materializer leaves beside its database file to tell readers something they cannot ask it for."""

from __future__ import annotations

import os
from pathlib import Path

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
