"""The durable spool: append-only segment files holding every event until Kafka acknowledged it.

Layout of one instance's folder (``<spool>/<quoted instance id>/``):

* ``NNNNNNNNNNNN.seg`` - segments. Each starts with a header (magic, then a JSON
  line: instance id, boot id, kernel boot id, first seq) and holds framed records
  ``u32 body length | u32 crc32(body) | body``, body = ``i64 seq | u8 flags |
  u16 topic length | topic | Avro message``. The newest segment is the truth for
  the boot id and the next seq: a process that takes the lock re-reads whatever
  other processes appended since it last looked.
* ``lock`` - an fcntl lock held while a seq is assigned and its record written, so
  concurrent agent invocations of one instance share one gap-free seq.
* ``deliver.lock`` - held by the one process that currently ships the spool.
* ``cursor`` - how far Kafka acknowledged (segment, offset); segments before it
  are deleted.
* ``once-<boot>-<name>`` - markers for events sent once per boot (instance facts).
* ``reserve`` - room kept on the disk: when the disk is full, it is given up so that a
  stage's exit, its end and the note of what was lost can still be written.

Every file of the folder, these and those the other parts of the agent keep there (members, follow claims, the
late-output state, the sender's), is named by :class:`~flightrec.producer.spoolfolder.SpoolFolder` (``Spool.files``):
no other module joins a path to the folder.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import threading
import time
import uuid
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, TypeVar

from flightrec.producer.names import instance_dir, safe_name  # noqa: F401 (re-exported)
from flightrec.producer.segment import (
    BODY,
    REC,
    SEG_MAGIC,
    Position,
    Record,  # noqa: F401 - SEG_MAGIC, Position, Record: re-exported
    iter_records,
    read_records,
)
from flightrec.producer.segment import parse_header as _parse_header
from flightrec.producer.spoolfolder import SpoolFolder
from flightrec.producer.syncer import Syncer
from flightrec.schemas import Event, EventT, LogBatch, Sealed, default_codec, now_us

from flightrec.errors import SpoolError

log = logging.getLogger(__name__)

FLAG_SEALED = 1
DEFAULT_ROTATE_BYTES = 8 * 1024 * 1024
_KERNEL_BOOT_ID = "/proc/sys/kernel/random/boot_id"
RESERVE_BYTES = 256 * 1024
SYNC_WINDOW_S = 0.1  # group commit: log batches written with sync=False are fdatasync'd at most this long after
_NO_ROOM = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)

Maker = Callable[[str, int], Event]  # (boot_id, seq) -> the event
T = TypeVar("T")


def kernel_boot_id() -> str:
    """The running kernel's boot id (new at every machine boot); empty where there is none."""
    try:
        with open(_KERNEL_BOOT_ID) as f:
            return f.read().strip()
    except OSError:
        return ""


@dataclass
class _Head:
    seg: int
    offset: int  # committed end of the active segment
    header_len: int
    boot_id: str
    kernel_boot: str
    next_seq: int
    sealed: bool
    instance_id: str


class SpoolWriteError(SpoolError):
    """Events that were built but could not be written to the spool (``events``), and why (``reason``)."""

    def __init__(self, reason: str, events: Sequence[Event]) -> None:
        super().__init__(f"{reason}; free disk space or set FLIGHTREC_SPOOL to a writable folder")
        self.reason = reason
        self.events = list(events)


class BootSealedError(SpoolWriteError):
    """Events of a stage that still ran when its boot was sealed: the seal names the stage; they are not noted."""


def built_for_counting(makers: Sequence[Callable[[str, int], EventT]], boot_id: str) -> list[EventT]:
    """The events the makers would have spooled (seq -1: never written), to count what was lost."""
    out: list[EventT] = []
    for make in makers:
        try:
            out.append(make(boot_id, -1))
        except Exception:  # noqa: BLE001 - only counting: an event that cannot even be built counts as one
            log.debug("an event that was not spooled could not be built for counting", exc_info=True)
    return out


