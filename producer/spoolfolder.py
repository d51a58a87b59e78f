"""Every file of one instance's spool folder, by name: the one place that joins a path to the folder.

The folder (``<spool>/<quoted instance id>/``, :func:`instance_dir`) is the spool's (flightrec.producer.spool); the
other parts of the agent that keep state in it ask :class:`SpoolFolder` for their files' paths, never join one
themselves (``tests/producer/test_spool_folder.py`` fails on a path joined to the folder outside the spool's code).

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

import hashlib
import os
import uuid
from dataclasses import dataclass
from pathlib import Path

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


def segment_name(n: int) -> str:
    """The file name of segment ``n``."""
    return f"{n:012d}{SEGMENT}"


@dataclass(frozen=True)
class SpoolFolder:
    """The paths of one instance's spool folder (nothing is created here: each file's owner does that)."""

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

    # -- follow claims -----------------------------------------------------------

    def follow_claim(self, boot_id: str, followed: str) -> Path:
        """The claim file of one followed path in one boot."""
        key = hashlib.sha256(os.fsencode(os.path.abspath(followed))).hexdigest()[:20]
        return self.path / f"{CLAIM}{boot_id}-{key}"

    @staticmethod
    def claim_tmp(claim: Path) -> Path:
        """Where this process writes a claim before it replaces the old one."""
        return claim.with_name(f"{claim.name}.{os.getpid()}")

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

    # -- a manager's folder ----------------------------------------------------------

    @property
    def ended(self) -> Path:
        """The manager's last word on the instance ended it: the folder may go once delivered."""
        return self.path / "ended"
