"""Pure parts of terminal and signal handling: which signals are passed on, what is kept of terminal output."""

from __future__ import annotations

import signal

import pytest

from flightrec.producer.term import SI_KERNEL, should_forward, strip_control

SI_USER = 0


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGQUIT, signal.SIGHUP])
def test_a_terminal_signal_to_a_shared_group_is_not_sent_again(signum: int) -> None:
    assert should_forward(signum, SI_KERNEL, cmd_in_our_group=True) is False
    assert should_forward(signum, SI_KERNEL, cmd_in_our_group=False) is True  # CMD has a group of its own


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGHUP])
def test_a_signal_sent_to_the_agent_is_passed_on(signum: int) -> None:
    assert should_forward(signum, SI_USER, cmd_in_our_group=True) is True
    assert should_forward(signum, SI_USER, cmd_in_our_group=False) is True


def test_window_changes_are_not_forwarded_as_signals() -> None:
    assert should_forward(signal.SIGWINCH, SI_KERNEL, cmd_in_our_group=False) is False


def test_control_sequences_are_kept_out_of_the_text() -> None:
    assert strip_control(b"\x1b[1;31mERROR\x1b[0m: x\n") == b"ERROR: x\n"
    assert strip_control(b"\x1b]0;title\x07done\x1b[2K\rbar 100%\n") == b"done\rbar 100%\n"
    assert strip_control(b"tab\there\r\n\x07") == b"tab\there\r\n"
    assert strip_control("héllo ✓\n".encode()) == "héllo ✓\n".encode()
