"""Who still works on a boot: one flock-held file per running stage or facts probe, so that a seal can wait for them."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

from flightrec.producer.spool import Spool

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Member:
    """A stage or a probe taking part in boot ``boot_id``; its file is locked for as long as it runs."""

    what: str
    boot_id: str
    path: Path
    fd: int


def join(spool: Spool, what: str) -> Member | None:
    """Register ``what`` as running in the open boot (started if none is); None where the spool cannot hold it.

    The boot is read and the file written under the spool's lock, so a seal either sees the member or
    comes before it (then the member joins the next boot).
    """

    def register(boot_id: str) -> Member:
        path, fd = spool.files.hold_member(boot_id, {"what": what, "pid": os.getpid()})
        return Member(what, boot_id, path, fd)

    try:
        member = spool.with_boot(register)
    except OSError as exc:  # a full or read-only disk: the stage runs, the seal just cannot wait for it
        log.warning("cannot register %s in the spool %s (%s); a seal will not wait for it", what, spool.dir, exc)
        return None
    spool.hold(member.boot_id)
    return member


def leave(spool: Spool, member: Member | None) -> None:
    """The stage or probe ended: it no longer holds its boot open."""
    if member is None:
        return
    spool.let_go(member.boot_id)
    spool.files.drop_member(member.path, member.fd)


def running(spool: Spool, boot_id: str, exclude: Member | None = None) -> list[str]:
    """What is still running in ``boot_id`` ("stage tunnel (pid 12)"); files left by dead processes are removed."""
    held = spool.files.live_members(boot_id, exclude.path if exclude is not None else None)
    return [f"{info.get('what', '?')} (pid {info.get('pid', '?')})" for info in held]
