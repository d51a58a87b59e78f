"""A signal reaches the wrapped command exactly once, whoever sends it, and a killed agent takes its command along.

The senders of docs/agent.md's table: a process that signals the agent alone, one that signals the agent's whole
process group (``kill -- -PGID``, ``tini -g``), GNU ``timeout`` (the agent, then its group), ``timeout -k`` for a
command that ignores SIGTERM, and at a terminal (a real pseudo-terminal): job control. The terminal's own Ctrl-C
is tested in test_dropin.py. Checked at the agent's spool (``spool_env``): Kafka adds nothing here."""

from __future__ import annotations

import contextlib
import os
import re
import select
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

PY = sys.executable

# counts every SIGINT and SIGTERM it gets (Python's C-level handler writes one byte per signal to the wakeup fd),
# busy so that two deliveries are taken apart rather than merged; prints them 1.5 s after the first one came
COUNTER = r"""
import os, signal, sys, time
r, w = os.pipe()
os.set_blocking(w, False)
os.set_blocking(r, False)
signal.set_wakeup_fd(w)
for s in (signal.SIGINT, signal.SIGTERM):
    signal.signal(s, lambda n, f: None)
open(sys.argv[1], "w").write("ready")
got, first, deadline = b"", None, time.time() + float(sys.argv[2])
while time.time() < deadline and (first is None or time.time() < first + 1.5):
    try:
        got += os.read(r, 100)
        first = first or time.time()
    except BlockingIOError:
        pass
print(" ".join(signal.Signals(n).name for n in got) or "none", flush=True)
"""


