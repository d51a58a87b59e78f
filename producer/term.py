"""Terminals and signals for `agent run`: pseudo-terminals for CMD, control sequences, which signals to pass on."""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import re
import signal
import struct
import subprocess
import termios
import threading
import time
from dataclasses import dataclass
from typing import Callable

log = logging.getLogger(__name__)

SI_KERNEL = 0x80  # siginfo si_code of a signal the kernel generated (a terminal's ^C, ^\, hangup, resize)
# signals a terminal sends to its whole foreground process group
TERMINAL_SIGNALS = frozenset({signal.SIGINT, signal.SIGQUIT, signal.SIGHUP, signal.SIGWINCH})
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)
HANDLED = FORWARDED + (signal.SIGWINCH,)
JOB_CONTROL = (signal.SIGTSTP, signal.SIGCONT)  # also handled when CMD has a process group of its own
REPEAT_S = 0.5  # the same signal from the same sender again within this: one sending (GNU timeout: agent, then group)
SI_USER = 0  # siginfo si_code of kill() / killpg()

# CSI (ESC [ ... final), OSC (ESC ] ... BEL or ESC \), other two-byte escapes, and C0 controls but TAB/LF/CR
_CONTROL = re.compile(rb"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]|[\x00-\x08\x0b\x0c\x0e-\x1a\x1c-\x1f\x7f]")


def strip_control(data: bytes) -> bytes:
    """``data`` without terminal control sequences (colours, cursor moves, titles, bells): the text a reader wants."""
    return _CONTROL.sub(b"", data)


def should_forward(signum: int, si_code: int, cmd_has_it_pending: bool = False, *, shared_group: bool = True) -> bool:
    """Whether a signal the agent got must be passed to CMD (pure).

    ``shared_group``: CMD is in the agent's process group (the agent is the foreground
    job of a terminal). Then a terminal's signals (si_code SI_KERNEL: ^C, ^\\, hangup)
    went to the whole foreground group, CMD included: passing them on would deliver
    them twice. When CMD has a group of its own, nothing sent to the agent's group
    reaches it, so the terminal's signals are passed on too. Either way a signal CMD
    has pending already (sent to it directly, not yet taken) is not sent again.
    """
    if signum == signal.SIGWINCH:
        return False  # resizes are handled by resizing CMD's pseudo-terminals (see PtyPair.resize)
    if shared_group and si_code == SI_KERNEL and signum in TERMINAL_SIGNALS:
        return False
    return not cmd_has_it_pending


