"""The keeper: a small process holding copies of the late-output pipes, which passes them on if that process dies.

Guarantee: a daemon a stage left behind never dies of SIGPIPE because the late-output
process died (the OOM killer, ``kill -9``, a crash). While the late-output process runs,
the keeper only holds copies of each pipe's read end and of the output it is passed on
to, and never reads. When the late-output process ends normally it says so and the
keeper exits; when it is gone without saying so, the keeper passes every pipe on to its
output until the pipe's last writer closes it. Those bytes are no longer recorded: the
keeper says so in ``late.log`` (with how many bytes it passed on) and leaves, every few seconds
and at its end, a note per stage of the lines and bytes it passed on unrecorded
(``late-lost-BOOT-...`` in the spool folder), which the instance's next agent turns into an event
of the boot (:func:`take_late_losses`).

It is forked by the late-output process before that starts any thread, and holds only its
socket to it until it takes over.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import socket
import struct
import time
from pathlib import Path

from flightrec.producer.spoolfolder import SpoolFolder

__all__ = ["Keeper", "take_late_losses"]

_KEEP, _RELEASE, _END = b"K", b"R", b"E"
_MSG = struct.Struct("=ci")  # kind, the late-output process's number of the pipe; a KEEP is followed by boot\tstage
CHUNK = 1 << 16
TITLE = "flightrec-agent keeper"
NOTE_EVERY_S = 5.0


class Keeper:
    """The late-output process's side: fork the keeper, hand it copies, release them, end it."""

    def __init__(self, folder: SpoolFolder) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        pid = os.fork()
        if pid == 0:  # the keeper
            ours.close()
            code = 1
            try:
                _serve(theirs, folder)
                code = 0
            finally:
                os._exit(code)
        theirs.close()
        self.pid = pid
        self.sock = ours

    def _send(self, kind: bytes, key: int, fds: list[int] | None = None, extra: bytes = b"") -> None:
        try:
            if fds:
                socket.send_fds(self.sock, [_MSG.pack(kind, key) + extra], fds)
            else:
                self.sock.send(_MSG.pack(kind, key) + extra)
        except OSError:  # the keeper is gone: the pipes are simply not kept
            pass

    def keep(self, fd: int, out_fd: int | None, boot_id: str = "", stage: str = "") -> None:
        """Give the keeper copies of pipe ``fd`` and of the output it is passed on to (if any), and whose they are."""
        meta = f"{boot_id}\t{stage}".encode("utf-8", "backslashreplace")[:2048]
        self._send(_KEEP, fd, [fd] + ([out_fd] if out_fd is not None else []), meta)

    def release(self, fd: int) -> None:
        """Pipe ``fd`` was read to its end: the keeper drops its copies."""
        self._send(_RELEASE, fd)

    def end(self) -> None:
        """The late-output process ends normally: the keeper exits without taking over."""
        self._send(_END, 0)
        self.sock.close()
        with contextlib.suppress(ChildProcessError):
            os.waitpid(self.pid, 0)


def _close_all_but(keep: int) -> None:
    for fd in (int(name) for name in os.listdir("/proc/self/fd")):
        if fd > 2 and fd != keep:
            with contextlib.suppress(OSError):
                os.close(fd)


def _serve(sock: socket.socket, folder: SpoolFolder) -> None:
    """The keeper's life: hold copies until told to end, or take over when the late-output process is gone."""
    try:
        from setproctitle import setproctitle

        setproctitle(TITLE)
    except ImportError:
        pass
    _close_all_but(sock.fileno())
    held: dict[int, tuple[int, int | None]] = {}
    owners: dict[int, tuple[str, str]] = {}  # pipe -> (boot, stage)
    while True:
        try:
            msg, fds, _flags, _addr = socket.recv_fds(sock, _MSG.size + 2048, 2)
        except InterruptedError:
            continue
        except OSError:
            msg, fds = b"", []
        if not msg:
            break  # the late-output process is gone without ending
        kind, key = _MSG.unpack(msg[: _MSG.size])
        if kind == _KEEP and fds:
            _drop(held.pop(key, None))
            held[key] = (fds[0], fds[1] if len(fds) > 1 else None)
            boot, _, stage = msg[_MSG.size :].decode("utf-8", "replace").partition("\t")
            owners[held[key][0]] = (boot, stage)
        elif kind == _RELEASE:
            _drop(held.pop(key, None))
        elif kind == _END:
            return
    sock.close()
    if held:
        _take_over(list(held.values()), folder, owners)


