"""`agent run`: run a command as a stage, pass its output through byte for byte, ship its lines and exit."""

from __future__ import annotations

import fcntl
import logging
import os
import select
import signal
import subprocess
import threading
import time
from bisect import bisect_right
from dataclasses import dataclass, field
from itertools import accumulate
from typing import Sequence

from flightrec.schemas import Event, FileTail, LogBatch, ProcessExit, new_event_id, now_us

from flightrec.producer.agent import SyncAgent
from flightrec.producer.fastlog import encode_fast
from flightrec.producer.follow import FileFollower
from flightrec.producer.heartbeat import heartbeat
from flightrec.producer.lines import LineSplitter, Tail, decode_lines

log = logging.getLogger(__name__)

CHUNK = 1 << 20
PIPE_SIZE = 1 << 20
BATCH_WINDOW_S = 0.1  # a line is spooled (and handed to the sender) at most this long after it was read
BATCH_MAX_BYTES = 256 * 1024  # and a LogBatch holds about this much text at most
# and at most this many lines: each costs ~15 bytes besides its text, and a burst of short lines
# in one 1 MiB chunk must not make a message over the producer's max_request_size (it would block delivery)
BATCH_MAX_LINES = 16384
LINE_OVERHEAD = 16  # bytes a line costs in a LogBatch besides its text (number, time, flags, length)
FOLLOW_POLL_S = 0.05
FOLLOW_QUIET_S = 1.0  # after CMD exits, stop following once every followed file exists and was quiet this long
PIPE_GRACE_S = 2.0  # after CMD exits, how long to wait for its pipes to close (a daemon may hold them)
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)


class SourceBatcher:
    """Lines of one source (stdout, stderr, a followed file) become LogBatch events.

    Guarantees: every line fed is spooled exactly once, in order, with a 1-based
    line number gap-free within the source; a line waits at most ``window`` s
    (given :meth:`tick` is called) before its batch is spooled; secrets are masked
    before anything is kept; the last ``tail_lines`` lines are kept for the exit event.
    """

    def __init__(self, agent: SyncAgent, stage: str, source: str, pid: int, *, max_line: int,
                 tail_lines: int, window: float = BATCH_WINDOW_S, max_bytes: int = BATCH_MAX_BYTES) -> None:
        self.agent = agent
        self.stage = stage
        self.source = source
        self.pid = pid
        self.window = window
        self.max_bytes = max_bytes
        self.splitter = LineSplitter(max_line)
        self.tail = Tail(tail_lines)
        self.lines_read = 0
        self.batches = 0
        self._next_no = 1
        self._texts: list[str] = []
        self._ts: list[int] = []
        self._trunc: list[bool] = []
        self._invalid: list[bool] = []
        self._bytes = 0
        self._since: float | None = None
        self._lock = threading.Lock()

    def _add(self, lines: list[bytes], trunc: list[bool] | None, ts: int) -> None:
        if not lines:
            return
        texts, invalid = decode_lines(lines)
        texts = self.agent.redactor.lines(texts, trunc)
        n = len(texts)
        self._texts.extend(texts)
        self._ts.extend([ts] * n)
        self._trunc.extend(trunc if trunc is not None else [False] * n)
        self._invalid.extend(invalid if invalid is not None else [False] * n)
        self.tail.extend(texts)
        self.lines_read += n
        if self._since is None:
            self._since = time.monotonic()

    def feed(self, data: bytes, ts: int | None = None) -> None:
        """Bytes read from the source: lines join the pending batch, which is spooled before it would grow
        over ``max_bytes`` (text plus LINE_OVERHEAD per line) or BATCH_MAX_LINES lines."""
        with self._lock:
            lines, trunc = self.splitter.feed(data)
            ts = ts or now_us()
            sizes = list(accumulate(len(line) + LINE_OVERHEAD for line in lines))
            start, n = 0, len(lines)
            while start < n:
                base = sizes[start - 1] if start else 0
                room_lines = BATCH_MAX_LINES - len(self._texts)
                end = min(n, start + room_lines, bisect_right(sizes, base + self.max_bytes - self._bytes, lo=start))
                if end == start:
                    if self._texts:  # the pending batch is full: spool it, then go on
                        self._flush()
                        continue
                    end = start + 1  # one line alone always makes a batch (lines are cut to max_line)
                self._add(lines[start:end], trunc[start:end] if trunc else None, ts)
                self._bytes += sizes[end - 1] - base
                start = end
                if start < n:
                    self._flush()
            if self._bytes >= self.max_bytes or (self._since is not None and time.monotonic() - self._since >= self.window):
                self._flush()

    def end_of_file(self) -> None:
        """The source's file ended or was replaced: its unfinished last line is a line."""
        with self._lock:
            lines, trunc = self.splitter.finish()
            self._add(lines, trunc, now_us())

    def time_left(self) -> float | None:
        """Seconds until the pending batch is due (None: nothing pending)."""
        since = self._since
        return None if since is None else max(0.0, self.window - (time.monotonic() - since))

    def tick(self) -> None:
        """Spool the pending batch if it is due."""
        with self._lock:
            if self._since is not None and time.monotonic() - self._since >= self.window:
                self._flush()

    def close(self) -> None:
        """End of the source: spool everything left."""
        self.end_of_file()
        with self._lock:
            self._flush()

    def _flush(self) -> None:
        self._bytes = 0
        self._since = None
        if not self._texts:
            return
        texts, ts, trunc, invalid = self._texts, self._ts, self._trunc, self._invalid
        self._texts, self._ts, self._trunc, self._invalid = [], [], [], []
        first = self._next_no
        self._next_no += len(texts)
        eid, iid, stage, source, pid, now = new_event_id(), self.agent.instance_id, self.stage, self.source, self.pid, now_us()

        def make(boot: str, seq: int) -> Event:
            return LogBatch(event_id=eid, instance_id=iid, boot_id=boot, seq=seq, ts_us=now, stage=stage,
                            source=source, pid=pid, line_no=range(first, first + len(texts)), line_ts_us=ts,
                            text=texts, truncated=trunc, invalid_utf8=invalid)

        self.agent.emit_makers([make], encode=encode_fast)
        self.batches += 1


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