def foreground_at_terminal() -> bool:
    """Whether this process is in the foreground process group of a controlling terminal (a job at a prompt).

    False without a controlling terminal (a container, ``setsid``, a service) and for a background job.
    """
    try:
        fd = os.open("/dev/tty", os.O_RDONLY | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        return os.tcgetpgrp(fd) == os.getpgrp()
    except OSError:
        return False
    finally:
        os.close(fd)


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
    """What the agent does with a signal while a stage runs (and after CMD exited).

    ``own_group``: CMD runs in a process group of its own (the agent is not the foreground
    job of a terminal): every signal the agent takes is passed to CMD's whole group, once -
    the same signal from the same sender within REPEAT_S counts once (GNU ``timeout``
    signals the agent and then its group) - and SIGTSTP stops CMD's group, then the agent;
    SIGCONT continues CMD's group. Otherwise CMD shares the agent's group and only what
    did not reach that group already is passed to CMD itself.
    """

    def __init__(self, ptys: "dict[int, PtyPair]", own_group: bool = False) -> None:
        self.ptys = ptys
        self.own_group = own_group
        self.proc: "subprocess.Popen[bytes] | None" = None
        self.pending: list[tuple[int, int, int]] = []
        self.after_exit = threading.Event()  # a signal came after CMD exited: stop waiting, end now
        self.exited = False
        self._last: dict[int, tuple[int, float]] = {}  # signum -> (sender pid, when) of the last one passed on

    @property
    def handled(self) -> tuple[int, ...]:
        """The signals the agent takes while the stage runs."""
        return HANDLED + JOB_CONTROL if self.own_group else HANDLED

    def __call__(self, signum: int, si_code: int, si_pid: int = 0) -> None:
        proc = self.proc
        if signum == signal.SIGWINCH:
            for p in self.ptys.values():
                p.resize()
            if proc is not None and not self.exited and self.ptys:
                _kill(proc.pid, signal.SIGWINCH)  # after the resize, so CMD reads the new size
            return
        if proc is None:
            self.pending.append((signum, si_code, si_pid))
            return
        running = not self.exited and proc.returncode is None
        if signum in JOB_CONTROL:
            if running:
                _kill(-proc.pid, signum)
                if signum == signal.SIGTSTP:
                    _kill(os.getpid(), signal.SIGSTOP)  # whoever stopped us sees us stopped, as without the agent
            return
        if not running:
            self.after_exit.set()
        elif not should_forward(signum, si_code, pending_in(proc.pid, signum), shared_group=not self.own_group):
            return
        elif not self.own_group:
            _kill(proc.pid, signum)
        elif not self._repeat(signum, si_code, si_pid):
            _kill(-proc.pid, signum)

    def _repeat(self, signum: int, si_code: int, si_pid: int) -> bool:
        """Whether this is the same signal from the same sender as one passed on just before (one sending)."""
        now = time.monotonic()
        last = self._last.get(signum)
        self._last[signum] = (si_pid, now)
        return si_code == SI_USER and last is not None and last[0] == si_pid and now - last[1] < REPEAT_S

    def started(self, proc: "subprocess.Popen[bytes]") -> None:
        """CMD runs: pass on what came while it was starting."""
        self.proc = proc
        for signum, code, pid in self.pending:
            self(signum, code, pid)


def _kill(pid: int, signum: int) -> None:
    """Signal a process (``pid`` > 0) or a process group (``-pgid``); gone is fine."""
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        pass


# A guard in a session of its own, holding the read end of a pipe only the agent writes: the agent writes CMD's
# process group when CMD starts, and "ok" once CMD has exited. If the pipe ends first (the agent was SIGKILLed,
# or OOM-killed, while CMD ran), the guard kills CMD's whole group: nothing of the stage is left orphaned.
GUARD_SH = ('trap "" INT TERM HUP QUIT USR1 USR2 TSTP TTIN TTOU PIPE; read -r pgid || exit 0; read -r word; '
            '[ "$word" = ok ] || kill -s KILL -- "-$pgid" 2>/dev/null; exit 0')


class GroupGuard:
    """Ends CMD's process group if the agent dies while CMD runs (a ``/bin/sh`` of ~1 MB, one per stage).

    Guarantees: started before CMD, it outlives a SIGKILL of the agent (and of the agent's process
    group: it is in a session of its own) and then SIGKILLs CMD's group; after :meth:`release`
    (CMD exited) it ends and touches nothing, so daemons a stage left behind on purpose run on.
    """

    def __init__(self) -> None:
        r, self._w = os.pipe2(os.O_CLOEXEC)
        try:
            self.proc: "subprocess.Popen[bytes] | None" = subprocess.Popen(
                ["/bin/sh", "-c", GUARD_SH, "flightrec-guard"], stdin=r, stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL, start_new_session=True)
        except OSError as exc:  # no /bin/sh: the stage runs unguarded
            log.warning("no guard for the stage's process group (%s): a SIGKILLed agent leaves it running", exc)
            self.proc = None
        finally:
            os.close(r)

    def watch(self, pgid: int) -> None:
        """CMD started as the leader of process group ``pgid``."""
        self._say(f"{pgid}\n")

    def release(self) -> None:
        """CMD exited: the guard ends without touching anything."""
        self._say("ok\n")
        if self._w >= 0:
            os.close(self._w)
            self._w = -1
        if self.proc is not None:
            try:
                self.proc.wait(1.0)
            except subprocess.TimeoutExpired:
                pass

    def _say(self, text: str) -> None:
        if self._w < 0:
            return
        try:
            os.write(self._w, text.encode())
        except OSError:  # the guard is gone (killed by hand): the stage runs unguarded
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

    def __init__(self, on_signal: Callable[[int, int, int], None], handled: tuple[int, ...] = HANDLED) -> None:
        super().__init__(name="flightrec-signals", daemon=True)
        self.on_signal = on_signal
        self.handled = handled
        self._done = threading.Event()

    def run(self) -> None:
        while not self._done.is_set():
            info = signal.sigtimedwait(self.handled, 0.02)  # how long stop() may wait for it, at the stage's end
            if info is not None:
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
    signal.pthread_sigmask(signal.SIG_UNBLOCK, HANDLED + JOB_CONTROL)
