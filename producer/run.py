"""`agent run`: run a command as a stage, pass its output through byte for byte, ship its lines and exit."""

from __future__ import annotations

import errno
import logging
import os
import shutil
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from flightrec.producer.agent import SyncAgent
from flightrec.producer.batcher import SourceBatcher
from flightrec.producer.claims import Claim
from flightrec.producer.follow import FileFollower
from flightrec.producer.handoff import HandedFile, HandedPipe, Handoff
from flightrec.producer.heartbeat import heartbeat
from flightrec.producer.pump import Pump
from flightrec.producer.redact import visible
from flightrec.producer.term import (
    FORWARDED,
    Canary,
    PtyPair,
    SignalWatcher,
    StageSignals,
    die_with_parent,
    unblock_in_child,
)
from flightrec.producer.term import block as block_signals
from flightrec.producer.tokens import TOKEN_ENV, stage_alive
from flightrec.producer.writers import writers
from flightrec.schemas import FileTail, ProcessExit, now_us
from setproctitle import setproctitle

log = logging.getLogger(__name__)

FOLLOW_POLL_S = 0.05
FOLLOW_QUIET_S = 0.2  # after CMD exits with nothing of the stage left running, the files were read to their end
PIPE_GRACE_S = 0.1  # after CMD exits, how long its outputs may take to close before a late-output process takes them
# an output nothing holds any more (CMD wrote it all before it exited) is read to its end by the agent, however far
# its reading fell behind (a busy machine, a spool write that waits), for this long at most
DRAIN_MAX_S = 30.0


class _Followers(threading.Thread):
    """Polls every followed file and feeds each one's batcher, until stopped (then drains once more)."""

    def __init__(self, followers: list[tuple[FileFollower, SourceBatcher]]) -> None:
        super().__init__(name="flightrec-follow", daemon=True)
        self.followers = followers
        self.stop_at: float | None = None  # monotonic deadline after CMD's exit
        self.handing_off = False
        self.last_data = time.monotonic()
        self._wake = threading.Event()

    def _poll_all(self) -> bool:
        got = False
        for follower, batcher in self.followers:
            for chunk in follower.poll():
                if chunk is None:
                    batcher.end_of_file()
                else:
                    got = True
                    batcher.feed(chunk)
            batcher.tick()
        return got

    def run(self) -> None:
        try:
            while True:
                if self._poll_all():
                    self.last_data = time.monotonic()
                now = time.monotonic()
                quiet = now - self.last_data >= FOLLOW_QUIET_S  # no writer of the stage is left (see _wait)
                if self.stop_at is not None and (now >= self.stop_at or quiet):
                    break
                self._wake.wait(FOLLOW_POLL_S)
            self._poll_all()
        finally:
            if not self.handing_off:
                for follower, batcher in self.followers:
                    follower.close()
                    batcher.close()

    def finish(self, grace: float, abort: threading.Event) -> None:
        """CMD exited and nothing the stage started runs: read on until the files are read to their end (quiet for
        FOLLOW_QUIET_S), ``grace`` s at most (less on a signal)."""
        self.last_data = max(self.last_data, time.monotonic())
        self.stop_at = time.monotonic() + grace
        while self.is_alive():
            if abort.is_set():
                self.stop_at = 0.0
            self.join(0.05)

    def stop_for_handoff(self) -> None:
        """Stop now, leaving files open and lines unfinished for the late-output process."""
        self.handing_off = True
        self.stop_at = 0.0
        self._wake.set()
        self.join()


@dataclass
class StageResult:
    """How a stage ended: the agent's exit status and the events it sent about the end."""

    exit_status: int
    exit_event: ProcessExit
    lines: dict[str, int] = field(default_factory=dict)
    late_pid: int | None = None  # the late-output process that goes on reading what CMD left behind


def _start_error(exc: OSError, cmd: str) -> tuple[int, str]:
    if isinstance(exc, FileNotFoundError):
        return 127, f"{cmd}: command not found"
    if isinstance(exc, PermissionError):
        return 126, f"{cmd}: permission denied"
    return 126, f"{cmd}: cannot execute: {exc.strerror or exc}"