class _Pump(threading.Thread):
    """Copies one pipe of CMD to our own fd byte for byte, and feeds its batcher."""

    def __init__(self, fd: int, out_fd: int | None, batcher: SourceBatcher) -> None:
        super().__init__(name=f"flightrec-{batcher.source}", daemon=True)
        self.fd, self.out_fd, self.batcher = fd, out_fd, batcher
        self.stop_flag = False
        self.error: str | None = None
        try:
            fcntl.fcntl(fd, 1031, PIPE_SIZE)  # F_SETPIPE_SZ: room for bursts while a batch is spooled
        except OSError:
            pass

    def _capture(self, call: str, *args: object) -> None:
        if self.error is not None:
            return
        try:
            getattr(self.batcher, call)(*args)
        except Exception as exc:  # capture failed (spool unwritable...): CMD's output must still flow
            self.error = f"{type(exc).__name__}: {exc}"
            log.error("capturing CMD's %s failed, passing it through uncaptured: %s", self.batcher.source, self.error)

    def run(self) -> None:
        poller = select.poll()
        poller.register(self.fd, select.POLLIN | select.POLLHUP | select.POLLERR)
        try:
            while True:
                left = self.batcher.time_left() if self.error is None else None
                timeout_ms = 100 if left is None else int(left * 1000) + 1
                if not poller.poll(timeout_ms):
                    self._capture("tick")
                    if self.stop_flag:
                        break
                    continue
                data = os.read(self.fd, CHUNK)
                if not data:
                    break
                if self.out_fd is not None:
                    try:
                        _write_all(self.out_fd, data)
                    except BrokenPipeError:
                        # our reader went away: CMD gets the same EPIPE/SIGPIPE it would have got
                        self._capture("feed", data)
                        break
                self._capture("feed", data)
                if self.stop_flag:
                    break
        finally:
            os.close(self.fd)
            self._capture("close")


class _Followers(threading.Thread):
    """Polls every followed file and feeds each one's batcher, until stopped (then drains once more)."""

    def __init__(self, followers: list[tuple[FileFollower, SourceBatcher]]) -> None:
        super().__init__(name="flightrec-follow", daemon=True)
        self.followers = followers
        self.stop_at: float | None = None  # monotonic deadline after CMD's exit
        self.last_data = time.monotonic()

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
                quiet = now - self.last_data >= FOLLOW_QUIET_S and all(f.exists for f, _ in self.followers)
                if self.stop_at is not None and (now >= self.stop_at or quiet):
                    break
                time.sleep(FOLLOW_POLL_S)
            self._poll_all()
        finally:
            for follower, batcher in self.followers:
                follower.close()
                batcher.close()

    def finish(self, grace: float) -> None:
        """CMD exited: keep reading up to ``grace`` s (less once every file exists and is quiet), then end."""
        self.last_data = max(self.last_data, time.monotonic())
        self.stop_at = time.monotonic() + grace
        self.join()


@dataclass
class StageResult:
    """How a stage ended: the agent's exit status and the events it sent about the end."""

    exit_status: int
    exit_event: ProcessExit
    lines: dict[str, int] = field(default_factory=dict)


def _start_error(exc: OSError, cmd: str) -> tuple[int, str]:
    if isinstance(exc, FileNotFoundError):
        return 127, f"{cmd}: command not found"
    if isinstance(exc, PermissionError):
        return 126, f"{cmd}: permission denied"
    return 126, f"{cmd}: cannot execute: {exc.strerror or exc}"


