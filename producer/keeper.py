"""The keeper: a small process holding copies of the late-output pipes, which passes them on if that process dies.

Guarantee: a daemon a stage left behind never dies of SIGPIPE because the late-output
process died (the OOM killer, ``kill -9``, a crash). While the late-output process runs,
the keeper only holds copies of each pipe's read end and of the output it is passed on
to, and never reads. When the late-output process ends normally it says so and the
keeper exits; when it is gone without saying so, the keeper passes every pipe on to its
output until the pipe's last writer closes it. Those bytes are no longer recorded: the
keeper says so in ``late.log`` (with how many bytes it passed on) and does nothing else.

It is forked by the late-output process before that starts any thread, and holds only its
socket to it until it takes over.
"""

from __future__ import annotations

import os
import select
import socket
import struct
import time
from pathlib import Path

__all__ = ["Keeper"]

_KEEP, _RELEASE, _END = b"K", b"R", b"E"
_MSG = struct.Struct("=ci")  # kind, the late-output process's number of the pipe
CHUNK = 1 << 16
TITLE = "flightrec-agent keeper"


class Keeper:
    """The late-output process's side: fork the keeper, hand it copies, release them, end it."""

    def __init__(self, log_path: Path) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        pid = os.fork()
        if pid == 0:  # the keeper
            ours.close()
            code = 1
            try:
                _serve(theirs, log_path)
                code = 0
            finally:
                os._exit(code)
        theirs.close()
        self.pid = pid
        self.sock = ours

    def _send(self, kind: bytes, key: int, fds: list[int] | None = None) -> None:
        try:
            if fds:
                socket.send_fds(self.sock, [_MSG.pack(kind, key)], fds)
            else:
                self.sock.send(_MSG.pack(kind, key))
        except OSError:  # the keeper is gone: the pipes are simply not kept
            pass

    def keep(self, fd: int, out_fd: int | None) -> None:
        """Give the keeper copies of pipe ``fd`` and of the output it is passed on to (if any)."""
        self._send(_KEEP, fd, [fd] + ([out_fd] if out_fd is not None else []))

    def release(self, fd: int) -> None:
        """Pipe ``fd`` was read to its end: the keeper drops its copies."""
        self._send(_RELEASE, fd)

    def end(self) -> None:
        """The late-output process ends normally: the keeper exits without taking over."""
        self._send(_END, 0)
        self.sock.close()
        try:
            os.waitpid(self.pid, 0)
        except ChildProcessError:
            pass


def _close_all_but(keep: int) -> None:
    for fd in (int(name) for name in os.listdir("/proc/self/fd")):
        if fd > 2 and fd != keep:
            try:
                os.close(fd)
            except OSError:
                pass


def _serve(sock: socket.socket, log_path: Path) -> None:
    """The keeper's life: hold copies until told to end, or take over when the late-output process is gone."""
    try:
        from setproctitle import setproctitle
        setproctitle(TITLE)
    except ImportError:
        pass
    _close_all_but(sock.fileno())
    held: dict[int, tuple[int, int | None]] = {}
    while True:
        try:
            msg, fds, _flags, _addr = socket.recv_fds(sock, _MSG.size, 2)
        except InterruptedError:
            continue
        except OSError:
            msg, fds = b"", []
        if not msg:
            break  # the late-output process is gone without ending
        kind, key = _MSG.unpack(msg)
        if kind == _KEEP and fds:
            _drop(held.pop(key, None))
            held[key] = (fds[0], fds[1] if len(fds) > 1 else None)
        elif kind == _RELEASE:
            _drop(held.pop(key, None))
        elif kind == _END:
            return
    sock.close()
    if held:
        _take_over(list(held.values()), log_path)


def _drop(pair: tuple[int, int | None] | None) -> None:
    if pair is None:
        return
    for fd in pair:
        if fd is not None:
            os.close(fd)


def _say(log_path: Path, text: str) -> None:
    try:
        with open(log_path, "a") as f:
            f.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} flightrec keeper {os.getpid()}: {text}\n")
    except OSError:
        pass


def _take_over(pairs: list[tuple[int, int | None]], log_path: Path) -> None:
    """Pass every pipe on to its output until its last writer closes it; record nothing."""
    _say(log_path, f"the late-output process died: {len(pairs)} pipes of the stages' leftovers are passed on "
                   "but no longer recorded")
    outs = dict(pairs)
    poller = select.poll()
    for fd in outs:
        poller.register(fd, select.POLLIN | select.POLLHUP | select.POLLERR)
    passed = 0
    while outs:
        for fd, _ev in poller.poll():
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
            if out is None:
                continue
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(out, view):]
            except OSError:  # its reader went away: read on (the writer never gets SIGPIPE), pass on nothing
                os.close(out)
                outs[fd] = None
    _say(log_path, f"every leftover closed its pipes; {passed:,} bytes were passed on unrecorded")