def _spawn(argv: list[str], env: dict[str, str], ptys: dict[int, PtyPair]) -> subprocess.Popen[bytes]:
    """Start CMD like a shell would: an executable without ``#!`` (ENOEXEC) runs under /bin/sh.

    CMD stays in the agent's process group (as it would be without the agent) and dies with the agent.
    """
    agent = os.getpid()

    def child() -> None:
        unblock_in_child()
        die_with_parent(agent)

    kw: dict = dict(
        env=env,
        bufsize=0,
        preexec_fn=child,
        stdout=ptys[1].slave if 1 in ptys else subprocess.PIPE,
        stderr=ptys[2].slave if 2 in ptys else subprocess.PIPE,
    )
    try:
        return subprocess.Popen(argv, **kw)
    except OSError as exc:
        if exc.errno != errno.ENOEXEC:
            raise
        path = argv[0] if "/" in argv[0] else (shutil.which(argv[0]) or argv[0])
        log.debug("%s has no #! line: running it under /bin/sh as a shell would", path)
        return subprocess.Popen(["/bin/sh", path, *argv[1:]], **kw)


def set_title(stage: str) -> None:
    """Show the agent as ``flightrec-agent stage=NAME`` in ps and to ``pkill -f`` (not the wrapped command line); a
    name that is not UTF-8 shown with its bytes as ``\\xNN`` (as its events record it)."""
    setproctitle(f"flightrec-agent stage={visible(stage)[0]}")


@dataclass
class _Run:
    """What the steps of one :func:`run_stage` share."""

    agent: SyncAgent
    stage: str
    argv: list[str]
    tails: Sequence[str]
    passthrough: bool
    token: str
    env: dict[str, str]
    kw: dict
    follows: list[tuple[FileFollower, SourceBatcher]]
    ptys: dict[int, PtyPair]
    sigs: StageSignals
    started_us: int = 0
    t0: float = 0.0
    proc: subprocess.Popen[bytes] | None = None
    out_b: SourceBatcher | None = None
    err_b: SourceBatcher | None = None
    pumps: list[Pump] = field(default_factory=list)
    follower: _Followers | None = None
    rc: int = 0
    ended_us: int = 0
    duration: float = 0.0
    late_pid: int | None = None


def run_stage(
    agent: SyncAgent,
    stage: str,
    argv: Sequence[str],
    tails: Sequence[str] = (),
    *,
    seal_on_success: bool = False,
    passthrough: bool = True,
) -> StageResult:
    """Run ``argv`` as stage ``stage``; return the status to exit with (CMD's code, or 128+N for signal N).

    Guarantees: CMD inherits stdin, the environment (plus FLIGHTREC_STAGE_TOKEN) and
    the working folder; its stdout/stderr reach ours byte for byte, through a
    pseudo-terminal where ours is a terminal; a signal sent to the agent is passed to
    CMD once, one the terminal already sent CMD's group is not; every line is spooled
    before this returns, except those that processes CMD left behind write later: a
    late-output process goes on with them (``late_pid``), and never cuts them off; the
    stage ends with a ProcessExit and a Lifecycle succeeded/failed event; a CMD that
    cannot start gives 127/126 and says why.
    """
    r = _prepare(agent, stage, list(argv), tails, passthrough)
    with _signals_to(r.sigs):
        r.started_us = now_us()
        r.t0 = time.monotonic()
        try:
            r.proc = _spawn(r.argv, r.env, r.ptys)
        except OSError as exc:
            return _report_start_error(r, exc)
        _pump(r)
        _wait(r)
    return _report(r, seal_on_success)


def _prepare(agent: SyncAgent, stage: str, argv: list[str], tails: Sequence[str], passthrough: bool) -> _Run:
    """The stage starts: its event, its token, followed files' starting points, ptys where ours are terminals."""
    settings = agent.settings
    agent.note_late_losses()  # what an earlier stage's leftovers wrote while nothing recorded them
    agent.event(stage, "started", attributes={"argv": agent.redactor.argv(argv), "cwd": os.getcwd()})
    token = uuid.uuid4().hex
    env = dict(os.environ, **{TOKEN_ENV: token})
    kw: dict[str, Any] = dict(max_line=settings.max_line, tail_lines=settings.tail_lines)
    # followed files take their starting point now, before CMD writes anything
    follows = [(FileFollower(p), SourceBatcher(agent.line_sink(), stage, p, 0, **kw)) for p in tails]
    for f, _b in follows:  # an earlier stage's leftover following the same file stops where this one starts
        _fd, offset, ino = f.state()
        agent.claim_follow(f.path, Claim(token, ino, offset))
    ptys = {fd: PtyPair.open_like(fd) for fd in (1, 2) if passthrough and os.isatty(fd)}
    sigs = StageSignals(ptys)  # CMD stays in the agent's process group, as it would be without the agent
    return _Run(agent, stage, argv, tails, passthrough, token, env, kw, follows, ptys, sigs)


