"""Late output: after CMD exits, a small process of its own keeps passing on and recording what its leftovers write."""

from __future__ import annotations

import logging
import os
import pickle
import select
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from flightrec.settings import Settings

log = logging.getLogger(__name__)

TOKEN_ENV = "FLIGHTREC_STAGE_TOKEN"  # set in CMD's environment: marks the processes the stage started
CHUNK = 1 << 20
POLL_S = 0.05
HOLDER_SCAN_S = 1.0  # how often /proc is scanned for processes the stage started
QUIET_S = 1.0  # a seal waits until late output was quiet this long (or FLIGHTREC_LATE_WAIT passed)


@dataclass(frozen=True)
class HandedPipe:
    """One of CMD's outputs (a pipe or a pty master) that a leftover process still holds open."""

    fd: int
    out_fd: int | None  # where the bytes go on (1, 2) or None
    source: str
    pid: int
    next_no: int
    pending: bytes = b""
    overflow: bool = False
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


@dataclass(frozen=True)
class Handoff:
    """Everything the late-output process needs: where to spool, which stage, what to read."""

    settings: Settings
    stage: str
    boot_id: str
    token: str
    pipes: Sequence[HandedPipe] = ()
    files: Sequence[HandedFile] = field(default_factory=tuple)

    def fds(self) -> list[int]:
        return [p.fd for p in self.pipes] + [f.fd for f in self.files if f.fd is not None]


def hand_off(h: Handoff, spool_dir: Path) -> int:
    """Start the late-output process with ``h``'s fds; return its pid (the caller then closes its own copies).

    It is registered in the spool folder at once, so a seal that follows waits for it.
    """
    proc = subprocess.Popen([sys.executable, "-m", "flightrec.producer.late"], stdin=subprocess.PIPE,
                            pass_fds=h.fds(), start_new_session=True, close_fds=True)
    (spool_dir / f"late-{proc.pid}").write_text(h.boot_id)
    assert proc.stdin is not None
    proc.stdin.write(pickle.dumps(h))
    proc.stdin.close()
    return proc.pid


def stage_alive(token: str) -> bool:
    """Whether a process carrying the stage's token (one the stage started, or its descendants) still runs."""
    needle = f"{TOKEN_ENV}={token}\0".encode()
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if needle in f.read() + b"\0":
                    with open(f"/proc/{pid}/stat", "rb") as st:
                        if st.read().rsplit(b")", 1)[1].split()[0] != b"Z":
                            return True
        except OSError:
            continue
    return False


def _registered(spool_dir: Path, boot_id: str) -> list[Path]:
    out = []
    for p in spool_dir.glob("late-*"):
        try:
            if p.read_text() != boot_id:
                continue
            os.kill(int(p.name[5:]), 0)
            out.append(p)
        except (OSError, ValueError):
            p.unlink(missing_ok=True)  # its process is gone
    return out


def settle_late_output(spool_dir: Path, boot_id: str, wait: float) -> int:
    """Before a seal: ask this boot's late-output processes to spool what they have and stop recording.

    Each one goes on recording until its output was quiet for 1 s or ``wait`` s passed,
    then spools its last lines and stops recording (it still passes bytes on). Returns
    how many were still recording when this gave up (0: the boot's late output is all spooled).
    """
    late = _registered(spool_dir, boot_id)
    if not late:
        return 0
    (spool_dir / f"seal-request-{boot_id}").touch()
    deadline = time.monotonic() + wait + 5.0
    while late and time.monotonic() < deadline:
        time.sleep(POLL_S)
        late = _registered(spool_dir, boot_id)
    if late:
        log.warning("%d late-output processes of boot %s did not stop recording in time", len(late), boot_id)
    return len(late)


