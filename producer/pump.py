"""The pump: copies one output of CMD (a pipe, or a pty's master) to the agent's own fd byte for byte, and feeds the
output's line source (flightrec.producer.batcher) as it goes; its reading pace."""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import select
import struct
import termios
import threading

from flightrec.producer.batcher import SourceBatcher
from flightrec.producer.term import read_eof, strip_control

log = logging.getLogger(__name__)

CHUNK = 1 << 20  # the most one read takes
PIPE_SIZE = 1 << 20  # the room asked for in CMD's pipes: bursts wait there while a batch is spooled
# A command that writes each line with a write of its own (a flush per line: stderr, print(flush=True), most loggers)
# would be read a line at a time, and a read per line costs the agent many times the CPU of its share of a block
# (BENCHMARKS.md, Agent: the write-per-line runs of benchmarks/bench_agent.py). After a read of less than GATHER_BELOW
# bytes, a reader (the pump, and the late-output process for what it reads) waits GATHER_S before it reads again: the
# lines gather in the pipe (PIPE_SIZE: more than the fastest writer fills in GATHER_S) and are read, passed through and
# stamped together, at most GATHER_S late. Output that comes now and then is read at once (only what comes within
# GATHER_S of a read waits).
GATHER_S = 0.002
GATHER_BELOW = 64 * 1024


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


class Pump(threading.Thread):
    """Copies one output of CMD (a pipe, or a pty's master) to our own fd byte for byte, and feeds its batcher."""

    def __init__(self, fd: int, out_fd: int | None, batcher: SourceBatcher, *, strip: bool = False) -> None:
        super().__init__(name=f"flightrec-{batcher.source}", daemon=True)
        self.fd, self.out_fd, self.batcher, self.strip = fd, out_fd, batcher, strip
        self.stop_flag = False
        self.handing_off = False  # stopped to hand the fd to the late-output process: keep it open
        self.eof = False
        self.error: str | None = None
        self.read_total = 0
        self.reads = 0  # reads that returned bytes
        self.late_at: int | None = None  # bytes read past this were written after CMD exited
        self._read_lock = threading.Lock()
        self._fd_open = True
        self._wake_r, self._wake_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        with contextlib.suppress(OSError):
            fcntl.fcntl(fd, 1031, PIPE_SIZE)  # F_SETPIPE_SZ: room for bursts while a batch is spooled

    def mark_exit(self) -> None:
        """CMD exited: what is in the pipe now was written before, whatever comes after is late."""
        with self._read_lock:
            try:
                waiting = struct.unpack("i", fcntl.ioctl(self.fd, termios.FIONREAD, b"\0\0\0\0"))[0]
            except OSError:
                waiting = 0
            self.late_at = self.read_total + waiting

    def writer_gone(self) -> bool:
        """Whether no process holds the other end any more (a pipe's writers, a pty's slave): what is left in it
        was written before, and the pump reaches its end by itself."""
        with self._read_lock:
            if not self._fd_open:
                return True
            poller = select.poll()
            poller.register(self.fd, 0)  # POLLHUP is reported whatever is asked
            return any(ev & (select.POLLHUP | select.POLLERR) for _fd, ev in poller.poll(0))

    def stop(self, *, handing_off: bool = False) -> None:
        """Stop reading at once (``handing_off``: keep the fd open for the late-output process)."""
        self.handing_off = handing_off
        self.stop_flag = True
        with self._read_lock:  # the wake pipe is open until run() ends
            if self._wake_w >= 0:
                os.write(self._wake_w, b"x")

    def _capture(self, call: str, *args: object) -> None:
        if self.error is not None:
            return
        try:
            getattr(self.batcher, call)(*args)
        except Exception as exc:  # capture failed (spool unwritable...): CMD's output must still flow
            self.error = f"{type(exc).__name__}: {exc}"
            log.error("capturing CMD's %s failed, passing it through uncaptured: %s", self.batcher.source, self.error)

    def _read(self) -> tuple[bytes, int]:
        """One read of CMD's output (empty at its end) and where it starts in the output."""
        with self._read_lock:
            try:
                data = os.read(self.fd, CHUNK)
            except OSError as exc:
                if not read_eof(exc):
                    raise
                data = b""
            start, self.read_total = self.read_total, self.read_total + len(data)
        return data, start

    def _feed(self, data: bytes) -> None:
        self._capture("feed", strip_control(data) if self.strip else data)

    def _pass_on(self, data: bytes, start: int) -> bool:
        """Pass ``data`` (read at ``start``) on to our fd and feed it to the batcher; False once our reader went
        away."""
        if self.out_fd is not None:
            try:
                _write_all(self.out_fd, data)
            except BrokenPipeError:
                # our reader went away: CMD gets the same EPIPE/SIGPIPE it would have got
                self._feed(data)
                self.eof = True
                return False
        late_at = self.late_at
        if late_at is not None and not self.batcher.late and start + len(data) > late_at:
            cut = max(0, late_at - start)  # what was in the pipe when CMD exited is not late
            if cut:
                self._feed(data[:cut])
            self.batcher.late = True
            data = data[cut:]
        self._feed(data)
        return True

    def run(self) -> None:
        poller = select.poll()
        poller.register(self.fd, select.POLLIN | select.POLLHUP | select.POLLERR)
        poller.register(self._wake_r, select.POLLIN)  # stop() wakes the pump at once
        waker = select.poll()
        waker.register(self._wake_r, select.POLLIN)
        gather = False
        try:
            while True:
                if gather and not self.stop_flag:
                    waker.poll(GATHER_S * 1000)  # the command's next lines gather in the pipe meanwhile
                left = self.batcher.time_left() if self.error is None else None
                timeout_ms = 100 if left is None else int(left * 1000) + 1
                ready = [fd for fd, _ev in poller.poll(timeout_ms)]
                if self.fd not in ready:
                    self._capture("tick")
                    if self.stop_flag:
                        break
                    continue
                data, start = self._read()
                if not data:
                    self.eof = True
                    break
                self.reads += 1
                gather = len(data) < GATHER_BELOW
                if not self._pass_on(data, start) or self.stop_flag:
                    break
        finally:
            with self._read_lock:
                os.close(self._wake_r)
                os.close(self._wake_w)
                self._wake_w = -1
            if not (self.handing_off and not self.eof):
                with self._read_lock:
                    self._fd_open = False
                    os.close(self.fd)
                self._capture("close")