@contextmanager
def _signals_to(sigs: StageSignals) -> Iterator[None]:
    """In the main thread: the stage's signals are taken by one thread (and passed to CMD) while this lasts."""
    watcher: SignalWatcher | None = None
    old_handlers = {}
    old_mask: set[int] | None = None
    if threading.current_thread() is threading.main_thread():
        old_mask = block_signals()
        sigs.canary = Canary()  # started with the stage's signals blocked: it keeps them pending
        watcher = SignalWatcher(sigs)
        watcher.start()
        for s in FORWARDED:  # only reached by threads that do not block them (a library caller's)
            old_handlers[s] = signal.signal(s, lambda n, _f: sigs(n, 0))
    try:
        yield
    finally:
        if watcher is not None:
            watcher.stop()
        if sigs.canary is not None:
            sigs.canary.stop()
        for s, h in old_handlers.items():
            signal.signal(s, h)
        if old_mask is not None:
            signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)


def _report_start_error(r: _Run, exc: OSError) -> StageResult:
    """CMD could not start: 127/126 like a shell, said on stderr, in a ProcessExit and a failed stage."""
    agent = r.agent
    for p in r.ptys.values():
        os.close(p.master)
        os.close(p.slave)
    for f, _b in r.follows:
        f.close()
    status, why = _start_error(exc, r.argv[0] if r.argv else "")
    os.write(2, f"flightrec agent run: {why}\n".encode())
    ended = now_us()
    exit_ev = agent.emit(
        ProcessExit,
        stage=r.stage,
        argv=list(r.argv),  # masked as one command line when spooled (scrub.py)
        exit_code=status,
        start_error=why,
        started_us=r.started_us,
        ended_us=ended,
        duration_s=time.monotonic() - r.t0,
        file_tails=[FileTail(path=p, lines=(), exists=os.path.exists(p)) for p in r.tails],
    )
    agent.event(r.stage, "failed", detail=f"could not start: {why} (exit {status})")
    return StageResult(status, exit_ev)


def _pump(r: _Run) -> None:
    """CMD runs: a thread per output copies it on and feeds its batcher; a thread follows the files."""
    proc = r.proc
    assert proc is not None
    r.sigs.started(proc)
    r.out_b = SourceBatcher(r.agent.line_sink(), r.stage, "stdout", proc.pid, **r.kw)
    r.err_b = SourceBatcher(r.agent.line_sink(), r.stage, "stderr", proc.pid, **r.kw)
    fds = []
    for n, pipe in ((1, proc.stdout), (2, proc.stderr)):
        if n in r.ptys:
            os.close(r.ptys[n].slave)
            fds.append(r.ptys[n].master)
        else:
            assert pipe is not None
            fds.append(os.dup(pipe.fileno()))  # the pumps own duplicates of the read ends
            pipe.close()
    out = 1 if r.passthrough else None, 2 if r.passthrough else None
    r.pumps = [Pump(fds[0], out[0], r.out_b, strip=1 in r.ptys), Pump(fds[1], out[1], r.err_b, strip=2 in r.ptys)]
    r.follower = _Followers(r.follows) if r.follows else None
    for t in r.pumps:
        t.start()
    if r.follower:
        r.follower.start()


def _wait(r: _Run) -> None:
    """Wait for CMD; then for its outputs to close, or hand what it left behind to the late-output process."""
    proc, sigs = r.proc, r.sigs
    assert proc is not None
    with heartbeat(r.agent, r.stage, proc.pid):  # liveness while CMD runs
        r.rc = proc.wait()
    sigs.exited = True
    r.ended_us = now_us()
    r.duration = time.monotonic() - r.t0
    for t in r.pumps:
        t.mark_exit()
    for _f, b in r.follows:
        b.late = True  # lines a followed file gets from here on
    deadline = time.monotonic() + PIPE_GRACE_S
    for t in r.pumps:
        while t.is_alive() and time.monotonic() < deadline and not sigs.after_exit.is_set():
            t.join(0.02)
    # a pump still reading an output that nothing holds any more is behind, not fed by a process left behind
    deadline = time.monotonic() + DRAIN_MAX_S
    for t in r.pumps:
        while t.is_alive() and t.writer_gone() and time.monotonic() < deadline and not sigs.after_exit.is_set():
            t.join(0.02)
    held = [t for t in r.pumps if t.is_alive()]
    # followed files go on being followed while a process the stage started still runs
    if held or (
        r.follows
        and not sigs.after_exit.is_set()
        and (stage_alive(r.token) or writers({f.path for f, _b in r.follows}))
    ):
        r.late_pid = _hand_off(r.agent, r.stage, r.token, r.pumps, r.follower, r.follows)
    elif r.follower:
        r.follower.finish(r.agent.settings.follow_grace, sigs.after_exit)


