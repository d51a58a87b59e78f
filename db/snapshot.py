"""The readers' snapshot of a database file: complete DuckDB files the materializer publishes after its commits.

While a materializer runs it holds the file (DuckDB's lock: no other process may open it), so readers read a
snapshot instead, in their own processes: one of a few copies of the file in ``<db>.snapshots/`` (``COPIES``), each
a valid, complete DuckDB file as of one commit. ``<db>.snapshots/current`` names the newest.

How a copy is made current (:meth:`Publisher.publish`, in the writer's thread, between commits): the blocks that
differ from what the copy holds are copied into it, its header last, then the write-ahead log (the commits since
DuckDB's last checkpoint, which a reader's DuckDB replays in memory when it opens the copy), and the pointer is
replaced. Only what changed since the copy was last made current is copied (a few blocks of 256 KiB per second at
today's rates, not the whole file): DuckDB never writes over a block that its last header names (that is how it
survives a crash), and every block begins with the checksum of its bytes, so the first 8 bytes of each block tell a
changed block from an unchanged one. A sample of the copied blocks is checked against its checksum again in the
copy; one that does not match (a block DuckDB was writing, not named by the header) is copied again next time, and
a checkpoint that ran during the copy (the header changed) has it made again later. Were DuckDB to change this
layout, the check would fail for every block and every publish would copy the whole file: slower, never wrong.

A copy is written only while no reader has it open: DuckDB takes a shared lock (fcntl) on a file it opens
read-only, and the publisher takes the exclusive lock without waiting; a copy a reader still reads is skipped (the
next one is taken), and a reader that finds a copy locked reads the pointer again. So the writer never waits for
a reader: with every other copy held by a long read, the publish is skipped and tried again later (readers are
told how far behind they are). A copy left half-written by a killed materializer is marked (``<copy>.partial``)
and made again from scratch at the next start.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import struct
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

log = logging.getLogger(__name__)

COPIES = 3  # copies in rotation: one current, the others free to be written while readers finish on older ones
HEADER_BYTES = 3 * 4096  # DuckDB's main header and its two database headers, before the first block
POINTER = "current"  # the file naming the newest copy
PENDING = "pending"  # the file saying since when commits wait for the next publish
_CHECKSUM_MUL = np.uint64(0xBF58476D1CE4E5B9)  # DuckDB's checksum: xor of each 8-byte word times this, xor 5381
_CHECKSUM_SEED = np.uint64(5381)
_VERIFY_BLOCKS = 8  # copied blocks read back and checked, at most, per publish


def snapshot_dir(db: str | Path) -> Path:
    """Where the copies of ``db`` and the pointer live: ``<db>.snapshots/`` next to it."""
    path = Path(db).absolute()
    return path.with_name(path.name + ".snapshots")


def block_checksums(blocks: np.ndarray) -> np.ndarray:
    """DuckDB's checksum of each block (a row of 8-byte words, the stored checksum first, not checksummed). Pure."""
    with np.errstate(over="ignore"):
        return np.bitwise_xor.reduce(blocks[:, 1:] * _CHECKSUM_MUL, axis=1) ^ _CHECKSUM_SEED


def changed_runs(new: np.ndarray, old: np.ndarray | None) -> list[tuple[int, int]]:
    """(first block, count) of every run of blocks whose checksum field differs, or that ``old`` lacks. Pure."""
    if old is None:
        return [(0, len(new))] if len(new) else []
    m = min(len(new), len(old))
    changed = np.flatnonzero(new[:m] != old[:m])
    if len(new) > m:
        changed = np.concatenate([changed, np.arange(m, len(new))])
    if not len(changed):
        return []
    breaks = np.flatnonzero(np.diff(changed) != 1)
    starts = np.concatenate([[0], breaks + 1])
    ends = np.concatenate([breaks, [len(changed) - 1]])
    return [(int(changed[s]), int(changed[e] - changed[s] + 1)) for s, e in zip(starts, ends, strict=True)]