def run_stage(agent: SyncAgent, stage: str, argv: Sequence[str], tails: Sequence[str] = (), *,
              seal_on_success: bool = False, passthrough: bool = True) -> StageResult:
    """Run ``argv`` as stage ``stage``; return the status to exit with (CMD's code, or 128+N for signal N).

    Guarantees: CMD inherits stdin, the environment and the working folder; its
    stdout/stderr reach ours byte for byte; SIGTERM/INT/HUP/QUIT/USR1/USR2 sent to
    the agent are passed to CMD; every line is spooled before this returns; the
    stage ends with a ProcessExit (code or signal, duration, tails) and a Lifecycle
    succeeded/failed event; a CMD that cannot start gives 127/126 and says why.
    """
    settings = agent.settings
    argv = list(argv)
    shown = agent.redactor.argv(argv)
    agent.event(stage, "started", attributes={"argv": shown, "cwd": os.getcwd()})
    proc: subprocess.Popen[bytes] | None = None
    pending_signals: list[int] = []

    def forward(signum: int, _frame: object) -> None:
        if proc is not None and proc.returncode is None:
            try:
                os.kill(proc.pid, signum)
            except ProcessLookupError:
                pass
        else:
            pending_signals.append(signum)

    old_handlers = {}
    if threading.current_thread() is threading.main_thread():
        for s in FORWARDED:
            old_handlers[s] = signal.signal(s, forward)
    started_us = now_us()
    t0 = time.monotonic()
    try:
        try:
            proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, bufsize=0)
        except OSError as exc:
            status, why = _start_error(exc, argv[0] if argv else "")
            os.write(2, f"flightrec agent run: {why}\n".encode())
            ended = now_us()
            exit_ev = agent.emit(ProcessExit, stage=stage, argv=[agent.redactor.text(a) for a in argv], exit_code=status,
                                 start_error=why, started_us=started_us, ended_us=ended,
                                 duration_s=time.monotonic() - t0,
                                 file_tails=[FileTail(path=p, lines=(), exists=os.path.exists(p)) for p in tails])
            agent.event(stage, "failed", detail=f"could not start: {why} (exit {status})")
            return StageResult(status, exit_ev)  # type: ignore[arg-type]
        for s in pending_signals:
            forward(s, None)
        kw = dict(max_line=settings.max_line, tail_lines=settings.tail_lines)
        out_b = SourceBatcher(agent, stage, "stdout", proc.pid, **kw)
        err_b = SourceBatcher(agent, stage, "stderr", proc.pid, **kw)
        assert proc.stdout is not None and proc.stderr is not None
        # the pumps own duplicates of the read ends; the file objects are closed at once
        out_fd, err_fd = os.dup(proc.stdout.fileno()), os.dup(proc.stderr.fileno())
        proc.stdout.close()
        proc.stderr.close()
        pumps = [_Pump(out_fd, 1 if passthrough else None, out_b), _Pump(err_fd, 2 if passthrough else None, err_b)]
        follows = [(FileFollower(p), SourceBatcher(agent, stage, p, 0, **kw)) for p in tails]
        follower = _Followers(follows) if follows else None
        for t in pumps:
            t.start()
        if follower:
            follower.start()
        with heartbeat(agent, stage, proc.pid):  # liveness while CMD runs
            rc = proc.wait()
        ended_us = now_us()
        duration = time.monotonic() - t0
        deadline = time.monotonic() + PIPE_GRACE_S
        for t in pumps:
            t.join(max(0.0, deadline - time.monotonic()))
            if t.is_alive():  # a daemon started by CMD holds the pipe: stop reading it
                log.info("CMD's %s is still open (held by a process CMD started); no longer reading it", t.batcher.source)
                t.stop_flag = True
                t.join(1.0)
        if follower:
            follower.finish(settings.follow_grace)
    finally:
        for s, h in old_handlers.items():
            signal.signal(s, h)
    signum = -rc if rc < 0 else None
    status = 128 + signum if signum else rc
    sig_name = signal.Signals(signum).name if signum and signum in signal.Signals._value2member_map_ else None
    exit_ev = agent.emit(
        ProcessExit, stage=stage, argv=[agent.redactor.text(a) for a in argv], pid=proc.pid,
        exit_code=None if signum else rc, signal=signum, signal_name=sig_name,
        started_us=started_us, ended_us=ended_us, duration_s=duration,
        stdout_tail=out_b.tail.snapshot(), stderr_tail=err_b.tail.snapshot(),
        file_tails=[FileTail(path=f.path, lines=b.tail.snapshot(), exists=f.exists) for f, b in follows],
    )
    if status == 0:
        agent.event(stage, "succeeded", detail="exit code 0", attributes={"duration_s": f"{duration:.3f}"})
        if seal_on_success:
            agent.seal(f"stage {stage} ended normally")
    else:
        how = f"killed by signal {signum} ({sig_name})" if signum else f"exit code {rc}"
        last = next((line for line in reversed(err_b.tail.snapshot()) if line.strip()), "")
        detail = how + (f"; last stderr line: {last[:500]}" if last else "")
        agent.event(stage, "failed", detail=detail, attributes={"duration_s": f"{duration:.3f}"})
    lines = {"stdout": out_b.lines_read, "stderr": err_b.lines_read}
    lines.update({f.path: b.lines_read for f, b in follows})
    return StageResult(status, exit_ev, lines)  # type: ignore[arg-type]