class AnySpool(Protocol):
    """What the agent asks of a spool: :class:`Spool`, or ``LostSpool`` (flightrec.producer.lost) where none could be
    created (every append then raises SpoolWriteError with what was lost). Only a :class:`Spool` is delivered, holds
    members and late output."""

    instance_id: str
    files: SpoolFolder  # the folder's files by name (of a LostSpool: where they would have been)
    dir: Path  # where the folder is (or would have been): named in messages
    events_spooled: int

    @property
    def dirty(self) -> bool: ...

    def boot(self) -> tuple[str, int]: ...

    def sent_once(self, boot_id: str, name: str) -> bool: ...

    def append(
        self,
        makers: Sequence[Callable[[str, int], EventT]],
        *,
        once: str | None = None,
        encode: Callable[[Event], bytes] | None = None,
        sync: bool = True,
        boot: str | None = None,
    ) -> list[EventT]: ...

    def committed_end(self) -> Position: ...

    def load_cursor(self) -> Position: ...

    def pending(self) -> int: ...

    def sync(self) -> None: ...

    def sync_due(self) -> None: ...

    def close(self) -> None: ...


class Spool:
    """One instance's durable spool; safe for many threads and many processes at once.

    Guarantees: :meth:`append` returns only after its records are written (and
    fdatasync'd when ``fsync``; with ``sync=False`` - log batches - group commit: one
    fdatasync for all of them, started within SYNC_WINDOW_S by the next append (in a
    syncer thread: the writer does not wait), :meth:`sync_due`, :meth:`sync` or
    :meth:`close`; any other append's fdatasync covers them too),
    with seqs taken gap-free from the boot's counter under
    an fcntl lock; a boot ends at a sealed event or a kernel reboot, and the next
    append starts a new boot (new boot id, seq 0); a torn record left by a crash is
    cut off by the next process that takes the lock; nothing is removed before
    :meth:`save_cursor` says Kafka acknowledged it.
    """

    def __init__(
        self,
        root: str | Path,
        instance_id: str,
        *,
        fsync: bool = True,
        rotate_bytes: int = DEFAULT_ROTATE_BYTES,
        new_boot: bool = False,
    ) -> None:
        if not instance_id:
            raise SpoolError("an instance id is needed: pass --instance or set FLIGHTREC_INSTANCE")
        self.instance_id = instance_id
        self.key = instance_id.encode("utf-8")
        self.files = SpoolFolder.of(root, instance_id)  # every file of the folder, by name
        self.dir = self.files.path
        self.fsync = fsync
        self.rotate_bytes = rotate_bytes
        self._force_new_boot = new_boot
        self._tlock = threading.Lock()
        self._head: _Head | None = None
        self._fd: int | None = None
        self._fd_seg = -1
        self._dirty_since: float | None = None  # written, not yet fdatasync'd (group commit), since
        self._syncs = 0  # fdatasyncs of records done in the writing threads
        self._syncer = Syncer(str(self.dir))
        self.events_spooled = 0
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            self._lock_fd = os.open(self.files.lock, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise SpoolError(
                f"cannot use the spool folder {self.dir}: {exc}; set FLIGHTREC_SPOOL to a writable folder"
            ) from exc
        self._codec = default_codec()
        self._held: dict[str, int] = {}  # boots that stages of this process take part in (producer.members)
        self._reserve_given_up = False
        self._keep_reserve()

    def _keep_reserve(self) -> None:
        """Hold RESERVE_BYTES of disk in ``reserve`` (where the disk has the room; quietly not otherwise)."""
        path = self.files.reserve
        try:
            if path.exists() and path.stat().st_size >= RESERVE_BYTES:
                return
            fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
            try:
                os.posix_fallocate(fd, 0, RESERVE_BYTES)
            finally:
                os.close(fd)
        except OSError as exc:
            log.debug("no disk reserve in %s: %s", self.dir, exc)

    def _give_up_reserve(self) -> bool:
        """The disk is full: free the reserve for the events that must be written; False if there was none."""
        try:
            self.files.reserve.unlink()
        except OSError:
            return False
        self._reserve_given_up = True
        log.warning("spool %s: the disk is full; the reserve is given up for exits and ends of stages", self.dir)
        return True

    def _room_for_lines(self) -> bool:
        """Once the reserve was given up, log lines are written only where the disk has room again."""
        if not self._reserve_given_up:
            return True
        try:
            st = os.statvfs(self.dir)
        except OSError:
            return False
        return st.f_bavail * st.f_frsize > 2 * RESERVE_BYTES

    # -- locking and recovery ---------------------------------------------

    def _lock(self) -> None:
        fcntl.flock(self._lock_fd, fcntl.LOCK_EX)

    def _unlock(self) -> None:
        fcntl.flock(self._lock_fd, fcntl.LOCK_UN)

    def segments(self) -> list[int]:
        """Numbers of the segment files present, oldest first."""
        return self.files.segment_numbers()

    def _path(self, n: int) -> Path:
        return self.files.segment(n)

    def _recover(self) -> _Head | None:
        """Under the lock: the newest segment's state, reading what others appended since we looked."""
        segs = self.segments()
        if not segs:
            self._head = None
            return None
        n = segs[-1]
        path = self._path(n)
        size = path.stat().st_size
        head = self._head
        if head is not None and head.seg == n and head.offset == size:
            return head
        with open(path, "rb") as f:
            data = f.read()
        header, header_len = _parse_header(data, path)
        if head is not None and head.seg == n and head.offset <= len(data):
            start, next_seq, sealed = head.offset, head.next_seq, head.sealed
        else:
            start, next_seq, sealed = header_len, int(header["first_seq"]), False
        end = start
        for record_end, seq, flags, _topic, _value in iter_records(data, start):
            end = record_end
            next_seq = seq + 1
            sealed = bool(flags & FLAG_SEALED)
        if end < len(data):
            log.warning("spool %s: cutting %d bytes of a torn record left by a crash", path, len(data) - end)
            with open(path, "r+b") as f:
                f.truncate(end)
                os.fsync(f.fileno())
        self._head = _Head(
            n,
            end,
            header_len,
            header["boot_id"],
            header.get("kernel_boot_id", ""),
            next_seq,
            sealed,
            header.get("instance_id", self.instance_id),
        )
        return self._head

    def _new_segment(self, n: int, boot_id: str, first_seq: int) -> _Head:
        kboot = kernel_boot_id()
        header = (
            json.dumps(
                {
                    "instance_id": self.instance_id,
                    "boot_id": boot_id,
                    "kernel_boot_id": kboot,
                    "first_seq": first_seq,
                    "created_us": now_us(),
                }
            ).encode()
            + b"\n"
        )
        path = self._path(n)
        tmp = self.files.segment_tmp(path)
        with open(tmp, "wb") as f:
            f.write(SEG_MAGIC + header)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        dfd = os.open(self.dir, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
        size = len(SEG_MAGIC) + len(header)
        self._head = _Head(n, size, size, boot_id, kboot, first_seq, False, self.instance_id)
        return self._head

    def _current(self) -> _Head:
        """Under the lock: the head to append to, starting a new boot or segment where needed."""
        head = self._recover()
        if (
            head is None
            or head.sealed
            or self._force_new_boot
            or (head.kernel_boot and head.kernel_boot != kernel_boot_id())
        ):
            self._force_new_boot = False
            n = head.seg + 1 if head else 1
            return self._new_segment(n, str(uuid.uuid4()), 0)
        if head.offset >= self.rotate_bytes:
            return self._new_segment(head.seg + 1, head.boot_id, head.next_seq)
        return head

    def boot(self) -> tuple[str, int]:
        """(boot id, next seq) as the next append would use them (this may start the boot)."""
        with self._tlock:
            self._lock()
            try:
                head = self._current()
                return head.boot_id, head.next_seq
            finally:
                self._unlock()

    def sent_once(self, boot_id: str, name: str) -> bool:
        """Whether the event ``name`` sent once per boot (``append(once=name)``) is spooled in ``boot_id``."""
        return self.files.once(boot_id, name).exists()

    def with_boot(self, fn: Callable[[str], T]) -> T:
        """``fn(boot id)`` run under the lock, the boot started if none is open (no seal comes in between)."""
        with self._tlock:
            self._lock()
            try:
                return fn(self._current().boot_id)
            finally:
                self._unlock()

    def _ended_under_us(self, makers: Sequence[Maker]) -> None:
        """Under the lock: a stage of this process still runs in a boot that was sealed: its events are lost."""
        if not self._held:
            return
        head = self._recover()
        if head is not None and head.boot_id in self._held and not head.sealed:
            return
        gone = ", ".join(sorted(self._held))
        raise BootSealedError(
            f"boot {gone} was sealed while this stage was still running (a seal waits "
            "FLIGHTREC_SEAL_WAIT seconds for running stages); its later events are not recorded",
            built_for_counting(makers, gone),
        )

    def hold(self, boot_id: str) -> None:
        """A stage of this process takes part in ``boot_id`` (producer.members): its events are lost, not spooled in
        a boot of their own, once that boot is sealed."""
        with self._tlock:
            self._held[boot_id] = self._held.get(boot_id, 0) + 1

    def let_go(self, boot_id: str) -> None:
        """A stage of :meth:`hold` ended."""
        with self._tlock:
            left = self._held.get(boot_id, 0) - 1
            if left > 0:
                self._held[boot_id] = left
            else:
                self._held.pop(boot_id, None)

    # -- writing ------------------------------------------------------------

    @property
    def syncs(self) -> int:
        """fdatasyncs of records done by this object (its syncer thread's included)."""
        return self._syncs + self._syncer.syncs

    @property
    def dirty(self) -> bool:
        """Records of this object were written but are not yet fdatasync'd (group commit)."""
        return self._dirty_since is not None

    def _sync_fd(self) -> None:
        """Under ``_tlock``: fdatasync the open segment (every record written to it, by any process)."""
        if self._fd is not None and self._dirty_since is not None:
            os.fdatasync(self._fd)
            self._syncs += 1
        self._dirty_since = None

    def sync(self) -> None:
        """Make every record this object wrote durable now (fdatasync), waiting for the syncer too."""
        with self._tlock:
            self._sync_fd()
        self._syncer.drain()

    def sync_due(self) -> None:
        """fdatasync the records written with ``sync=False`` once the oldest waited SYNC_WINDOW_S."""
        since = self._dirty_since
        if since is not None and time.monotonic() - since >= SYNC_WINDOW_S:
            with self._tlock:
                since = self._dirty_since
                if since is not None and time.monotonic() - since >= SYNC_WINDOW_S:
                    self._sync_fd()

    def _write(self, head: _Head, blob: list[bytes], sync: bool = True) -> None:
        if self._fd_seg != head.seg:
            if self._fd is not None:
                if self._dirty_since is not None:  # the old segment's unsynced records: the syncer thread
                    self._syncer.hand(self._fd)  # fdatasyncs and closes it (the writer does not wait)
                    self._dirty_since = None
                else:
                    os.close(self._fd)
            self._fd = os.open(self._path(head.seg), os.O_WRONLY | os.O_APPEND)
            self._fd_seg = head.seg
        fd = self._fd
        assert fd is not None  # opened just above, or kept from the last append to this segment
        try:
            view = memoryview(b"")  # one system call, no copy of the parts into one buffer; after a short
            if (written := os.writev(fd, blob)) < sum(map(len, blob)):  # write (a full disk) the rest
                view = memoryview(b"".join(blob))[written:]
            while view:
                view = view[os.write(fd, view) :]
            if self.fsync:
                if self._dirty_since is None:
                    self._dirty_since = time.monotonic()
                if sync:  # this event and every line before it (an older segment's too) are on disk
                    self._sync_fd()
                    self._syncer.drain()
                elif time.monotonic() - self._dirty_since >= SYNC_WINDOW_S:  # group commit, in the syncer
                    self._syncer.hand(os.dup(fd))
                    self._dirty_since = None
        except OSError:
            # give the disk back what a half-written record took (the next append would cut it anyway)
            with contextlib.suppress(OSError):
                os.ftruncate(fd, head.offset)
            raise

    def append(
        self,
        makers: Sequence[Callable[[str, int], EventT]],
        *,
        once: str | None = None,
        encode: Callable[[Event], bytes] | None = None,
        sync: bool = True,
        boot: str | None = None,
    ) -> list[EventT]:
        """Assign seqs, build, encode and durably write events; return them (empty if ``once`` was done).

        ``sync=False`` (log batches): written at once, fdatasync'd by group commit (see the class).
        ``boot``: the boot the events belong to; when it is no longer the open one (sealed), they are lost
        (BootSealedError) rather than starting a boot of their own.

        ``once`` names an event sent once per boot: if this boot already has it, nothing is written.
        A :class:`Sealed` event ends the boot. ``encode`` replaces the codec (it must give the same bytes).
        """
        if not makers:
            return []
        with self._tlock:
            self._lock()
            try:
                self._ended_under_us(makers)
                if boot is not None:
                    last = self._recover()
                    if last is None or last.boot_id != boot or last.sealed:
                        raise BootSealedError(
                            f"boot {boot} was sealed before these lines of a stage's late output "
                            "were spooled; they are passed on but not recorded",
                            built_for_counting(makers, boot),
                        )
                try:
                    head = self._current()
                except OSError as exc:
                    raise SpoolWriteError(
                        f"cannot start a spool segment in {self.dir}: {exc}", built_for_counting(makers, "")
                    ) from exc
                marker = self.files.once(head.boot_id, once) if once else None
                if marker is not None and marker.exists():
                    return []
                events: list[EventT] = []
                parts: list[bytes] = []
                seq = head.next_seq
                sealed = False
                for make in makers:
                    ev = make(head.boot_id, seq)
                    value = encode(ev) if encode is not None else self._codec.encode(ev)
                    flags = FLAG_SEALED if isinstance(ev, Sealed) else 0
                    topic = ev.topic.encode()
                    head_ = BODY.pack(seq, flags, len(topic)) + topic  # the body is head_ + value, not copied
                    parts += (REC.pack(len(head_) + len(value), zlib.crc32(value, zlib.crc32(head_))), head_, value)
                    events.append(ev)
                    seq += 1
                    sealed = sealed or bool(flags)
                self._write_or_lose(head, parts, events, sync)
                head.offset += sum(map(len, parts))
                head.next_seq = seq
                head.sealed = head.sealed or sealed
                if marker is not None:
                    try:
                        marker.touch()
                    except OSError as exc:  # the event is spooled; at worst it is sent again by a later agent
                        log.warning("spool %s: cannot write the marker %s: %s", self.dir, marker.name, exc)
                self.events_spooled += len(events)
                return events
            finally:
                self._unlock()

    def _write_or_lose(self, head: _Head, blob: list[bytes], events: Sequence[Event], sync: bool = True) -> None:
        """Write the parts of ``blob``; on a full disk, give up the reserve for anything but log lines; else
        SpoolWriteError."""
        has_lines = any(isinstance(ev, LogBatch) for ev in events)
        if has_lines and not self._room_for_lines():
            raise SpoolWriteError(
                f"the disk of {self.dir} is full: log lines are dropped, the last room is kept "
                "for exits and ends of stages",
                events,
            )
        try:
            self._write(head, blob, sync)
            return
        except OSError as exc:
            first = exc
        if first.errno in _NO_ROOM and not has_lines and self._give_up_reserve():
            try:
                self._write(head, blob, sync)
                return
            except OSError as exc:
                first = exc
        raise SpoolWriteError(f"cannot write the spool segment {self._path(head.seg)}: {first}", events) from first

    # -- reading (delivery) -------------------------------------------------

    def committed_end(self) -> Position:
        """The position after the last intact record (cutting a crash's torn record first)."""
        with self._tlock:
            self._lock()
            try:
                head = self._recover()
                return Position(head.seg, head.offset) if head else Position(0, 0)
            finally:
                self._unlock()

    def load_cursor(self) -> Position:
        """How far Kafka acknowledged, as saved by the delivering process (start of spool if never)."""
        try:
            seg, offset = self.files.cursor.read_text().split()
            return Position(int(seg), int(offset))
        except (OSError, ValueError):
            return Position(0, 0)

    def save_cursor(self, pos: Position) -> None:
        """Record that everything before ``pos`` is acknowledged; delete segments wholly before it.

        On a full disk the cursor is overwritten in place (same size, no new block); if even that
        fails, a warning says so and a later agent sends those events again (same event_ids).
        """
        text = f"{pos.seg:012d} {pos.offset:012d}\n"
        tmp = self.files.cursor_tmp()
        try:
            tmp.write_text(text)
            os.replace(tmp, self.files.cursor)
        except OSError as exc:
            try:
                tmp.unlink(missing_ok=True)
                with open(self.files.cursor, "r+") as f:
                    f.write(text)
            except OSError:
                log.warning(
                    "spool %s: cannot save the delivery cursor (%s); acknowledged events may be sent again",
                    self.dir,
                    exc,
                )
        for n in self.segments():
            if n < pos.seg:
                with contextlib.suppress(FileNotFoundError):
                    self._path(n).unlink()

    def read(self, cursor: Position, end: Position, max_bytes: int = 4 * 1024 * 1024) -> tuple[list[Record], Position]:
        """Records from ``cursor`` up to ``end`` (a committed end), about ``max_bytes`` of values; and the new cursor.

        The bytes before a committed end never change, so no lock is needed here.
        At least one record is returned when there is one, however big.
        """
        return read_records([(n, self._path(n)) for n in self.segments()], self.instance_id, cursor, end, max_bytes)

    def pending(self) -> int:
        """Records spooled but not yet acknowledged (a count, for reports)."""
        end = self.committed_end()
        cursor = self.load_cursor()
        count = 0
        while cursor < end:
            recs, nxt = self.read(cursor, end)
            count += len(recs)
            if nxt <= cursor:
                break
            cursor = nxt
        return count

    def remove_if_delivered(self) -> bool:
        """Remove this instance's folder when Kafka acknowledged every record in it and no other process uses it
        (the manager's folder of an instance it destroyed or forgot: nothing more is said about it); False, the
        folder left as it is, otherwise. Closes this Spool either way."""
        removed = False
        with self._tlock:
            if self._lock_fd < 0:
                return False
            try:
                fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                return False
            try:
                removed = self._remove_unused()
            finally:
                self._unlock()
        self.close()
        return removed

    def _remove_unused(self) -> bool:
        """Under the lock: the folder removed if no process delivers from it and nothing in it is unacknowledged."""
        deliver = os.open(self.files.deliver_lock, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(deliver, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(deliver)
            return False
        try:
            head = self._recover()
            if head is not None and self.load_cursor() < Position(head.seg, head.offset):
                return False
            entries = self.files.entries()
            if any(p.is_dir() and not p.is_symlink() for p in entries):
                return False  # a folder of someone else's inside: not ours to remove
            for p in entries:
                p.unlink(missing_ok=True)
            self.dir.rmdir()
            return True
        except OSError as exc:
            log.warning("spool %s: could not remove the delivered folder: %s", self.dir, exc)
            return False
        finally:
            os.close(deliver)

    def close(self) -> None:
        """Release the file descriptors (the spool stays on disk)."""
        try:
            self.sync()
        except OSError as exc:
            log.error("spool %s: cannot fdatasync segment %d: %s", self.dir, self._fd_seg, exc)
        with self._tlock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None
                self._fd_seg = -1
            if self._lock_fd >= 0:
                os.close(self._lock_fd)
                self._lock_fd = -1
