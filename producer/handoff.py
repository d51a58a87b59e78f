"""The hand-off of a stage's late output to the instance's late-output process, and a seal's wait for it.

The hand-off travels on a Unix socket as one JSON message (``FORMAT``, versioned) with the stage's fds beside it
(SCM_RIGHTS); nothing executable crosses the socket. The late-output process itself is flightrec.producer.late.
"""

from __future__ import annotations

import base64
import collections.abc
import dataclasses
import hashlib
import json
import logging
import os
import socket
import subprocess
import sys
import time
import types
import typing
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from flightrec.producer.redact import NO_CARRY, Carry
from flightrec.producer.spoolfolder import SpoolFolder
from flightrec.producer.tokens import carriers
from flightrec.producer.writers import describe, writers

from flightrec.errors import FlightrecError
from flightrec.settings import Settings

log = logging.getLogger(__name__)

CHUNK = 1 << 20
POLL_S = 0.05
HOLDER_SCAN_S = 1.0  # how often /proc is scanned for processes the stages started
SEAL_SCAN_S = 0.2  # the same while a seal waits for a stage's late output
MAX_FDS = 253  # fds one hand-off may carry (Linux SCM_MAX_FD): two pipes, two outputs, the followed files


@dataclass(frozen=True)
class HandedPipe:
    """One of CMD's outputs (a pipe or a pty master) that a leftover process still holds open."""

    fd: int
    out_fd: int | None  # where the bytes go on (the agent's stdout or stderr) or None
    source: str
    pid: int
    next_no: int
    pending: bytes = b""
    overflow: bool = False
    carry: Carry = NO_CARRY  # what masking its next line needs from the line before (redact.Carry)
    strip: bool = False  # a pty: terminal control sequences are kept out of the recorded text
    early: int = 0  # bytes still in the pipe that were written before CMD exited (not late)


@dataclass(frozen=True)
class HandedFile:
    """A followed file and how far it was read."""

    path: str
    fd: int | None
    offset: int
    ino: tuple[int, int] | None
    exists: bool
    next_no: int
    pending: bytes = b""
    overflow: bool = False
    carry: Carry = NO_CARRY


@dataclass(frozen=True)
class Handoff:
    """Everything the late-output process needs about one stage: where to spool, which stage, what to read."""

    settings: Settings
    stage: str
    boot_id: str
    token: str
    pipes: Sequence[HandedPipe] = ()
    files: Sequence[HandedFile] = field(default_factory=tuple)

    def fds(self) -> list[int]:
        """The fds that travel with the hand-off, in the order :meth:`with_fds` takes them back."""
        return (
            [p.fd for p in self.pipes]
            + [p.out_fd for p in self.pipes if p.out_fd is not None]
            + [f.fd for f in self.files if f.fd is not None]
        )

    def with_fds(self, fds: Sequence[int]) -> Handoff:
        """The same hand-off with the fds as received (in :meth:`fds` order) in place of the sender's numbers."""
        it = iter(fds)
        pipes = [dataclasses.replace(p, fd=next(it)) for p in self.pipes]
        pipes = [dataclasses.replace(p, out_fd=next(it)) if p.out_fd is not None else p for p in pipes]
        files = [dataclasses.replace(f, fd=next(it)) if f.fd is not None else f for f in self.files]
        return dataclasses.replace(self, pipes=pipes, files=files)


FORMAT = 1  # the hand-off message's version: a late-output process refuses one it does not know


class HandoffError(FlightrecError):
    """A hand-off message the late-output process cannot read (another flightrec version, or not a hand-off)."""


