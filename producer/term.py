"""Terminals and signals for `agent run`: pseudo-terminals for CMD, control sequences, which signals to pass on."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import re
import shutil
import signal
import struct
import subprocess
import termios
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger(__name__)

SI_KERNEL = 0x80  # siginfo si_code of a signal the kernel generated (a terminal's ^C, ^\, hangup, resize)
# signals a terminal sends to its whole foreground process group
TERMINAL_SIGNALS = frozenset({signal.SIGINT, signal.SIGQUIT, signal.SIGHUP, signal.SIGWINCH})
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)
HANDLED = FORWARDED + (signal.SIGWINCH,)
SI_USER = 0  # siginfo si_code of kill() / killpg()
SETTLE_S = 0.02  # a group kill reaches every member in one kill() call: look at the canary this much later
POLL_S = 0.02  # how often the signal watcher looks for the stage's signals (and how long stop() may wait for it)
SAME_SENDING_S = 0.5  # the same signal from the same sender again this soon after a group kill: that kill's copy
# The single file's loader (PyInstaller onefile: a parent process that passes on every signal it gets), set by
# flightrec.cli.standalone; None in a Python install.
LOADER_PID: int | None = None


# CSI (ESC [ ... final), OSC (ESC ] ... BEL or ESC \), other two-byte escapes, and C0 controls but TAB/LF/CR
_CONTROL = re.compile(
    rb"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]"
    rb"|[\x00-\x08\x0b\x0c\x0e-\x1a\x1c-\x1f\x7f]"
)


def strip_control(data: bytes) -> bytes:
    """``data`` without terminal control sequences (colours, cursor moves, titles, bells): the text a reader wants."""
    return _CONTROL.sub(b"", data)


def should_forward(signum: int, si_code: int, cmd_has_it_pending: bool = False, group_got_it: bool = False) -> bool:
    """Whether a signal the agent got must be passed to CMD, which shares the agent's process group (pure).

    A terminal's signals (si_code SI_KERNEL: ^C, ^\\, hangup) and every signal sent to the
    whole group (``kill -- -PGID``, ``tini -g``, GNU ``timeout``; the canary, a process of the
    group, holds it pending: ``group_got_it``) already reached CMD: passing them on would deliver
    them twice. A signal CMD has pending already (sent to it directly, not yet taken) is not sent
    again either. Anything else (``kill AGENT_PID``, a container runtime's SIGTERM to the agent)
    is passed on once, to CMD alone, as ``kill CMD`` would have done without the agent.
    """
    if signum == signal.SIGWINCH:
        return False  # resizes are handled by resizing CMD's pseudo-terminals (see PtyPair.resize)
    if si_code == SI_KERNEL and signum in TERMINAL_SIGNALS:
        return False
    return not (cmd_has_it_pending or group_got_it)


def pending_in(pid: int, signum: int) -> bool:
    """Whether process ``pid`` has signal ``signum`` pending (not yet taken), per /proc/PID/status."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(("SigPnd:", "ShdPnd:")) and int(line.split()[1], 16) >> (signum - 1) & 1:
                    return True
    except (OSError, ValueError):
        pass
    return False


class Canary:
    """A process in the agent's process group that takes no signal: what is pending in it was sent to the group.

    ``cat`` reading a pipe only the agent writes, started with the stage's signals blocked (a mask
    survives exec, and ``cat`` never changes it), so a signal sent to the whole group stays pending in
    it, where ``/proc`` shows it; one sent to the agent alone does not. It ends when the agent closes
    the pipe (or dies), and is replaced once it has seen a group's signal (pending signals cannot be
    taken back). Without ``cat`` there is no canary and only CMD's own pending signals are looked at.
    """

    def __init__(self) -> None:
        self.proc: subprocess.Popen[bytes] | None = None
        self._w = -1
        self.start()

    def start(self) -> None:
        """(Re)start it: a fresh process with nothing pending."""
        self.stop()
        cat = shutil.which("cat") or "/bin/cat"
        r, self._w = os.pipe2(os.O_CLOEXEC)
        try:
            self.proc = subprocess.Popen(
                ["flightrec-signal-canary"],
                executable=cat,
                stdin=r,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        except OSError as exc:
            log.debug("no signal canary (%s): a group kill that CMD already took may reach it twice", exc)
            self.proc = None
            os.close(self._w)
            self._w = -1
        finally:
            os.close(r)

    def holds(self, signum: int) -> bool:
        """Whether ``signum`` was sent to the whole process group since the canary started."""
        return self.proc is not None and self.proc.poll() is None and pending_in(self.proc.pid, signum)

    def stop(self) -> None:
        if self._w >= 0:
            os.close(self._w)
            self._w = -1
        if self.proc is not None:
            try:
                self.proc.kill()
                self.proc.wait(1.0)
            except (OSError, subprocess.TimeoutExpired):
                pass
            self.proc = None


class StageSignals:
    """What the agent does with a signal while a stage runs (and after CMD exited).

    CMD stays in the agent's process group, so whatever the kernel sends to the group (a
    terminal's keys, ``kill -- -PGID``, ``timeout``, ``tini -g``, a cgroup-wide stop) reaches CMD
    and its children once, as without the agent; the agent passes on to CMD alone only what was
    sent to the agent alone (see :func:`should_forward` and :class:`Canary`).
    """

    def __init__(self, ptys: dict[int, PtyPair], canary: Canary | None = None) -> None:
        self.ptys = ptys
        self.canary = canary
        self.proc: subprocess.Popen[bytes] | None = None
        self.pending: list[tuple[int, int, int]] = []
        self.after_exit = threading.Event()  # a signal came after CMD exited: stop waiting, end now
        self.exited = False
        self._group: dict[int, tuple[int, float]] = {}  # signum -> (sender, when) of the last group kill seen
        self._seen: dict[int, tuple[int, float]] = {}  # signum -> (sender, when) of the last one, under a loader

    def __call__(self, signum: int, si_code: int, si_pid: int = 0) -> None:
        proc = self.proc
        if signum == signal.SIGWINCH:
            for p in self.ptys.values():
                p.resize()
            if proc is not None and not self.exited and self.ptys:
                _kill(proc.pid, signal.SIGWINCH)  # after the resize, so CMD reads the new size
            return
        if LOADER_PID is not None and self._loaders_copy(signum, si_pid):
            return
        if proc is None:
            self.pending.append((signum, si_code, si_pid))
        elif self.exited or proc.returncode is not None:
            self.after_exit.set()
        elif should_forward(signum, si_code, pending_in(proc.pid, signum), self._group_got_it(signum, si_code, si_pid)):
            _kill(proc.pid, signum)

    def _loaders_copy(self, signum: int, si_pid: int) -> bool:
        """Whether ``signum`` is the single file's loader passing on a signal this process got itself too (a group
        kill or ``pkill -f flightrec-agent`` reaches both), or the reverse order of the two: one sending, once."""
        now = time.monotonic()
        last = self._seen.get(signum)
        self._seen[signum] = (si_pid, now)
        if last is None or now - last[1] >= SAME_SENDING_S:
            return False
        return (si_pid == LOADER_PID) != (last[0] == LOADER_PID)

    def _group_got_it(self, signum: int, si_code: int, si_pid: int) -> bool:
        """Whether ``signum`` from ``si_pid`` went to the whole group (then CMD has it already)."""
        if si_code == SI_KERNEL or self.canary is None:
            return False
        now = time.monotonic()
        last = self._group.get(signum)
        if last is not None and last[0] == si_pid and now - last[1] < SAME_SENDING_S:
            return True  # GNU timeout signals the agent, then the group: the two are one sending
        time.sleep(SETTLE_S)  # the kill() that reached us may still be on its way to the other members
        if not self.canary.holds(signum):
            return False
        self._group[signum] = (si_pid, now)
        self.canary.start()  # fresh, for the next signal
        return True

    def started(self, proc: subprocess.Popen[bytes]) -> None:
        """CMD runs: pass on what came while it was starting."""
        self.proc = proc
        for signum, code, pid in self.pending:
            self(signum, code, pid)


def _kill(pid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signum)


try:  # loaded here, in the agent: nothing may be imported between fork and exec
    import ctypes

    _PRCTL = ctypes.CDLL(None, use_errno=True).prctl
except (ImportError, OSError, AttributeError):  # not Linux's libc: CMD does not die with the agent
    _PRCTL = None  # type: ignore[assignment]  # no prctl here: callers test for None
PR_SET_PDEATHSIG = 1


def die_with_parent(parent: int) -> None:
    """For CMD between fork and exec: a SIGKILL when the agent (``parent``) dies - SIGKILL, the OOM killer - so no
    stage command is left orphaned (its own children are its business, as after a ``kill -9`` of a shell)."""
    if _PRCTL is None:
        return
    _PRCTL(PR_SET_PDEATHSIG, int(signal.SIGKILL))
    if os.getppid() != parent:  # the agent died before the prctl
        os.kill(os.getpid(), signal.SIGKILL)


@dataclass(frozen=True)
class PtyPair:
    """A pseudo-terminal standing in for one of the agent's terminal outputs (stdout or stderr)."""

    master: int
    slave: int
    real: int  # the agent's own fd (1 or 2) it mirrors

    @classmethod
    def open_like(cls, real: int) -> PtyPair:
        """A pty with the real terminal's settings and size; output processing off so bytes pass unchanged."""
        master, slave = os.openpty()
        try:
            attrs = termios.tcgetattr(real)
            attrs[1] &= ~termios.OPOST  # the real terminal does its own \n -> \r\n; do not do it twice
            termios.tcsetattr(slave, termios.TCSANOW, attrs)
        except termios.error as exc:
            log.debug("terminal settings not copied: %s", exc)
        pair = cls(master, slave, real)
        pair.resize()
        return pair

    def resize(self) -> None:
        """Give the pty the real terminal's current window size."""
        try:
            size = fcntl.ioctl(self.real, termios.TIOCGWINSZ, struct.pack("HHHH", 0, 0, 0, 0))
            fcntl.ioctl(self.master, termios.TIOCSWINSZ, size)
        except OSError as exc:
            log.debug("window size not copied: %s", exc)


def read_eof(exc: OSError) -> bool:
    """A read error that means end of stream (a pty master reads EIO once every slave is closed)."""
    return exc.errno == errno.EIO


class SignalWatcher(threading.Thread):
    """Takes the stage's signals with their siginfo (sigtimedwait) and hands each to ``on_signal``.

    Guarantees: once :func:`block` was called in the main thread before other threads
    were started, every signal of :data:`HANDLED` is received here with its si_code
    (within POLL_S), at every moment until :meth:`stop`, and nothing else: none that
    nobody sent, whatever interrupts the thread; nothing is dropped while CMD starts or after it
    exited (``on_signal`` decides). Signals reaching a thread that does not block them
    (a library caller's own threads) go through the Python handler, as SI_USER.
    """

    def __init__(self, on_signal: Callable[[int, int, int], None], handled: tuple[int, ...] = HANDLED) -> None:
        super().__init__(name="flightrec-signals", daemon=True)
        self.on_signal = on_signal
        self.handled = handled
        self._done = threading.Event()

    def run(self) -> None:
        while True:
            # A zero timeout: the call never sleeps, so nothing interrupts it. CPython's sigtimedwait, interrupted
            # (EINTR: another signal, a debugger or profiler attaching) as its timeout runs out, returns the siginfo
            # its stack still holds: a signal nobody sent, or a copy of the last real one.
            info = signal.sigtimedwait(self.handled, 0)
            if info is None:
                if self._done.wait(POLL_S):
                    return
                continue
            try:
                self.on_signal(info.si_signo, info.si_code, info.si_pid)
            except Exception:  # a signal must never kill the watcher
                log.exception("handling signal %d failed", info.si_signo)

    def stop(self) -> None:
        """Stop watching (after the stage's end)."""
        self._done.set()
        self.join(1.0)


def block(handled: tuple[int, ...] = HANDLED) -> set[int]:
    """Block the stage's signals in the calling thread (and threads it starts later); return the old mask."""
    return signal.pthread_sigmask(signal.SIG_BLOCK, handled)


def unblock_in_child() -> None:
    """For the child between fork and exec: CMD starts with no signal blocked by the agent."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, HANDLED)