def _drop(pair: tuple[int, int | None] | None) -> None:
    if pair is None:
        return
    for fd in pair:
        if fd is not None:
            os.close(fd)


def _say(folder: SpoolFolder, text: str) -> None:
    folder.append_late_log(f"flightrec keeper {os.getpid()}: {text}")


def _note(
    folder: SpoolFolder, counts: dict[tuple[str, str], list[int]], noted: dict[tuple[str, str], list[int]]
) -> None:
    """Leave a note per stage of what was passed on unrecorded since the last note (read by the next agent)."""
    for (boot, stage), (lines, size) in counts.items():
        before = noted.setdefault((boot, stage), [0, 0])
        if (lines, size) == tuple(before) or not boot:
            continue
        note = {"boot_id": boot, "stage": stage, "lines": lines - before[0], "bytes": size - before[1]}
        try:
            folder.write_late_lost(boot, time.monotonic_ns(), json.dumps(note))
            noted[(boot, stage)] = [lines, size]
        except OSError:
            pass


def take_late_losses(folder: SpoolFolder, boot_id: str) -> tuple[dict[str, tuple[int, int]], list[Path]]:
    """The keepers' notes of the boot: stage -> (lines, bytes) passed on unrecorded, and the note files taken (each
    by one caller only; to remove once an event says so). Notes of other boots are left alone."""
    out: dict[str, tuple[int, int]] = {}
    files = []
    for p, text in folder.take_late_losts(boot_id):  # one agent takes a note, however many look at once
        try:
            note = json.loads(text)
        except ValueError:
            continue
        lines, size = out.get(note.get("stage", "?"), (0, 0))
        out[note.get("stage", "?")] = (lines + int(note.get("lines", 0)), size + int(note.get("bytes", 0)))
        files.append(p)
    return out, files


def _take_over(
    pairs: list[tuple[int, int | None]], folder: SpoolFolder, owners: dict[int, tuple[str, str]] | None = None
) -> None:
    """Pass every pipe on to its output until its last writer closes it; record nothing, but count it per stage."""
    _say(
        folder,
        f"the late-output process died: {len(pairs)} pipes of the stages' leftovers are passed on "
        "but no longer recorded",
    )
    owners = owners or {}
    outs = dict(pairs)
    poller = select.poll()
    for fd in outs:
        poller.register(fd, select.POLLIN | select.POLLHUP | select.POLLERR)
    passed = 0
    counts: dict[tuple[str, str], list[int]] = {owners.get(fd, ("", "")): [0, 0] for fd in outs}
    noted: dict[tuple[str, str], list[int]] = {}
    last_note = time.monotonic()
    while outs:
        if time.monotonic() - last_note >= NOTE_EVERY_S:
            _note(folder, counts, noted)
            last_note = time.monotonic()
        for fd, _ev in poller.poll(int(NOTE_EVERY_S * 1000)):
            try:
                data = os.read(fd, CHUNK)
            except OSError:
                data = b""  # a pty master reads EIO once every holder closed it
            out = outs.get(fd)
            if not data:
                poller.unregister(fd)
                _drop((fd, outs.pop(fd)))
                continue
            passed += len(data)
            c = counts.setdefault(owners.get(fd, ("", "")), [0, 0])
            c[0] += data.count(b"\n")
            c[1] += len(data)
            if out is None:
                continue
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(out, view) :]
            except OSError:  # its reader went away: read on (the writer never gets SIGPIPE), pass on nothing
                os.close(out)
                outs[fd] = None
    _note(folder, counts, noted)
    _say(folder, f"every leftover closed its pipes; {passed:,} bytes were passed on unrecorded")
