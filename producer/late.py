"""Late output: after CMD exits, one shared process per instance keeps passing on and recording what leftovers write."""

from __future__ import annotations

import dataclasses
import logging
import logging.handlers
import os
import select
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Any

from flightrec.producer.agent import SyncAgent
from flightrec.producer.batcher import LineSink
from flightrec.producer.handoff import (
    CHUNK,
    HOLDER_SCAN_S,
    MAX_FDS,
    POLL_S,
    SEAL_SCAN_S,
    HandedPipe,
    Handoff,
    HandoffError,
    LateStage,
    decode,
    still_writing,
)
from flightrec.producer.pump import GATHER_BELOW, GATHER_S
from flightrec.producer.spoolfolder import SpoolFolder
from flightrec.producer.tokens import alive_tokens
from flightrec.producer.writers import writers

log = logging.getLogger(__name__)


def _request(request: str | None) -> tuple[bool, float | None]:
    """(whether the seal that wrote ``request`` still waits, how long it waits): a killed seal stops nothing, and
    a seal's own FLIGHTREC_LATE_WAIT bounds the stages it waits for."""
    if request is None:  # being written, or gone: assume it waits
        return True, None
    try:
        pid, wait = request.split()
        os.kill(int(pid), 0)
        return True, float(wait)
    except ProcessLookupError:
        return False, None
    except (OSError, ValueError):  # being written, gone, or a pid we may not signal: assume it waits
        return True, None


class _Stage:
    """One handed-off stage in the late-output process: its pipes, followed files and batchers."""

    def __init__(self, h: Handoff, sink: LineSink, folder: SpoolFolder) -> None:
        from flightrec.producer.batcher import SourceBatcher
        from flightrec.producer.follow import FileFollower

        self.h = h
        self.folder = folder
        s = h.settings
        kw: dict[str, Any] = dict(max_line=s.max_line, tail_lines=0, boot=h.boot_id)
        self.pipes: dict[int, tuple[HandedPipe, Any]] = {}
        for p in h.pipes:
            b = SourceBatcher(sink, h.stage, p.source, p.pid, **kw)
            b.resume(p.next_no, p.pending, p.overflow, p.carry, late=not p.early)
            self.pipes[p.fd] = (p, b)
        self.files: list[tuple[Any, Any]] = []
        for f in h.files:
            follower = FileFollower(f.path)
            follower.resume(f.fd, f.offset, f.ino, f.exists)
            b = SourceBatcher(sink, h.stage, f.path, 0, **kw)
            b.resume(f.next_no, f.pending, f.overflow, f.carry, late=True)
            self.files.append((follower, b))
        self.recording = True
        self.last_data = time.monotonic()
        self.holders_seen = time.monotonic()
        self.request_seen: float | None = None
        self.unrecorded_lines = 0  # lines passed on after a seal stopped recording the stage
        self.bytes_read = self.reads = 0  # of the stage's pipes

    @property
    def done(self) -> bool:
        return not self.pipes and not (self.recording and self.files)

    def stop_recording(self, left: str | None = None) -> None:
        """Spool every line of the stage and stop recording it (its pipes are still passed on).

        ``left``: what still writes the stage's output (a seal stopped waiting for it); noted for the seal.
        """
        if not self.recording:
            return
        self.recording = False
        if left is not None:
            try:
                self.folder.note_late_left(self.h.boot_id, self.h.token, left)
            except OSError as exc:
                log.warning("cannot note what still writes stage %s for the seal: %s", self.h.stage, exc)
        for _p, b in self.pipes.values():
            b.close()
        self.close_files()
        self.folder.unregister_late_stage(self.h.token)  # every line of the stage is spooled: a seal may go on

    def close_files(self) -> None:
        for follower, b in self.files:
            follower.close()
            b.close()
        self.files = []

    def read_pipe(self, fd: int) -> int:
        """Pass on and record what the pipe holds: the bytes read; 0 once every holder closed it (then it is closed
        here)."""
        p, b = self.pipes[fd]
        try:
            data = os.read(fd, CHUNK)
        except OSError:
            data = b""  # a pty master reads EIO once every holder closed it
        if not data:
            del self.pipes[fd]
            os.close(fd)
            if p.out_fd is not None:
                os.close(p.out_fd)
            if self.recording:
                b.close()
            return 0
        self.last_data = time.monotonic()
        self.bytes_read += len(data)
        self.reads += 1
        if p.out_fd is not None:
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(p.out_fd, view) :]
            except OSError:  # its reader went away: it is no longer passed on (the leftover never gets SIGPIPE)
                os.close(p.out_fd)
                p = dataclasses.replace(p, out_fd=None)
                self.pipes[fd] = (p, b)
        if not self.recording:
            self.unrecorded_lines += data.count(b"\n")
        else:
            parts = [data]
            if p.early:  # written before CMD exited, read only now
                parts = [data[: p.early], data[p.early :]]
                self.pipes[fd] = (dataclasses.replace(p, early=max(0, p.early - len(data))), b)
            for i, part in enumerate(parts):
                b.late = i == len(parts) - 1
                if p.strip:
                    from flightrec.producer.term import strip_control

                    part = strip_control(part)
                if part:
                    b.feed(part)
        return len(data)

    def _yield_claimed(self) -> None:
        """Stop following a file that a later stage of the boot follows now (flightrec.producer.claims).

        Looked at right before every read, so this process reads past the later stage's starting
        offset only if that stage starts in the microseconds between this look and the read.
        """
        from flightrec.producer.claims import read_claim

        for follower, _b in self.files:
            claim = read_claim(self.folder, self.h.boot_id, follower.path)
            if claim is not None and claim.token != self.h.token:
                follower.stop_at(claim.ino, claim.offset)

    def step(self, now: float, alive: set[str] | None) -> None:
        """Follow the files, spool due batches, end following and recording when their time came."""
        if not self.recording:
            return
        if self.files:
            self._yield_claimed()
        for follower, b in self.files:
            for chunk in follower.poll():
                if chunk is None:
                    b.end_of_file()
                else:
                    self.last_data = now
                    b.feed(chunk)
        if any(f.done for f, _b in self.files):  # taken over by a later stage: it ships the rest
            for follower, b in [x for x in self.files if x[0].done]:
                follower.close()
                b.close()
            self.files = [x for x in self.files if not x[0].done]
        for _p, b in self.pipes.values():
            b.tick()
        for _f, b in self.files:
            b.tick()
        if self.request_seen is None and self.folder.seal_requested(self.h.boot_id):
            self.request_seen = now
        wait = self.h.settings.late_wait
        if self.request_seen is not None:
            waiting, asked = _request(self.folder.seal_request_text(self.h.boot_id))
            if not waiting:
                self.request_seen = None  # the seal was killed while it waited: record on as before
            elif asked is not None:
                wait = min(wait, asked)
        if self.files and not self.pipes and alive is not None:
            if self.h.token in alive:
                self.holders_seen = now
            elif self.request_seen is not None:  # a seal waits: nothing that could write the files is left
                self.close_files()  # (the scan came before this step's read: the writers' last bytes are in)
            elif now - self.last_data >= self.h.settings.follow_grace and now - self.holders_seen >= HOLDER_SCAN_S:
                self.close_files()  # nothing the stage started runs any more, and the files are quiet
        if self.request_seen is not None and now - self.request_seen >= wait:
            left = still_writing(LateStage(self.h.token, self.h.stage, os.getpid()), {f.path for f, _b in self.files})
            self.stop_recording(f"{left}, after waiting {wait:g}s")