def checksum_fields(fd: int, size: int, block: int) -> np.ndarray:
    """The stored checksum (first 8 bytes) of every whole block of the file ``fd`` of ``size`` bytes.

    Read with ``pread``, never ``mmap``: Python's mmap duplicates the descriptor and closes the duplicate, and
    closing any descriptor of the database file drops DuckDB's lock on it (POSIX locks belong to the process)."""
    n = max(0, (size - HEADER_BYTES) // block)
    raw = b"".join(os.pread(fd, 8, HEADER_BYTES + k * block) for k in range(n))
    if len(raw) != 8 * n:
        raise OSError(f"the file shrank while its blocks were read ({len(raw)} of {8 * n} bytes)")
    return np.frombuffer(raw, dtype="<u8").copy()


def process_start(pid: int) -> str:
    """A process's start time (clock ticks since boot, /proc/PID/stat): tells a pid from a later one reusing it."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    return stat.rsplit(")", 1)[-1].split()[19] if ")" in stat else ""


def running(pid: int, started: str) -> bool:
    """Whether the process ``pid`` that started at ``started`` (:func:`process_start`; "" for any) still runs."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return not started or process_start(pid) == started


@dataclass(frozen=True)
class Published:
    """What the pointer says: the newest copy (None while the materializer is starting) and who publishes."""

    path: Path | None
    commits: int  # the database's commit number that copy holds (every run's commits counted)
    pid: int
    started: str  # the materializer's process start time, against a pid reused after it died
    token: str = ""  # new at every publish: a reader keeps a copy open only while the pointer still names it

    def alive(self) -> bool:
        """Whether the materializer that wrote the pointer still runs."""
        return running(self.pid, self.started)


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def current(db: str | Path) -> Published | None:
    """The pointer of ``db``'s snapshots when the materializer that wrote it still runs, else None."""
    folder = snapshot_dir(db)
    data = _read_json(folder / POINTER)
    if data is None:
        return None
    try:
        copy = data.get("copy")
        published = Published(
            path=folder / str(copy) if copy else None,
            commits=int(data.get("commits") or 0),
            pid=int(data["pid"]),
            started=str(data.get("started") or ""),
            token=str(data.get("token") or ""),
        )
    except (KeyError, TypeError, ValueError):
        return None
    return published if published.alive() else None


def remove_copies(db: str | Path) -> int:
    """Remove the snapshot copies of ``db`` a materializer left (with their logs and marks), when none runs: they
    hold what the file held (a purge takes it out of the file; the next run copies the file whole). Returns how
    many files went."""
    if current(db) is not None:
        raise OSError(f"a materializer publishes snapshots of {db}: stop it first")
    gone = 0
    for copy in snapshot_dir(db).glob("*.duckdb*"):
        copy.unlink(missing_ok=True)
        gone += 1
    return gone


def behind_s(db: str | Path, commits: int, commit_us: int | None, now_us: int | None = None) -> float:
    """How long the oldest commit a read of a snapshot holding ``commits`` (made at ``commit_us``) does not see has
    waited to be published: 0 when it holds the materializer's latest commit."""
    now_us = time.time_ns() // 1000 if now_us is None else now_us
    folder = snapshot_dir(db)
    pointer = _read_json(folder / POINTER) or {}
    if int(pointer.get("commits") or 0) > commits and commit_us is not None:
        return max(0.0, (now_us - commit_us) / 1e6)  # a newer copy is out: at most since this one's commit
    pending = _read_json(folder / PENDING) or {}
    try:
        first, since = int(pending.get("commits") or 0), int(pending.get("since_us") or 0)
    except (TypeError, ValueError):
        return 0.0
    return max(0.0, (now_us - since) / 1e6) if first > commits and since else 0.0


def _write_json(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(json.dumps(data))
    tmp.replace(path)


def copy_range(src: int, dst: int, offset: int, length: int) -> None:
    """Copy ``length`` bytes at ``offset`` of the file ``src`` to the same offset of ``dst`` (in the kernel)."""
    while length > 0:
        n = os.copy_file_range(src, dst, length, offset, offset)
        if n <= 0:
            raise OSError(f"copy_file_range copied nothing at {offset} ({length} bytes left)")
        offset += n
        length -= n


def ofd_lock(fd: int, kind: int) -> bool:
    """Take (F_WRLCK: exclusive, F_RDLCK: shared) or drop (F_UNLCK) an open-file-description lock on the whole
    file without waiting; False when another holds a conflicting one.

    An OFD lock, not a process-associated one (``fcntl.lockf``): it conflicts with DuckDB's read lock even when a
    reader of the copy lives in this very process, and closing another descriptor of the file does not drop it."""
    flock = struct.pack("hhqqi", kind, os.SEEK_SET, 0, 0, 0)
    try:
        fcntl.fcntl(fd, fcntl.F_OFD_SETLK, flock)
    except OSError:
        return False
    return True


class Publisher:
    """Keeps ``<db>.snapshots/`` for one materializer (its writer thread only): the copies, the pointer, pending.

    ``block`` is the database's block size (DuckDB's ``pragma_database_size``). The publisher keeps one descriptor
    of the database file and of each copy open until :meth:`release`, which the store calls after DuckDB closed
    the file: closing a descriptor of a file drops every lock this process holds on it (POSIX), DuckDB's write
    lock on the database included."""

    def __init__(self, db: str | Path, block: int, copies: int = COPIES) -> None:
        self.db = Path(db).absolute()
        self.folder = snapshot_dir(self.db)
        self.block = block
        self.copies = [self.folder / f"{i}.duckdb" for i in range(copies)]
        self.pid = os.getpid()
        self.started = process_start(self.pid)
        self.current: int | None = None  # index of the copy the pointer names
        self.commits = -1  # the commit number of the current copy
        self.pending_from: int | None = None  # the first commit since the last publish, once written down
        self.copied_bytes = 0  # this run's, for the log and the tests
        self.publishes = 0
        self._used = [0] * copies  # when each copy was last made current (publish number)
        self._whole_file = False  # the block layout did not check out: copy the whole file each time
        self.folder.mkdir(exist_ok=True)
        self._src = os.open(self.db, os.O_RDONLY)
        self._fds: list[int] = []
        self._fields: list[np.ndarray | None] = []
        try:
            for copy in self.copies:
                self._fds.append(os.open(copy, os.O_RDWR | os.O_CREAT, 0o644))
                self._fields.append(self._known(copy, self._fds[-1]))
            self._pointer(None, 0)
        except BaseException:
            self.release()
            raise

    def _known(self, copy: Path, fd: int) -> np.ndarray | None:
        """The checksum fields of a copy left by an earlier run; None (and the copy emptied) when it holds nothing
        or was left half-written (``<copy>.partial``)."""
        partial = copy.with_name(copy.name + ".partial")
        try:
            if partial.exists() and ofd_lock(fd, fcntl.F_WRLCK):
                try:
                    os.ftruncate(fd, 0)
                    copy.with_name(copy.name + ".wal").unlink(missing_ok=True)
                finally:
                    ofd_lock(fd, fcntl.F_UNLCK)
                partial.unlink()
            size = os.fstat(fd).st_size
            return checksum_fields(fd, size, self.block) if size and not partial.exists() else None
        except (OSError, ValueError):
            return None

    def _pointer(self, index: int | None, commits: int) -> None:
        _write_json(
            self.folder / POINTER,
            {
                "copy": self.copies[index].name if index is not None else None,
                "commits": commits,
                "pid": self.pid,
                "started": self.started,
                "db": str(self.db),
                "published_us": time.time_ns() // 1000,
                "token": f"{self.pid}.{self.started}.{self.publishes}.{time.time_ns()}",
            },
        )

    def committed(self, commits: int, commit_us: int) -> None:
        """After each commit (``commits``: its number): the first one since the last publish is written down, so a
        reader can say how long it has waited."""
        if self.pending_from is None and commits > self.commits:
            self.pending_from = commits
            with contextlib.suppress(OSError):
                _write_json(self.folder / PENDING, {"commits": commits, "since_us": commit_us})

    def publish(self, commits: int, wrote: bool = False) -> bool:
        """Make a copy hold the file as it is now (just checkpointed, the caller's commit number ``commits``) and
        name it in the pointer. False when no copy was free (every other one is being read) or the copy failed:
        the writer goes on, the next publish tries again. ``wrote``: the file changed though no commit was counted
        (a copy is made whatever ``commits`` says)."""
        if commits == self.commits and not wrote:
            return True
        # the copy made current longest ago first (its readers are likeliest gone), one holding nothing last
        order = sorted(
            (i for i in range(len(self.copies)) if i != self.current),
            key=lambda i: (self._fields[i] is None, self._used[i]),
        )
        for i in order:
            done = self._publish_into(i)
            if done is None:
                continue  # a reader holds it
            if not done:
                return False
            self.current, self.commits, self.pending_from = i, commits, None
            self.publishes += 1
            self._used[i] = self.publishes
            self._pointer(i, commits)
            return True
        log.debug("no snapshot copy free (readers hold them); publishing later")
        return False

    def _publish_into(self, i: int) -> bool | None:
        """Copy the file into copy ``i``: True when done, None when a reader holds it, False when it failed."""
        dst = self._fds[i]
        if not ofd_lock(dst, fcntl.F_WRLCK):
            return None
        try:
            return self._copy(i, dst)
        finally:
            ofd_lock(dst, fcntl.F_UNLCK)

    def _copy(self, i: int, dst: int) -> bool:
        copy = self.copies[i]
        partial = copy.with_name(copy.name + ".partial")
        known, self._fields[i] = self._fields[i], None
        try:
            partial.touch()
            src = self._src
            header = os.pread(src, HEADER_BYTES, 0)
            size = os.fstat(src).st_size
            fields = checksum_fields(src, size, self.block)
            runs = changed_runs(fields, None if self._whole_file else known)
            for first, count in runs:
                copy_range(src, dst, HEADER_BYTES + first * self.block, count * self.block)
            os.ftruncate(dst, size)
            tail = size - HEADER_BYTES - len(fields) * self.block
            if tail > 0:  # not whole blocks: not DuckDB's layout as known here
                copy_range(src, dst, size - tail, tail)
            wal = self._copy_wal(copy)
            self._check(dst, runs, fields)
            if os.pread(src, HEADER_BYTES, 0) != header:  # a checkpoint ran meanwhile: not one state
                log.info("the database was checkpointed while its snapshot was copied; copying again later")
                return False
            os.pwrite(dst, header, 0)
            partial.unlink()
        except OSError as exc:
            log.warning(
                "cannot write the readers' snapshot %s (%s); the materializer goes on, readers see older data",
                copy,
                exc,
            )
            return False
        self.copied_bytes += sum(c for _f, c in runs) * self.block + HEADER_BYTES + wal
        self._fields[i] = fields
        return True

    def _copy_wal(self, copy: Path) -> int:
        """The database's write-ahead log (the commits since its last checkpoint) copied beside the copy, or the
        copy's removed when it has none; returns the bytes copied. A reader's DuckDB replays it at open (in memory:
        the files stay as they are)."""
        theirs = copy.with_name(copy.name + ".wal")
        try:
            src = os.open(self.db.with_name(self.db.name + ".wal"), os.O_RDONLY)
        except FileNotFoundError:
            theirs.unlink(missing_ok=True)
            return 0
        try:
            size = os.fstat(src).st_size
            if size == 0:
                theirs.unlink(missing_ok=True)
                return 0
            dst = os.open(theirs, os.O_WRONLY | os.O_CREAT, 0o644)
            try:
                copy_range(src, dst, 0, size)
                os.ftruncate(dst, size)
            finally:
                os.close(dst)
        finally:
            os.close(src)
        return size

    def _check(self, dst: int, runs: list[tuple[int, int]], fields: np.ndarray) -> None:
        """Read a few copied blocks back (the first of each run, up to ``_VERIFY_BLOCKS``): one whose bytes do not
        match its checksum gets a field no block has, so it is copied again next time (``fields`` is updated). When
        none of several matches, this is not DuckDB's layout as flightrec knows it: whole files from then on."""
        words = self.block // 8
        sample = [first for first, _count in runs][:_VERIFY_BLOCKS]
        bad = 0
        for k in sample:
            data = os.pread(dst, self.block, HEADER_BYTES + k * self.block)
            if len(data) < self.block:
                fields[k] = ~fields[k]
                bad += 1
                continue
            block = np.frombuffer(data, dtype="<u8").reshape(1, words)
            if block_checksums(block)[0] != block[0, 0]:
                fields[k] = ~fields[k]
                bad += 1
        if len(sample) >= 4 and bad == len(sample) and not self._whole_file:
            self._whole_file = True
            log.warning(
                "no block of %s matched DuckDB's block checksum as flightrec reads it: the readers' snapshots are "
                "copied whole from now on (correct, slower); is this a DuckDB flightrec does not know?",
                self.db,
            )

    def follow(self, block: int) -> bool:
        """After the store opened the database again (a compaction, a full disk): when the path now names another
        file (a compaction renamed its copy over it), read that one from now on and forget what every copy was known
        to hold, so that the next publish copies the new file whole; returns whether it was replaced.

        Compares ``os.stat`` of the path with ``os.fstat`` of the descriptor held: opening and closing the live file
        to look would drop DuckDB's write lock (closing any descriptor of a file drops the process's locks on it).
        The old descriptor is closed after the new one is open: it is the replaced file's, whose locks are nobody's."""
        now, held = os.stat(self.db), os.fstat(self._src)
        if (now.st_dev, now.st_ino) == (held.st_dev, held.st_ino) and block == self.block:
            return False
        src = os.open(self.db, os.O_RDONLY)
        os.close(self._src)
        self._src, self.block = src, block
        self._fields = [None] * len(self._fields)
        return True

    def close(self) -> None:
        """The materializer stops: readers read the file itself from now on (the copies stay for the next run).
        Call :meth:`release` once DuckDB has closed the file."""
        for name in (POINTER, PENDING):
            with contextlib.suppress(OSError):
                (self.folder / name).unlink()

    def release(self) -> None:
        """Close the descriptors (after DuckDB closed the database: see the class)."""
        for fd in [self._src, *self._fds]:
            with contextlib.suppress(OSError):
                os.close(fd)
        self._fds = []
