"""Pure parts of terminal and signal handling: which signals are passed on, what is kept of terminal output."""

from __future__ import annotations

import signal

import pytest
from flightrec.producer.term import SI_KERNEL, pending_in, should_forward, strip_control

SI_USER = 0


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGQUIT, signal.SIGHUP])
def test_a_terminal_signal_already_reached_cmd(signum: int) -> None:
    assert should_forward(signum, SI_KERNEL) is False


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGHUP])
def test_a_signal_sent_to_the_agent_is_passed_on(signum: int) -> None:
    assert should_forward(signum, SI_USER) is True
    assert should_forward(signum, SI_USER, cmd_has_it_pending=True) is False  # a group kill CMD has not taken yet


def test_a_signal_the_whole_group_got_is_not_passed_on() -> None:
    assert should_forward(signal.SIGTERM, SI_USER, group_got_it=True) is False


CANARY_PROBE = """
import os, signal
from flightrec.producer.term import Canary, block
block()  # as the agent does before it starts the canary
c = Canary()
out = [c.proc is not None, c.holds(signal.SIGUSR1)]
os.kill(os.getpid(), signal.SIGUSR1)  # to "the agent" alone
out.append(c.holds(signal.SIGUSR1))
os.killpg(os.getpgrp(), signal.SIGUSR2)  # to the whole group
out.append(c.holds(signal.SIGUSR2))
c.start()
out.append(c.holds(signal.SIGUSR2))  # a fresh one holds nothing
c.stop()
print(out)
"""


def test_the_canary_tells_a_group_kill_from_one_to_the_agent_alone() -> None:
    """A real canary in a process group of its own (the agent's place): a kill of the group stays pending in it."""
    import subprocess
    import sys

    r = subprocess.run(
        [sys.executable, "-c", CANARY_PROBE], capture_output=True, text=True, timeout=60, start_new_session=True
    )  # a group of its own: the test's group gets nothing
    assert r.stdout.strip() == "[True, False, False, True, False]", r.stderr


def test_window_changes_are_not_forwarded_as_signals() -> None:
    assert should_forward(signal.SIGWINCH, SI_KERNEL) is False


def test_pending_signals_are_read_from_proc() -> None:
    import os
    import subprocess
    import sys

    p = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import signal, time; signal.pthread_sigmask(signal.SIG_BLOCK, "
            "{signal.SIGUSR1}); print('ok', flush=True); time.sleep(30)",
        ],
        stdout=subprocess.PIPE,
    )
    try:
        assert p.stdout is not None and p.stdout.readline() == b"ok\n"
        assert pending_in(p.pid, signal.SIGUSR1) is False
        os.kill(p.pid, signal.SIGUSR1)
        assert pending_in(p.pid, signal.SIGUSR1) is True
    finally:
        p.kill()
        p.wait()


def test_control_sequences_are_kept_out_of_the_text() -> None:
    assert strip_control(b"\x1b[1;31mERROR\x1b[0m: x\n") == b"ERROR: x\n"
    assert strip_control(b"\x1b]0;title\x07done\x1b[2K\rbar 100%\n") == b"done\rbar 100%\n"
    assert strip_control(b"tab\there\r\n\x07") == b"tab\there\r\n"
    assert strip_control("héllo ✓\n".encode()) == "héllo ✓\n".encode()
