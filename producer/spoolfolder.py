"""Every file of one instance's spool folder: the one place that names, creates, locks and removes them.

The folder (``<spool>/<quoted instance id>/``, :func:`instance_dir`) is the spool's (flightrec.producer.spool, which
writes its segments, cursor and locks through the names here). The other parts of the agent that keep state in it
(members, follow claims, the late-output process and its keeper, the sender, the manager) do so through
:class:`SpoolFolder`'s operations, one section per part below: none of them joins a path to the folder, or opens,
locks or removes a file of it (``tests/producer/test_spool_folder.py`` fails on either outside the spool's code).

=================================  ==========================================================================
file                               what it is, whose
=================================  ==========================================================================
``NNNNNNNNNNNN.seg``               a segment of records (producer/segment.py), the spool's
``lock``                           held while a seq is assigned and its record written, the spool's
``cursor``                         how far Kafka acknowledged, the spool's (written through it by the sender)
``once-<boot>-<name>``             an event sent once per boot was spooled, the spool's
``reserve``                        room kept on the disk for exits and ends of stages, the spool's
``deliver.lock``                   held by the one process that sends (producer/deliver.py)
``delivery-away``                  the sender found that Kafka does not answer (producer/deliver.py)
``member-<boot>-<pid>-<n>``        a running stage or facts probe, flock-held (producer/members.py)
``follow-claim-<boot>-<hash>``     the stage that follows a file now (producer/claims.py)
``late.lock``                      taken to hand a stage off, and by the late-output process to end
``late.pid``, ``late.log``         the late-output process's pid and log (producer/handoff.py, late.py)
``late-<token>``                   a handed-off stage whose late output is still recorded (producer/handoff.py)
``late-left-<boot>-<token>``       what still wrote a stage's late output when a seal stopped recording it
``late-lost-<boot>-<pid>-<n>``     lines a keeper passed on unrecorded (producer/keeper.py)
``seal-request-<boot>``            a seal waits for the boot's late output (producer/handoff.py)
``ended``                          a manager's folder of an instance it destroyed or forgot (producer/manager.py)
=================================  ==========================================================================
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import logging.handlers
import os
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flightrec.producer.names import instance_dir

__all__ = ["SpoolFolder", "instance_dir", "LOCK", "MEMBER", "LATE_STAGE", "LEFT", "LOST", "REQUEST"]

LOCK = "lock"
MEMBER = "member-"
CLAIM = "follow-claim-"
LATE_STAGE = "late-"
LEFT = "late-left-"
LOST = "late-lost-"
REQUEST = "seal-request-"
SEGMENT = ".seg"
LATE_LOG_BYTES = 1 << 20  # late.log is rotated at this size (one old copy kept)

log = logging.getLogger(__name__)


def segment_name(n: int) -> str:
    """The file name of segment ``n``."""
    return f"{n:012d}{SEGMENT}"


@dataclass(frozen=True)
class SpoolFolder:
    """One instance's spool folder: its files' names, and what the agent's parts do with them."""

    path: Path

    @classmethod
    def of(cls, root: str | Path, instance_id: str) -> SpoolFolder:
        """The folder of ``instance_id`` in the spool root ``root``."""
        return cls(instance_dir(root, instance_id))

    @staticmethod
    def holds_an_instance(path: Path) -> bool:
        """Whether ``path`` is an instance's spool folder (a spool was made in it: its ``lock`` is there)."""
        return (path / LOCK).exists()

    # -- the spool's own ---------------------------------------------------------

    @property
    def lock(self) -> Path:
        return self.path / LOCK

    @property
    def cursor(self) -> Path:
        return self.path / "cursor"

    def cursor_tmp(self) -> Path:
        """Where this process writes a new cursor before it replaces the old one."""
        return self.path / f"cursor.{os.getpid()}.tmp"

    @property
    def reserve(self) -> Path:
        return self.path / "reserve"

    def segment(self, n: int) -> Path:
        return self.path / segment_name(n)

    @staticmethod
    def segment_tmp(segment: Path) -> Path:
        """Where a new segment is written before it takes its name."""
        return segment.with_suffix(".tmp")

    def segment_numbers(self) -> list[int]:
        """Numbers of the segment files present, oldest first."""
        out = []
        for p in self.path.iterdir():
            if p.name.endswith(SEGMENT) and p.name[: -len(SEGMENT)].isdigit():
                out.append(int(p.name[: -len(SEGMENT)]))
        return sorted(out)

    def once(self, boot_id: str, name: str) -> Path:
        """The marker of an event sent once per boot."""
        return self.path / f"once-{boot_id}-{name}"

    def entries(self) -> list[Path]:
        """Everything in the folder (to remove a delivered folder)."""
        return list(self.path.iterdir())

    # -- the sender's ------------------------------------------------------------

    @property
    def deliver_lock(self) -> Path:
        return self.path / "deliver.lock"

    @property
    def delivery_away(self) -> Path:
        return self.path / "delivery-away"

    def try_lock_delivery(self) -> int | None:
        """Become the folder's one sender: the fd that holds ``deliver.lock`` (None: another process sends)."""
        fd = os.open(self.deliver_lock, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            return None
        return fd

    @staticmethod
    def release_delivery(fd: int) -> None:
        """Stop being the folder's sender (the fd :meth:`try_lock_delivery` gave)."""
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)

    def delivery_away_noted(self) -> bool:
        """Whether the sender noted that Kafka does not answer."""
        return self.delivery_away.exists()

    def note_delivery_away(self, text: str) -> None:
        """As the sender, note that Kafka does not answer (kept as first noted; never raises)."""
        if self.delivery_away.exists():
            return
        with contextlib.suppress(OSError):
            self.delivery_away.write_text(text)

    def clear_delivery_away(self) -> None:
        """Kafka answered: the note goes (never raises)."""
        with contextlib.suppress(OSError):
            self.delivery_away.unlink(missing_ok=True)

    # -- members: who still works on a boot ---------------------------------------

    def new_member(self, boot_id: str) -> Path:
        """A fresh member file's path for this process in ``boot_id``."""
        return self.path / f"{MEMBER}{boot_id}-{os.getpid()}-{uuid.uuid4().hex[:8]}"

    def members(self) -> list[Path]:
        """Every member file, of every boot, sorted."""
        return sorted(self.path.glob(f"{MEMBER}*"))

    @staticmethod
    def member_of(path: Path, boot_id: str) -> bool:
        """Whether the member file ``path`` takes part in ``boot_id``."""
        return path.name.startswith(f"{MEMBER}{boot_id}-")

    def hold_member(self, boot_id: str, info: dict[str, Any]) -> tuple[Path, int]:
        """A new member file of this process in ``boot_id`` holding ``info``: (its path, the fd that flock-holds it
        while the member runs). Raises OSError (nothing is left behind)."""
        path = self.new_member(boot_id)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            os.write(fd, json.dumps(info).encode())
        except OSError:
            os.close(fd)
            path.unlink(missing_ok=True)
            raise
        return path, fd

    @staticmethod
    def drop_member(path: Path, fd: int) -> None:
        """The member ended: its file goes, and with its fd the lock."""
        with contextlib.suppress(OSError):
            path.unlink(missing_ok=True)
        os.close(fd)

    def live_members(self, boot_id: str, exclude: Path | None = None) -> list[dict[str, Any]]:
        """The info of each member of ``boot_id`` whose process still holds its file (but ``exclude``); the files
        of members whose process died without leaving (of any boot) are removed."""
        out: list[dict[str, Any]] = []
        try:
            paths = self.members()
        except OSError:
            return out
        for path in paths:
            if path == exclude:
                continue
            try:
                fd = os.open(path, os.O_RDONLY)
            except OSError:
                continue
            try:
                try:
                    fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                except OSError:  # held: its process is alive and still running it
                    if self.member_of(path, boot_id):
                        out.append(json.loads(os.read(fd, 4096) or b"{}"))
                    continue
                path.unlink(missing_ok=True)  # not held: its process died without leaving
            except (OSError, ValueError) as exc:
                log.debug("member file %s: %s", path, exc)
            finally:
                os.close(fd)
        return out

    # -- follow claims -----------------------------------------------------------

    def follow_claim(self, boot_id: str, followed: str) -> Path:
        """The claim file of one followed path in one boot."""
        key = hashlib.sha256(os.fsencode(os.path.abspath(followed))).hexdigest()[:20]
        return self.path / f"{CLAIM}{boot_id}-{key}"

    @staticmethod
    def claim_tmp(claim: Path) -> Path:
        """Where this process writes a claim before it replaces the old one."""
        return claim.with_name(f"{claim.name}.{os.getpid()}")

    def write_claim(self, boot_id: str, followed: str, text: str) -> None:
        """Replace the claim on ``followed`` in ``boot_id`` with ``text`` (whole or not at all). Raises OSError."""
        target = self.follow_claim(boot_id, followed)
        tmp = self.claim_tmp(target)
        tmp.write_text(text)
        tmp.replace(target)

    def read_claim(self, boot_id: str, followed: str) -> str:
        """The claim on ``followed`` in ``boot_id``. Raises OSError (none)."""
        return self.follow_claim(boot_id, followed).read_text()

    # -- late output ---------------------------------------------------------------

    @property
    def late_lock(self) -> Path:
        return self.path / "late.lock"

    @property
    def late_pid(self) -> Path:
        return self.path / "late.pid"

    @property
    def late_log(self) -> Path:
        return self.path / "late.log"

    def late_stage(self, token: str) -> Path:
        """The registration of a handed-off stage whose late output is still recorded."""
        return self.path / f"{LATE_STAGE}{token}"

    def late_stages(self) -> list[tuple[str, Path]]:
        """(token, path) of every handed-off stage's registration, sorted by path."""
        out = []
        for p in sorted(self.path.glob(f"{LATE_STAGE}*")):
            if not p.name.startswith(LEFT):
                out.append((p.name[len(LATE_STAGE) :], p))
        return out

    def late_left(self, boot_id: str, token: str) -> Path:
        """What still wrote a stage's late output when a seal stopped recording it."""
        return self.path / f"{LEFT}{boot_id}-{token}"

    def late_lefts(self, boot_id: str) -> list[Path]:
        return sorted(self.path.glob(f"{LEFT}{boot_id}-*"))

    def new_late_lost(self, boot_id: str, n: int) -> tuple[Path, Path]:
        """(where a keeper writes a note, the note's name once whole) for a note of ``boot_id``."""
        name = f"{LOST}{boot_id}-{os.getpid()}-{n}"
        return self.path / f".{name}", self.path / name

    def late_losts(self, boot_id: str | None = None) -> list[Path]:
        """The keepers' notes of ``boot_id`` (of every boot: None), sorted."""
        return sorted(self.path.glob(f"{LOST}{boot_id}-*" if boot_id is not None else f"{LOST}*"))

    def write_late_lost(self, boot_id: str, n: int, text: str) -> None:
        """Leave a keeper's note ``n`` of ``boot_id`` (whole or not at all). Raises OSError."""
        tmp, note = self.new_late_lost(boot_id, n)
        tmp.write_text(text)
        tmp.rename(note)

    def take_late_losts(self, boot_id: str) -> list[tuple[Path, str]]:
        """The keepers' notes of ``boot_id``, each taken by one caller only however many look at once: (the taken
        note, its text); :meth:`drop_late_lost` removes one once an event says what it held."""
        out = []
        for p in self.late_losts(boot_id):
            taken = self.late_lost_taken(p)
            try:
                p.rename(taken)
                out.append((taken, taken.read_text()))
            except OSError:
                continue
        return out

    @staticmethod
    def drop_late_lost(note: Path) -> None:
        """Remove a keeper's note (taken, or of a sealed boot)."""
        note.unlink(missing_ok=True)

    def late_lost_boots_but(self, boot_id: str) -> list[Path]:
        """The keepers' notes of every boot but ``boot_id``."""
        return [p for p in self.late_losts() if not self.late_lost_of(p, boot_id)]

    @staticmethod
    def late_lost_taken(note: Path) -> Path:
        """Where one agent moves a note it takes (so that no other takes it too)."""
        return note.with_name(f".taken-{os.getpid()}-{note.name}")

    @staticmethod
    def late_lost_of(note: Path, boot_id: str) -> bool:
        return note.name.startswith(f"{LOST}{boot_id}-")

    def seal_request(self, boot_id: str) -> Path:
        """A seal of ``boot_id`` waits for the boot's late output (holds the sealing process's pid)."""
        return self.path / f"{REQUEST}{boot_id}"

    @contextlib.contextmanager
    def late_locked(self) -> Iterator[None]:
        """Hold ``late.lock`` (taken to hand a stage off, and by the late-output process to end)."""
        fd = os.open(self.late_lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # drops the lock

    def read_late_pid(self) -> int:
        """The running late-output process's pid (0: none is noted, or the note cannot be read)."""
        try:
            return int(self.late_pid.read_text())
        except (OSError, ValueError):
            return 0

    def write_late_pid(self, pid: int) -> None:
        """Note the late-output process just started. Raises OSError."""
        self.late_pid.write_text(str(pid))

    def clear_late_pid(self) -> None:
        """The late-output process ends (under :meth:`late_locked`)."""
        self.late_pid.unlink(missing_ok=True)

    def register_late_stage(self, token: str, text: str) -> None:
        """Register a handed-off stage (``late-TOKEN``) as recorded by the late-output process. Raises OSError."""
        self.late_stage(token).write_text(text)

    def late_registrations(self) -> list[tuple[str, str]]:
        """(token, text) of every handed-off stage still registered (one that cannot be read is left out)."""
        out = []
        for token, p in self.late_stages():
            try:
                out.append((token, p.read_text()))
            except OSError:
                continue
        return out

    def unregister_late_stage(self, token: str) -> None:
        """Every line of the stage is spooled (or its late-output process is gone): a seal need not wait for it."""
        self.late_stage(token).unlink(missing_ok=True)

    def request_seal(self, boot_id: str, text: str) -> None:
        """Ask the late-output process to finish ``boot_id``'s stages: a seal waits (``text``: its pid and wait)."""
        self.seal_request(boot_id).write_text(text)

    def seal_requested(self, boot_id: str) -> bool:
        return self.seal_request(boot_id).exists()

    def seal_request_text(self, boot_id: str) -> str | None:
        """What the waiting seal of ``boot_id`` wrote (None: it cannot be read, being written or gone)."""
        try:
            return self.seal_request(boot_id).read_text()
        except OSError:
            return None

    def end_seal_request(self, boot_id: str) -> None:
        self.seal_request(boot_id).unlink(missing_ok=True)

    def note_late_left(self, boot_id: str, token: str, text: str) -> None:
        """Say, for the seal of ``boot_id``, what still wrote the stage ``token``'s output when it stopped recording
        it. Raises OSError."""
        self.late_left(boot_id, token).write_text(text)

    def take_late_lefts(self, boot_id: str) -> list[str]:
        """What the late-output process said still wrote ``boot_id``'s stages (each said once: the notes go)."""
        out = []
        for p in self.late_lefts(boot_id):
            try:
                out.append(p.read_text())
            except OSError:
                continue
            p.unlink(missing_ok=True)
        return out

    def late_log_handler(self) -> logging.Handler:
        """The late-output process's log, ``late.log`` (rotated at LATE_LOG_BYTES, one old copy kept)."""
        return logging.handlers.RotatingFileHandler(self.late_log, maxBytes=LATE_LOG_BYTES, backupCount=1)

    def append_late_log(self, line: str) -> None:
        """Add a line to ``late.log`` (the keeper's: the late-output process that owned the log is gone)."""
        try:
            with open(self.late_log, "a") as f:
                f.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {line}\n")
        except OSError:
            pass

    # -- a manager's folder ----------------------------------------------------------

    @property
    def ended(self) -> Path:
        """The manager's last word on the instance ended it: the folder may go once delivered."""
        return self.path / "ended"

    def mark_ended(self, ended: bool) -> None:
        """Note (or clear) that the manager's last word on the instance ends it (never raises: the folder then
        stays, and nothing is lost)."""
        try:
            if ended:
                self.ended.touch()
            else:
                self.ended.unlink(missing_ok=True)
        except OSError as exc:
            log.debug("%s: %s", self.ended, exc)

    def is_ended(self) -> bool:
        return self.ended.exists()