def _busy(stages: list[_Stage]) -> set[str]:
    """The tokens of ``stages`` whose followed files something can still write: a process carrying the token, or
    one holding a followed file open for writing (its environment may no longer show the token)."""
    busy = alive_tokens({st.h.token for st in stages})
    paths = {follower.path for st in stages if st.h.token not in busy for follower, _b in st.files}
    held = writers(paths)
    return busy | {st.h.token for st in stages if any(follower.path in held for follower, _b in st.files)}


class _Late:
    """The late-output loop: takes hand-offs on its socket and serves every handed-off stage until none is left."""

    def __init__(self, folder: SpoolFolder, listener: socket.socket, keeper: Any = None) -> None:
        self.folder = folder
        self.listener = listener
        self.keeper = keeper  # a Keeper (flightrec.producer.keeper): it holds copies of the pipes
        self.listener.setblocking(False)
        self.stages: list[_Stage] = []
        self.by_fd: dict[int, _Stage] = {}
        self.agent: Any = None
        self.poller = select.poll()
        self.poller.register(listener.fileno(), select.POLLIN)
        self.scanned = 0.0

    def _take(self, conn: socket.socket) -> None:
        """One hand-off: its JSON message (handoff.encode) and its fds."""
        conn.settimeout(10)
        data, fds, _flags, _addr = socket.recv_fds(conn, 1 << 16, MAX_FDS)
        while chunk := conn.recv(1 << 16):
            data += chunk
        try:
            h: Handoff = decode(data).with_fds(fds)
        except HandoffError:
            for fd in fds:
                os.close(fd)
            raise
        if self.agent is None:
            self.agent = SyncAgent(instance_id=h.settings.instance, settings=h.settings)
            self.agent.__enter__()
        st = _Stage(h, self.agent.line_sink(), self.folder)
        self.stages.append(st)
        for fd, (p, _b) in st.pipes.items():
            self.by_fd[fd] = st
            if self.keeper is not None:
                self.keeper.keep(fd, p.out_fd, h.boot_id, h.stage)
            self.poller.register(fd, select.POLLIN | select.POLLHUP | select.POLLERR)
        log.info("stage %s (boot %s) handed off: %d pipes, %d files", h.stage, h.boot_id, len(h.pipes), len(h.files))

    def _accept_all(self) -> int:
        n = 0
        while True:
            try:
                conn, _ = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return n
            n += 1
            with conn:
                try:
                    self._take(conn)
                except Exception:  # one broken hand-off must not end the others' recording
                    log.exception("a hand-off could not be taken")

    def _may_end(self) -> bool:
        """No stage left: end, unless a hand-off came meanwhile (checked under the lock hand-offs take)."""
        with self.folder.late_locked():
            if self._accept_all():
                return False
            self.listener.close()  # from here on a hand-off starts a new process
            self.folder.clear_late_pid()
        return True

    def run(self) -> None:
        try:
            while True:
                largest = -1  # the largest read of this round (-1: none)
                for fd, _ev in self.poller.poll(POLL_S * 1000):
                    if fd == self.listener.fileno():
                        self._accept_all()
                    elif fd in self.by_fd:
                        got = self.by_fd[fd].read_pipe(fd)
                        largest = max(largest, got)
                        if not got:
                            self.poller.unregister(fd)
                            del self.by_fd[fd]
                            if self.keeper is not None:
                                self.keeper.release(fd)
                if 0 < largest < GATHER_BELOW:
                    time.sleep(GATHER_S)  # the leftovers' next lines gather in their pipes meanwhile
                now = time.monotonic()
                alive = None
                sealing = any(st.request_seen is not None for st in self.stages)
                if now - self.scanned >= (SEAL_SCAN_S if sealing else HOLDER_SCAN_S):  # one /proc scan for all
                    watched = [st for st in self.stages if st.recording and st.files and not st.pipes]
                    if watched:
                        alive, self.scanned = _busy(watched), now
                for st in self.stages:
                    st.step(now, alive)
                for st in [st for st in self.stages if st.done]:
                    st.stop_recording()
                    self.stages.remove(st)
                    log.info(
                        "stage %s (boot %s): %d bytes read in %d reads",
                        st.h.stage,
                        st.h.boot_id,
                        st.bytes_read,
                        st.reads,
                    )
                    if st.unrecorded_lines:
                        log.warning(
                            "stage %s (boot %s): %d lines passed on after the seal were not recorded",
                            st.h.stage,
                            st.h.boot_id,
                            st.unrecorded_lines,
                        )
                if not self.stages and self._may_end():
                    if self.keeper is not None:
                        self.keeper.end()
                    break
        finally:  # ended with stages left (a crash): the keeper passes their pipes on once this process is gone
            for st in self.stages:
                st.stop_recording()
            if self.agent is not None:
                self.agent.close()