def _wait_ready(ready: Path, p: subprocess.Popen) -> None:
    deadline = time.monotonic() + 60
    while not ready.exists() and time.monotonic() < deadline and p.poll() is None:
        time.sleep(0.05)
    assert ready.exists(), p.communicate(timeout=10)


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_to_the_whole_process_group_reaches_cmd_once(spool_env, tmp_path: Path, signum: int) -> None:
    # `setsid flightrec agent run -- CMD`, then another process sends `kill -INT -- -PGID` (tini -g, a script)
    ready = tmp_path / "ready"
    p = subprocess.Popen(
        spool_env.argv("run", "--stage", "s", "--", PY, "-c", COUNTER, str(ready), "30"),
        env=spool_env.env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    _wait_ready(ready, p)
    os.killpg(p.pid, signum)
    out, err = p.communicate(timeout=60)
    assert out.decode().split() == [signal.Signals(signum).name], err.decode()[-2000:]
    assert p.returncode == 0


@pytest.mark.slow
def test_gnu_timeout_gives_cmd_one_sigterm(spool_env, tmp_path: Path) -> None:
    # timeout signals the agent, then its whole process group, then sends SIGCONT to both
    ready = tmp_path / "ready"
    r = subprocess.run(
        ["timeout", "3", *spool_env.argv("run", "--stage", "s", "--", PY, "-c", COUNTER, str(ready), "30")],
        env=spool_env.env(),
        capture_output=True,
        timeout=120,
        start_new_session=True,
    )
    assert r.stdout.decode().split() == ["SIGTERM"], r.stderr.decode()[-2000:]
    assert r.returncode == 124  # timed out


@pytest.mark.slow
def test_timeout_k_ends_a_stage_that_ignores_sigterm(spool_env, tmp_path: Path) -> None:
    # the command and its child ignore SIGTERM; timeout's SIGKILL (to the agent and its group) must still end both
    pids = tmp_path / "pids"
    script = f'trap "" TERM; sleep 60 & echo "$$ $!" > {pids}; wait'
    t0 = time.monotonic()
    r = subprocess.run(
        ["timeout", "-k", "1", "2", *spool_env.argv("run", "--stage", "s", "--", "sh", "-c", script)],
        env=spool_env.env(),
        capture_output=True,
        timeout=120,
        start_new_session=True,
    )
    assert r.returncode in (137, -signal.SIGKILL), r.stderr  # timeout killed the group, itself included
    assert time.monotonic() - t0 < 20
    left = [int(x) for x in pids.read_text().split()]
    deadline = time.monotonic() + 5
    while any(_alive(pid) for pid in left) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [pid for pid in left if _alive(pid)], "the stage's processes outlived the agent's SIGKILL"


def test_sigkill_of_the_agent_takes_cmd_with_it(spool_env, tmp_path: Path) -> None:
    # CMD dies with the agent (a parent-death signal); CMD's own children are its business, as after a kill -9 of a
    # shell whose children go on
    pids = tmp_path / "pids"
    ready = tmp_path / "ready"
    script = f'sleep 60 & echo "$$ $!" > {pids}; touch {ready}; wait'
    p = subprocess.Popen(
        spool_env.argv("run", "--stage", "s", "--", "sh", "-c", script),
        env=spool_env.env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    _wait_ready(ready, p)
    cmd, child = (int(x) for x in pids.read_text().split())
    try:
        os.kill(p.pid, signal.SIGKILL)
        p.wait(timeout=30)
        deadline = time.monotonic() + 5
        while _alive(cmd) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(cmd), "CMD outlived the agent's SIGKILL"
    finally:
        os.kill(child, signal.SIGKILL)


def test_a_command_that_calls_setsid_keeps_its_exit_code(spool_env) -> None:
    # util-linux setsid forks when its caller leads a process group: CMD must not lead one the agent made
    t0 = time.monotonic()
    r = spool_env.run("run", "--stage", "s", "--", "setsid", "sh", "-c", "sleep 2; exit 7")
    assert r.returncode == 7, r.stderr
    assert time.monotonic() - t0 >= 2


# a supervisor that drains on SIGTERM, then passes it to its worker; the worker counts what it gets
WORKER = r"""
import signal, sys, time
got = []
signal.signal(signal.SIGTERM, lambda *a: got.append(time.time()))
open(sys.argv[1], "w").write("ready")
deadline = time.time() + 30
while time.time() < deadline and not (got and time.time() > got[0] + 1.5):
    time.sleep(0.01)
print("worker got", len(got), flush=True)
"""
# a supervisor that drains on SIGTERM, then passes it to its worker (which counts what it gets)
SUPERVISOR = 'python3 -c "$WORKER" "$READY" & w=$!; trap \'sleep 0.2; kill -TERM $w; wait $w; exit 0\' TERM; wait $w'


def test_a_sigterm_to_the_agent_reaches_cmd_alone_not_its_children(spool_env, tmp_path: Path) -> None:
    # kill AGENT (a container runtime's stop) is kill CMD: a supervisor that passes it to its worker must not have
    # the worker get a second one from the agent
    ready = tmp_path / "ready"
    p = subprocess.Popen(
        spool_env.argv("run", "--stage", "s", "--", "bash", "-c", SUPERVISOR),
        env=spool_env.env(READY=str(ready), WORKER=WORKER),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    _wait_ready(ready, p)
    os.kill(p.pid, signal.SIGTERM)
    out, err = p.communicate(timeout=60)
    assert out.decode().split() == ["worker", "got", "1"], err.decode()[-2000:]


@pytest.mark.slow
def test_a_usr1_to_the_agent_leaves_cmd_s_children_alone(spool_env, tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    script = f'trap "echo cmd got USR1" USR1; sleep 3 & s=$!; touch {ready}; wait $s; wait $s; echo "child ended $?"'
    p = subprocess.Popen(
        spool_env.argv("run", "--stage", "s", "--", "bash", "-c", script),
        env=spool_env.env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    _wait_ready(ready, p)
    time.sleep(0.2)
    os.kill(p.pid, signal.SIGUSR1)
    out, err = p.communicate(timeout=60)
    assert "cmd got USR1" in out.decode() and "child ended 0" in out.decode(), (out, err)


def test_a_group_kill_in_a_container_with_a_terminal_reaches_cmd_once(spool_env, tmp_path: Path) -> None:
    # docker run -t: the entrypoint leads a session whose controlling terminal is a pty, and a supervisor kills
    # the whole group
    import fcntl
    import pty
    import termios

    ready = tmp_path / "ready"
    master, slave = pty.openpty()

    def ctty() -> None:
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    out = tmp_path / "out"
    with open(out, "wb") as o:
        p = subprocess.Popen(
            spool_env.argv("run", "--stage", "s", "--", PY, "-c", COUNTER, str(ready), "30"),
            env=spool_env.env(),
            stdin=slave,
            stdout=o,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=ctty,
        )
    os.close(slave)
    try:
        _wait_ready(ready, p)
        os.killpg(p.pid, signal.SIGTERM)
        p.wait(timeout=60)
    finally:
        os.close(master)
    assert out.read_text().split() == ["SIGTERM"]


def test_a_cgroup_wide_stop_reaches_cmd_once(spool_env, tmp_path: Path) -> None:
    # systemd's KillMode=control-group: SIGTERM to every process of the unit, one by one
    ready = tmp_path / "ready"
    p = subprocess.Popen(
        spool_env.argv("run", "--stage", "s", "--", PY, "-c", COUNTER, str(ready), "30"),
        env=spool_env.env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    _wait_ready(ready, p)
    unit = [int(x) for x in os.listdir("/proc") if x.isdigit() and _session(int(x)) == p.pid]
    for pid in sorted(unit):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    out, err = p.communicate(timeout=60)
    assert out.decode().split() == ["SIGTERM"], err.decode()[-2000:]


def _session(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[3])
    except (OSError, IndexError, ValueError):
        return -1


def test_a_daemon_the_stage_leaves_behind_outlives_a_normal_end(spool_env, tmp_path: Path) -> None:
    # the guard that ends a SIGKILLed agent's stage must not end what a stage that ended normally left running
    pidfile = tmp_path / "pid"
    with open(tmp_path / "out", "wb") as out:
        r = subprocess.run(
            spool_env.argv("run", "--stage", "s", "--", "sh", "-c", f"sleep 60 > /dev/null 2>&1 & echo $! > {pidfile}"),
            env=spool_env.env(FLIGHTREC_FOLLOW_GRACE="0"),
            stdout=out,
            stderr=out,
            timeout=60,
            start_new_session=True,
        )
    pid = int(pidfile.read_text())
    try:
        assert r.returncode == 0
        time.sleep(1)
        assert _alive(pid)
    finally:
        os.kill(pid, signal.SIGKILL)


def _pty_shell(env: dict[str, str]) -> tuple[subprocess.Popen, int]:
    """An interactive bash with job control on a new pseudo-terminal (a terminal window)."""
    import fcntl
    import pty
    import termios

    master, slave = pty.openpty()

    def ctty() -> None:
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    p = subprocess.Popen(
        ["bash", "--norc", "--noprofile", "-i"],
        env={**env, "PS1": "$ ", "TERM": "dumb"},
        stdin=slave,
        stdout=slave,
        stderr=slave,
        start_new_session=True,
        preexec_fn=ctty,
    )
    os.close(slave)
    return p, master


def _read_until(master: int, pattern: str, timeout: float = 30.0) -> str:
    seen = b""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if select.select([master], [], [], 0.1)[0]:
            try:
                seen += os.read(master, 65536)
            except OSError:
                break
            if re.search(pattern, seen.decode(errors="replace")):
                return seen.decode(errors="replace")
    raise AssertionError(f"{pattern!r} not seen on the terminal: {seen.decode(errors='replace')!r}")


@pytest.mark.slow
def test_job_control_at_a_terminal_still_works(spool_env, tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    p, master = _pty_shell(spool_env.env())
    try:
        _read_until(master, r"\$ $")
        cmd = shlex.join(spool_env.argv("run", "--stage", "s", "--", "sh", "-c", f"touch {ready}; sleep 3; echo slept"))
        os.write(master, f"{cmd}\n".encode())
        deadline = time.monotonic() + 60
        while not ready.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.3)
        os.write(master, b"\x1a")  # Ctrl-Z
        _read_until(master, r"Stopped")
        time.sleep(1)
        os.write(master, b"jobs -l\n")
        _read_until(master, r"Stopped")
        os.write(master, b"fg\n")
        _read_until(master, r"slept")
        os.write(master, b"echo rc=$?\n")
        _read_until(master, r"rc=0")
        os.write(master, b"exit\n")
        p.wait(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
        os.close(master)


# A SignalWatcher whose thread is interrupted ~1,000 times a second by a signal it does not wait for (SIGALRM, with a
# Python handler: each one ends its wait with EINTR, as a debugger or profiler attaching does; py-spy's sampling
# did it 90 times in 3 s): prints what it was handed, though nobody sent it one of the stage's signals.
INTERRUPTED_WATCHER = r"""
import signal, threading, time
from flightrec.producer.term import HANDLED, SignalWatcher, block
signal.signal(signal.SIGALRM, lambda *a: None)
block()
got = []
w = SignalWatcher(lambda signum, code, pid: got.append(signum))
w.start()
real = signal.SIGUSR1
end = time.monotonic() + 2.0
while time.monotonic() < end:
    signal.pthread_kill(w.ident, signal.SIGALRM)
    time.sleep(0.001)
signal.pthread_kill(w.ident, real)  # one real signal, to see the watcher still takes them
deadline = time.monotonic() + 10
while not got and time.monotonic() < deadline:  # a loaded machine may keep the watcher waiting
    time.sleep(0.01)
time.sleep(0.1)
w.stop()
print(sorted(got))
"""


def test_a_signal_watcher_interrupted_by_other_signals_is_handed_none_nobody_sent() -> None:
    # CPython's sigtimedwait, interrupted as its timeout ran out, returned the siginfo its stack still held: signal 0,
    # garbage, or a copy of the last real one (which the agent would pass on to CMD a second time)
    out = subprocess.run([PY, "-c", INTERRUPTED_WATCHER], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == f"[{int(signal.SIGUSR1)}]", out.stdout[-2000:]