def _plain(value: Any) -> Any:
    """``value`` as JSON: dataclasses as objects of their fields, bytes as base64, tuples as lists."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, bytes):
        return {"b64": base64.b64encode(value).decode("ascii")}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _typed(hint: Any, value: Any) -> Any:
    """A JSON value back as the type ``hint`` names (the inverse of :func:`_plain` for the hand-off's types)."""
    if value is None:
        return None
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        kinds = [a for a in args if a is not type(None)]
        return _typed(kinds[0], value) if len(kinds) == 1 else value
    if hint is bytes:
        return base64.b64decode(value["b64"])
    if origin in (tuple, list, collections.abc.Sequence) or hint in (tuple, list):
        item = args[0] if args else Any
        return tuple(_typed(item, v) for v in value)
    if dataclasses.is_dataclass(hint):
        hints = typing.get_type_hints(hint)
        cls: Any = hint
        return cls(
            **{
                f.name: _typed(hints[f.name], value[f.name])
                for f in dataclasses.fields(hint)
                if f.init and f.name in value
            }
        )
    return value


def encode(h: Handoff) -> bytes:
    """The hand-off message: JSON, versioned (``FORMAT``); its fds travel beside it."""
    return json.dumps({"format": FORMAT, "handoff": _plain(h)}, separators=(",", ":")).encode()


def decode(data: bytes) -> Handoff:
    """A hand-off message back (fds not yet in place: :meth:`Handoff.with_fds`). HandoffError when it is not one
    this version reads."""
    try:
        doc = json.loads(data)
        if doc.get("format") != FORMAT:
            raise HandoffError(
                f"a hand-off of format {doc.get('format')!r}; this flightrec reads format {FORMAT}: "
                "run the same flightrec version for the agent and its late-output process"
            )
        return _typed(Handoff, doc["handoff"])
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise HandoffError(f"not a hand-off message ({type(exc).__name__}: {exc})") from exc


def _address(folder: SpoolFolder) -> bytes:
    """The late-output process's socket: abstract (no file to go stale, no path length limit), one per spool folder."""
    return b"\0flightrec-late-" + hashlib.sha256(os.fsencode(os.path.realpath(folder.path))).hexdigest()[:32].encode()


def hand_off(h: Handoff, folder: SpoolFolder) -> int:
    """Give ``h``'s fds to the instance's late-output process (started now if none runs); return its pid.

    The caller then closes its own copies. Never waits for the late-output process to
    start: the hand-off waits in its socket. The stage is registered in the spool folder
    at once (``late-TOKEN``), so a seal that follows waits for its late output.
    """
    addr = _address(folder)
    with folder.late_locked():
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        try:
            sock.connect(addr)
        except OSError:  # none runs (it ends under this lock, so it cannot be ending now)
            sock.close()
            _start(folder, addr)
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
            sock.connect(addr)  # waits in the listener's backlog until the new process takes it
        pid = folder.read_late_pid()
        with sock:
            folder.register_late_stage(h.token, f"{h.boot_id} {pid} {h.stage}")
            data = encode(h)
            sent = socket.send_fds(sock, [data[:4096]], h.fds())
            sock.sendall(data[sent:])
    return pid


def _start(folder: SpoolFolder, addr: bytes) -> int:
    """Bind the late-output process's socket here (so hand-offs can queue at once) and start it on it."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind(addr)
        listener.listen(64)
        proc = subprocess.Popen(
            [sys.executable, "-m", "flightrec.producer.late", str(folder.path), str(listener.fileno())],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            pass_fds=[listener.fileno()],
            start_new_session=True,
        )
    finally:
        listener.close()
    folder.write_late_pid(proc.pid)
    return proc.pid


@dataclass(frozen=True)
class LateStage:
    """A handed-off stage of a boot that the late-output process still records (registered as ``late-TOKEN``)."""

    token: str
    stage: str
    late_pid: int  # the late-output process recording it


def late_stages(folder: SpoolFolder, boot_id: str, gone: list[LateStage] | None = None) -> list[LateStage]:
    """The boot's stages whose late output is still recorded.

    Registrations whose late-output process is gone (killed) are removed, and added to ``gone``.
    """
    out = []
    for token, text in folder.late_registrations():
        try:
            boot, pid, *stage = text.split(" ", 2)
        except ValueError:
            continue
        if boot != boot_id:
            continue
        st = LateStage(token, stage[0] if stage else "?", int(pid) if pid.isdigit() else 0)
        try:
            os.kill(st.late_pid, 0) if st.late_pid > 0 else None
        except OSError:
            folder.unregister_late_stage(token)  # its process is gone
            if gone is not None:
                gone.append(st)
            continue
        out.append(st)
    return out


def still_writing(stage: LateStage, paths: set[str] | None = None) -> str:
    """'stage benchmark (pid 12 (sh daemon.sh /var/log/d.log))': what still writes a stage's late output (carries
    its token, or holds one of ``paths`` open for writing)."""
    pids = set(carriers({stage.token}).get(stage.token, []))
    for held in writers(paths or set()).values():
        pids.update(held)
    return f"stage {stage.stage}" + (f" ({describe(sorted(pids))})" if pids else "")


def settle_late_output(folder: SpoolFolder, boot_id: str, wait: float) -> list[str]:
    """Before a seal: wait until the boot's late output is all spooled; say what still wrote it after ``wait``.

    Each handed-off stage of the boot is recorded until nothing that can still write its
    late output is left: every holder of its pipes closed them, and every process the
    stage started that could write its followed files exited (quiet is not an end: a daemon
    loading its parameters is quiet for seconds, then fails). After ``wait`` seconds the
    late-output process spools what it has and stops recording; what still ran then is
    returned ('stage benchmark (pid 12 (...))'), and what it writes later is passed on but
    not recorded. Returns [] when the boot's late output is complete.
    """
    gone: list[LateStage] = []
    late = late_stages(folder, boot_id, gone)
    if not late and not gone:
        return []
    folder.request_seal(boot_id, f"{os.getpid()} {wait}")  # its pid (a seal killed while it waits asks nothing), wait
    deadline = time.monotonic() + wait + 5.0
    while late and time.monotonic() < deadline:
        time.sleep(POLL_S)
        late = late_stages(folder, boot_id, gone)
    folder.end_seal_request(boot_id)
    left = [
        f"stage {st.stage} (its late-output process, pid {st.late_pid}, is gone: what the stage's leftovers "
        "write is passed on by the keeper, unrecorded)"
        for st in gone
    ]
    left += folder.take_late_lefts(boot_id)
    if late:  # the late-output process did not answer in time: name what it still records
        log.warning("%d stages of boot %s did not stop recording late output in time", len(late), boot_id)
        left += [f"{still_writing(st)}, after waiting {wait:g}s" for st in late]
    return left