def main() -> None:
    """Entry point of the late-output process: ``python -m flightrec.producer.late SPOOL_DIR LISTENER_FD``."""
    folder, fd = SpoolFolder(Path(sys.argv[1])), int(sys.argv[2])
    try:
        from setproctitle import setproctitle

        setproctitle("flightrec-agent late-output")
    except ImportError:
        pass
    for s in (signal.SIGINT, signal.SIGQUIT, signal.SIGHUP, signal.SIGTSTP, signal.SIGTTIN, signal.SIGTTOU):
        signal.signal(s, signal.SIG_IGN)  # a leftover's output must not be cut off by its stage's signals
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    handler = folder.late_log_handler()
    logging.basicConfig(
        level=os.environ.get("FLIGHTREC_LOG_LEVEL", "INFO").upper(),
        handlers=[handler],
        format="%(asctime)s flightrec late-output %(process)d: %(message)s",
    )
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)  # the deliverer names a broker that is away, once
    from flightrec.producer.keeper import Keeper

    keeper = Keeper(folder)  # forked now, before any thread starts
    try:
        _Late(folder, socket.socket(fileno=fd), keeper).run()
    except Exception:  # its stderr is /dev/null: say it where someone can read it
        log.exception("the late-output process failed; the leftovers' output is passed on by the keeper, unrecorded")
        raise


if __name__ == "__main__":
    main()
