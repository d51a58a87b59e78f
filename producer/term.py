"""Terminals and signals for `agent run`: pseudo-terminals for CMD, control sequences, which signals to pass on."""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import re
import signal
import struct
import subprocess  # noqa: F401  (types)
import termios
import threading
from dataclasses import dataclass
from typing import Callable

log = logging.getLogger(__name__)

SI_KERNEL = 0x80  # siginfo si_code of a signal the kernel generated (a terminal's ^C, ^\, hangup, resize)
# signals a terminal sends to its whole foreground process group
TERMINAL_SIGNALS = frozenset({signal.SIGINT, signal.SIGQUIT, signal.SIGHUP, signal.SIGWINCH})
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)
HANDLED = FORWARDED + (signal.SIGWINCH,)

# CSI (ESC [ ... final), OSC (ESC ] ... BEL or ESC \), other two-byte escapes, and C0 controls but TAB/LF/CR
_CONTROL = re.compile(rb"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]|[\x00-\x08\x0b\x0c\x0e-\x1a\x1c-\x1f\x7f]")


def strip_control(data: bytes) -> bytes:
    """``data`` without terminal control sequences (colours, cursor moves, titles, bells): the text a reader wants."""
    return _CONTROL.sub(b"", data)


def should_forward(signum: int, si_code: int, cmd_has_it_pending: bool = False) -> bool:
    """Whether a signal the agent got must be passed to CMD, which shares the agent's process group (pure).

    A terminal's signals (si_code SI_KERNEL: ^C, ^\\, hangup) go to the whole
    foreground process group, CMD included: passing them on would deliver them
    twice. A signal CMD has pending already (a kill of the whole group that CMD has
    not taken yet) is not sent again either. Anything else (``kill AGENT_PID``, a
    container runtime's SIGTERM) is passed on once.
    """
    if signum == signal.SIGWINCH:
        return False  # resizes are handled by resizing CMD's pseudo-terminals (see PtyPair.resize)
    if si_code == SI_KERNEL and signum in TERMINAL_SIGNALS:
        return False
    return not cmd_has_it_pending


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


class StageSignals:
    """What the agent does with a signal while a stage runs (and after CMD exited)."""

    def __init__(self, ptys: "dict[int, PtyPair]") -> None:
        self.ptys = ptys
        self.proc: "subprocess.Popen[bytes] | None" = None
        self.pending: list[tuple[int, int]] = []
        self.after_exit = threading.Event()  # a signal came after CMD exited: stop waiting, end now
        self.exited = False

    def __call__(self, signum: int, si_code: int) -> None:
        proc = self.proc
        if signum == signal.SIGWINCH:
            for p in self.ptys.values():
                p.resize()
            if proc is not None and not self.exited and self.ptys:
                _kill(proc.pid, signal.SIGWINCH)  # after the resize, so CMD reads the new size
            return
        if proc is None:
            self.pending.append((signum, si_code))
        elif self.exited or proc.returncode is not None:
            self.after_exit.set()
        elif should_forward(signum, si_code, pending_in(proc.pid, signum)):
            _kill(proc.pid, signum)

    def started(self, proc: "subprocess.Popen[bytes]") -> None:
        """CMD runs: pass on what came while it was starting."""
        self.proc = proc
        for signum, code in self.pending:
            self(signum, code)


def _kill(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        pass


@dataclass(frozen=True)
class PtyPair:
    """A pseudo-terminal standing in for one of the agent's terminal outputs (stdout or stderr)."""

    master: int
    slave: int
    real: int  # the agent's own fd (1 or 2) it mirrors

    @classmethod
    def open_like(cls, real: int) -> "PtyPair":
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
    were started, every signal of :data:`HANDLED` is received here with its si_code,
    at every moment until :meth:`stop`; nothing is dropped while CMD starts or after it
    exited (``on_signal`` decides). Signals reaching a thread that does not block them
    (a library caller's own threads) go through the Python handler, as SI_USER.
    """

    def __init__(self, on_signal: Callable[[int, int], None]) -> None:
        super().__init__(name="flightrec-signals", daemon=True)
        self.on_signal = on_signal
        self._done = threading.Event()

    def run(self) -> None:
        while not self._done.is_set():
            info = signal.sigtimedwait(HANDLED, 0.02)  # how long stop() may wait for it, at the stage's end
            if info is not None:
                try:
                    self.on_signal(info.si_signo, info.si_code)
                except Exception:  # a signal must never kill the watcher
                    log.exception("handling signal %d failed", info.si_signo)

    def stop(self) -> None:
        """Stop watching (after the stage's end)."""
        self._done.set()
        self.join(1.0)


def block() -> set[int]:
    """Block the stage's signals in the calling thread (and threads it starts later); return the old mask."""
    return signal.pthread_sigmask(signal.SIG_BLOCK, HANDLED)


def unblock_in_child() -> None:
    """For the child between fork and exec: CMD starts with no signal blocked by the agent."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, HANDLED)