class _Late:
    """The late-output loop (in its own process)."""

    def __init__(self, h: Handoff) -> None:
        from flightrec.producer.agent import SyncAgent
        from flightrec.producer.follow import FileFollower
        from flightrec.producer.run import SourceBatcher

        self.h = h
        s = h.settings
        self.agent: SyncAgent | None = SyncAgent(instance_id=s.instance, settings=s)
        self.agent.__enter__()
        self.reg = self.agent.spool.dir / f"late-{os.getpid()}"
        self.reg.write_text(h.boot_id)
        self.request = self.agent.spool.dir / f"seal-request-{h.boot_id}"
        kw = dict(max_line=s.max_line, tail_lines=0)
        self.pipes = {}
        for p in h.pipes:
            b = SourceBatcher(self.agent, h.stage, p.source, p.pid, **kw)
            b.resume(p.next_no, p.pending, p.overflow, late=not p.early)
            self.pipes[p.fd] = (p, b)
        self.files = []
        for f in h.files:
            follower = FileFollower(f.path)
            follower.resume(f.fd, f.offset, f.ino, f.exists)
            b = SourceBatcher(self.agent, h.stage, f.path, 0, **kw)
            b.resume(f.next_no, f.pending, f.overflow, late=True)
            self.files.append((follower, b))
        self.recording = True
        self.last_data = time.monotonic()
        self.holders_seen = time.monotonic()
        self.request_seen: float | None = None

    def _stop_recording(self) -> None:
        if not self.recording:
            return
        self.recording = False
        for _p, b in self.pipes.values():
            b.close()
        for follower, b in self.files:
            follower.close()
            b.close()
        self.files = []
        self.reg.unlink(missing_ok=True)  # every line is spooled: a seal may go on
        if self.agent is not None:
            self.agent.close()
            self.agent = None

    def _read_pipe(self, fd: int) -> None:
        p, b = self.pipes[fd]
        try:
            data = os.read(fd, CHUNK)
        except OSError:
            data = b""  # a pty master reads EIO once every holder closed it
        if not data:
            del self.pipes[fd]
            self.poller.unregister(fd)
            os.close(fd)
            if self.recording:
                b.close()
            return
        self.last_data = time.monotonic()
        if p.out_fd is not None:
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(p.out_fd, view):]
            except OSError:
                self.pipes[fd] = (HandedPipe(**{**p.__dict__, "out_fd": None}), b)
        if self.recording:
            parts = [data]
            if p.early:  # written before CMD exited, read only now
                parts = [data[:p.early], data[p.early:]]
                self.pipes[fd] = (HandedPipe(**{**p.__dict__, "early": max(0, p.early - len(data))}), b)
            for i, part in enumerate(parts):
                b.late = i == len(parts) - 1
                if p.strip:
                    from flightrec.producer.term import strip_control
                    part = strip_control(part)
                if part:
                    b.feed(part)

    def _yield_claimed(self) -> None:
        """Stop following a file that a later stage of the boot follows now (flightrec.producer.claims).

        Looked at right before every read, so this process reads past the later stage's starting
        offset only if that stage starts in the microseconds between this look and the read.
        """
        if self.agent is None:
            return
        from flightrec.producer.claims import read_claim

        for follower, _b in self.files:
            claim = read_claim(self.agent.spool.dir, self.h.boot_id, follower.path)
            if claim is not None and claim.token != self.h.token:
                follower.stop_at(claim.ino, claim.offset)

    def _files_still_written(self, now: float) -> bool:
        if self.pipes:
            return True
        if now - self.holders_seen >= HOLDER_SCAN_S:
            if stage_alive(self.h.token):
                self.holders_seen = now
            elif now - self.last_data < self.h.settings.follow_grace:
                pass
            else:
                return False
        return True

    def run(self) -> None:
        self.poller = select.poll()
        for fd in self.pipes:
            self.poller.register(fd, select.POLLIN | select.POLLHUP | select.POLLERR)
        self.holders_seen = time.monotonic()
        while self.pipes or (self.recording and self.files):
            for fd, _ev in self.poller.poll(POLL_S * 1000):
                if fd in self.pipes:
                    self._read_pipe(fd)
            now = time.monotonic()
            if not self.recording:
                continue
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
            if self.files and not self._files_still_written(now):
                for follower, b in self.files:
                    follower.close()
                    b.close()
                self.files = []
            if self.request_seen is None and self.request.exists():
                self.request_seen = now
            if self.request_seen is not None and (now - self.last_data >= QUIET_S
                                                  or now - self.request_seen >= self.h.settings.late_wait):
                self._stop_recording()
        self._stop_recording()


def main() -> None:
    """Entry point of the late-output process: the hand-off comes pickled on stdin."""
    h: Handoff = pickle.loads(sys.stdin.buffer.read())
    os.close(0)
    os.open(os.devnull, os.O_RDONLY)
    try:
        from setproctitle import setproctitle
        setproctitle(f"flightrec-agent stage={h.stage} late-output")
    except ImportError:
        pass
    for s in (signal.SIGINT, signal.SIGQUIT, signal.SIGHUP, signal.SIGTSTP, signal.SIGTTIN, signal.SIGTTOU):
        signal.signal(s, signal.SIG_IGN)  # a leftover's output must not be cut off by its stage's signals
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    logging.basicConfig(level=h.settings.log_level, format="flightrec late-output: %(message)s")
    _Late(h).run()


if __name__ == "__main__":
    main()