def _report(r: _Run, seal_on_success: bool) -> StageResult:
    """The stage's end: a ProcessExit with the tails, then succeeded (and a seal if asked) or failed."""
    agent, stage, rc, proc, out_b, err_b = r.agent, r.stage, r.rc, r.proc, r.out_b, r.err_b
    assert proc is not None and out_b is not None and err_b is not None
    signum = -rc if rc < 0 else None
    status = 128 + signum if signum else rc
    sig_name = signal.Signals(signum).name if signum and signum in signal.Signals._value2member_map_ else None
    exit_ev = agent.emit(
        ProcessExit,
        stage=stage,
        argv=list(r.argv),  # masked as one command line when spooled (scrub.py)
        pid=proc.pid,
        exit_code=None if signum else rc,
        signal=signum,
        signal_name=sig_name,
        started_us=r.started_us,
        ended_us=r.ended_us,
        duration_s=r.duration,
        stdout_tail=out_b.tail.snapshot(),
        stderr_tail=err_b.tail.snapshot(),
        file_tails=[FileTail(path=f.path, lines=b.tail.snapshot(), exists=f.exists) for f, b in r.follows],
    )
    duration = {"duration_s": f"{r.duration:.3f}"}
    if status == 0:
        agent.event(stage, "succeeded", detail="exit code 0", attributes=duration)
        if seal_on_success:
            agent.seal(f"stage {stage} ended normally")
    else:
        how = f"killed by signal {signum} ({sig_name})" if signum else f"exit code {rc}"
        last = next((line for line in reversed(err_b.tail.snapshot()) if line.strip()), "")
        detail = how + (f"; last stderr line: {last[:500]}" if last else "")
        agent.event(stage, "failed", detail=detail, attributes=duration)
    lines = {"stdout": out_b.lines_read, "stderr": err_b.lines_read}
    lines.update({f.path: b.lines_read for f, b in r.follows})
    return StageResult(status, exit_ev, lines, r.late_pid)


def _hand_off(
    agent: SyncAgent,
    stage: str,
    token: str,
    pumps: list[Pump],
    follower: _Followers | None,
    follows: list[tuple[FileFollower, SourceBatcher]],
) -> int | None:
    """CMD exited but what it started still holds its outputs (or followed files): a late-output process goes on."""
    for t in pumps:
        t.stop(handing_off=True)
    for t in pumps:
        t.join()
    if follower:
        follower.stop_for_handoff()
    pipes = []
    for t in pumps:
        if not t.eof:
            no, pending, overflow, carry = t.batcher.handoff_state()
            pipes.append(
                HandedPipe(
                    fd=t.fd,
                    out_fd=t.out_fd,
                    source=t.batcher.source,
                    pid=t.batcher.pid,
                    next_no=no,
                    pending=pending,
                    overflow=overflow,
                    carry=carry,
                    strip=t.strip,
                    early=max(0, (t.late_at or 0) - t.read_total),
                )
            )
    files = []
    for f, b in follows:
        fd, offset, ino = f.state()
        no, pending, overflow, carry = b.handoff_state()
        files.append(
            HandedFile(
                path=f.path,
                fd=fd,
                offset=offset,
                ino=ino,
                exists=f.exists,
                next_no=no,
                pending=pending,
                overflow=overflow,
                carry=carry,
            )
        )
    h = Handoff(settings=agent.settings, stage=stage, boot_id=agent.boot_id, token=token, pipes=pipes, files=files)
    try:
        pid = agent.hand_off(h)
    except OSError as exc:  # cannot start it: read on here rather than cut CMD's leftovers off
        log.error("the late-output process did not start (%s); the leftovers' output is no longer recorded", exc)
        pid = None
    for p in pipes:
        os.close(p.fd)
    for f, _b in follows:
        f.close()
    log.info(
        "CMD exited; %s still written by processes it left behind: a late-output process (pid %s) goes on",
        ", ".join([p.source for p in pipes] + [f.path for f in files]),
        pid,
    )
    return pid
