"""`flightrec agent run`: exit codes, signals, stdin, byte-identical output.

The agent's behaviour is checked at its spool (``spool_env``: no broker, Kafka adds nothing to it);
one test per family also goes through the real broker (``agent_env``), so the delivery path is covered."""

from __future__ import annotations

import hashlib
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from flightrec.schemas import Lifecycle, ProcessExit

PY = sys.executable


def _check_exit_code(agent_env, code: int) -> None:
    r = agent_env.run("run", "--stage", "bench", "--", "sh", "-c", f"echo out; echo err >&2; exit {code}")
    assert r.returncode == code, r.stderr
    assert r.stdout == b"out\n"
    assert r.stderr.endswith(b"err\n")
    exits = agent_env.of(ProcessExit)
    assert [(e.exit_code, e.signal) for e in exits] == [(code, None)]
    assert exits[0].stdout_tail == ("out",) and exits[0].stderr_tail == ("err",)
    assert exits[0].argv[:2] == ("sh", "-c") and exits[0].duration_s >= 0
    states = [(e.stage, e.state) for e in agent_env.of(Lifecycle)]
    assert states == [("bench", "started"), ("bench", "succeeded" if code == 0 else "failed")]
    if code:
        assert f"exit code {code}" in agent_env.of(Lifecycle)[-1].detail
        assert "err" in agent_env.of(Lifecycle)[-1].detail


@pytest.mark.parametrize("code", [0, 1, 3])
def test_exit_codes_pass_through(spool_env, code: int) -> None:
    _check_exit_code(spool_env, code)


def test_exit_code_tails_and_states_reach_kafka(agent_env) -> None:
    _check_exit_code(agent_env, 3)


def _check_death_by_signal(agent_env, sig: signal.Signals) -> None:
    r = agent_env.run(
        "run",
        "--stage",
        "daemon",
        "--",
        PY,
        "-c",
        f"import os,sys; print('dying', flush=True); os.kill(os.getpid(), {int(sig)})",
    )
    assert r.returncode == 128 + sig
    ex = agent_env.of(ProcessExit)[0]
    assert (ex.exit_code, ex.signal, ex.signal_name) == (None, int(sig), sig.name)
    assert ex.stdout_tail == ("dying",)
    assert sig.name in agent_env.of(Lifecycle)[-1].detail


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGSEGV])
def test_death_by_signal_gives_128_plus_n(spool_env, sig: signal.Signals) -> None:
    _check_death_by_signal(spool_env, sig)


def test_death_by_signal_reaches_kafka(agent_env) -> None:
    _check_death_by_signal(agent_env, signal.SIGSEGV)


TRAP = """
import signal, sys, time
def h(n, f):
    print("got", n, flush=True)
    sys.exit(40 + n)
for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
    signal.signal(s, h)
print("ready", flush=True)
time.sleep(60)
sys.exit(99)
"""


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_signal_to_the_agent_reaches_cmd(spool_env, sig: signal.Signals) -> None:
    p = subprocess.Popen(
        spool_env.argv("run", "--stage", "sup", "--", PY, "-c", TRAP),
        env=spool_env.env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert p.stdout is not None
    assert p.stdout.readline() == b"ready\n"
    p.send_signal(sig)
    out, _ = p.communicate(timeout=60)
    assert out == f"got {int(sig)}\n".encode()
    assert p.returncode == 40 + sig
    assert spool_env.of(ProcessExit)[0].exit_code == 40 + sig


def test_stdin_passes_through(spool_env) -> None:
    data = os.urandom(300_000) + b"\nlast line\n"
    r = spool_env.run(
        "run",
        "--stage",
        "s",
        "--",
        PY,
        "-c",
        "import sys,hashlib; print(hashlib.sha256(sys.stdin.buffer.read()).hexdigest())",
        input=data,
    )
    assert r.returncode == 0
    assert r.stdout.decode().strip() == hashlib.sha256(data).hexdigest()


def test_environment_and_working_folder_pass_through(spool_env, tmp_path: Path) -> None:
    r = spool_env.run(
        "run",
        "--stage",
        "s",
        "--",
        "sh",
        "-c",
        'echo "$MY_VAR"; pwd',
        env=spool_env.env(MY_VAR="hello env"),
        cwd=tmp_path,
    )
    assert r.stdout.decode().splitlines() == ["hello env", str(tmp_path)]


NOISY = r"""
import os, random, sys
rnd = random.Random(7)
for i in range(400):
    blob = bytes(rnd.getrandbits(8) for _ in range(rnd.randint(0, 3000)))
    (sys.stdout if i % 3 else sys.stderr).buffer.write(blob + (b"\n" if i % 5 else b"\r"))
    if i % 50 == 0:
        sys.stdout.flush(); sys.stderr.flush()
sys.stdout.buffer.write(b"no newline at the end \xff")
"""


def test_output_is_byte_identical_to_running_cmd_directly(agent_env) -> None:
    direct = subprocess.run([PY, "-c", NOISY], capture_output=True, timeout=60)
    wrapped = agent_env.run("run", "--stage", "noise", "--", PY, "-c", NOISY)
    assert wrapped.returncode == direct.returncode == 0
    assert hashlib.sha256(wrapped.stdout).digest() == hashlib.sha256(direct.stdout).digest()
    assert hashlib.sha256(wrapped.stderr).digest() == hashlib.sha256(direct.stderr).digest()
    assert len(direct.stdout) > 100_000
    # and the lines that were shipped say which held non-UTF-8 bytes
    out = agent_env.lines("stdout")
    assert [n for n, *_ in out] == list(range(1, len(out) + 1))
    assert any(inv for *_, inv in out)
    assert out[-1][1] == "no newline at the end \\xff" and out[-1][3]


def test_command_not_found_gives_127(spool_env) -> None:
    r = spool_env.run("run", "--stage", "tunnel", "--", "no-such-command-flightrec")
    assert r.returncode == 127
    assert b"command not found" in r.stderr
    ex = spool_env.of(ProcessExit)[0]
    assert ex.exit_code == 127 and "command not found" in ex.start_error
    assert spool_env.of(Lifecycle)[-1].state == "failed"
    assert "command not found" in spool_env.of(Lifecycle)[-1].detail


def test_command_not_executable_gives_126(spool_env, tmp_path: Path) -> None:
    script = tmp_path / "script.sh"
    script.write_text("#!/bin/sh\necho hi\n")
    script.chmod(0o644)
    r = spool_env.run("run", "--stage", "register", "--", str(script))
    assert r.returncode == 126
    ex = spool_env.of(ProcessExit)[0]
    assert ex.exit_code == 126 and "permission denied" in ex.start_error


def test_lines_are_shipped_while_cmd_runs(agent_env) -> None:
    """A line reaches Kafka while CMD still runs (batches leave within ~100 ms, not at exit)."""
    p = subprocess.Popen(
        agent_env.argv(
            "run", "--stage", "s", "--", PY, "-c", "import time; print('early', flush=True); time.sleep(60)"
        ),
        env=agent_env.env(),
        stdout=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        assert p.stdout is not None and p.stdout.readline() == b"early\n"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not agent_env.lines("stdout"):
            time.sleep(0.5)
        assert [t for _, t, *_ in agent_env.lines("stdout")] == ["early"]
        assert p.poll() is None
    finally:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait(30)


def test_heartbeats_while_a_stage_runs_counted_in_seq(spool_env) -> None:
    from flightrec.schemas import Heartbeat

    r = spool_env.run(
        "run", "--stage", "bench", "--seal", "--", "sleep", "1.2", env=spool_env.env(FLIGHTREC_HEARTBEAT_S="0.25")
    )
    assert r.returncode == 0, r.stderr
    beats = spool_env.of(Heartbeat)
    assert 3 <= len(beats) <= 8, len(beats)
    assert {(b.stage, b.interval_s) for b in beats} == {("bench", 0.25)}
    assert all(b.pid > 0 for b in beats)
    events = spool_env.events()
    seqs = sorted(e.seq for e in events)
    assert seqs == list(range(len(seqs)))  # gap-free with the heartbeats in it
    assert max(e.event_count for e in events if hasattr(e, "event_count")) == len(seqs)


def test_no_heartbeats_when_the_interval_is_zero(spool_env) -> None:
    from flightrec.schemas import Heartbeat

    r = spool_env.run("run", "--stage", "bench", "--", "sleep", "0.5", env=spool_env.env(FLIGHTREC_HEARTBEAT_S="0"))
    assert r.returncode == 0
    assert spool_env.of(Heartbeat) == []


BEHIND = 10_000  # lines CMD writes in one burst just before it exits: they fit in the pipe (1 MiB)
BURST = (
    "import os, sys, time\n"
    "print('ready', flush=True)\n"
    "while not os.path.exists(sys.argv[1]): time.sleep(0.01)\n"
    f"sys.stdout.write(''.join('burst line %06d\\n' % i for i in range({BEHIND})))\n"
    "sys.stdout.flush()\n"
    "open(sys.argv[2], 'w').close()\n"
)


def test_output_still_unread_when_cmd_exits_is_read_to_its_end_by_the_agent(agent_env, tmp_path: Path) -> None:
    """CMD wrote its last lines and exited, and nothing it started holds its output: the agent reads those lines to
    their end before the stage's end events and its own exit, however far its reading fell behind (here: the spool is
    locked by someone else for a second after CMD exited). Once seen in CI: under load the reader was still busy 0.1 s
    after CMD exited; the agent took that for output of a process left behind, handed it to a late-output process,
    exited, and the lines reached Kafka after the agent had said the stage ended."""
    import fcntl

    from flightrec.producer.names import instance_dir
    from flightrec.schemas import LogBatch

    go, done = tmp_path / "go", tmp_path / "done"
    agent = subprocess.Popen(
        agent_env.argv("run", "--stage", "burst", "--", PY, "-c", BURST, str(go), str(done)),
        env=agent_env.env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert agent.stdout is not None and agent.stdout.readline() == b"ready\n"
        lock = os.open(instance_dir(agent_env.spool, agent_env.instance) / "lock", os.O_RDWR)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)  # the agent's reader blocks at its next spool write
            go.touch()
            deadline = time.monotonic() + 60
            while not done.exists():
                assert time.monotonic() < deadline, "CMD did not write its burst"
                time.sleep(0.01)
            time.sleep(1.0)  # CMD has exited; its output waits in the pipe and in the agent's reader
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
            os.close(lock)
        out, err = agent.communicate(timeout=120)
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.wait()
    assert agent.returncode == 0, err.decode(errors="replace")[-3000:]
    assert out.count(b"burst line") == BEHIND  # every byte passed through, as ever
    assert b"late-output process" not in err, err.decode(errors="replace")[-3000:]
    events = agent_env.events()  # read at once: nothing may be left for a process that outlives the agent
    lines = [(e.seq, t) for e in events if isinstance(e, LogBatch) for t in e.text]
    assert [t for _, t in lines] == ["ready"] + [f"burst line {i:06d}" for i in range(BEHIND)]
    assert not any(any(getattr(e, "late", ()) or ()) for e in events if isinstance(e, LogBatch))
    end = next(e.seq for e in events if isinstance(e, ProcessExit))
    assert max(s for s, _ in lines) < end, "a line was recorded after the stage's end"


@pytest.mark.parametrize("closed", [">&-", "2>&-", ">&- 2>&-", "<&- >&- 2>&-"])
def test_the_agent_with_its_own_streams_closed_keeps_the_commands_exit_status(
    spool_env, tmp_path: Path, closed: str
) -> None:
    """A `set -e` entrypoint run with stdout or stderr closed: the agent exits with CMD's status, not 1 with a
    traceback, and records what CMD wrote (no file the agent opens takes a closed stream's number)."""
    agent = " ".join(shlex.quote(a) for a in spool_env.argv("run", "--stage", "closed"))
    status, err = tmp_path / "status", tmp_path / "err"
    script = f"{agent} -- sh -c 'echo to-out; echo to-err >&2; exit 3' {closed}; echo $? > {status}"
    if "2>&-" not in closed:
        script = f"exec 2> {err}; {script}"
    subprocess.run(["sh", "-c", script], env=spool_env.env(), timeout=120, stdout=subprocess.DEVNULL)
    assert status.read_text().strip() == "3"
    assert not err.exists() or "Traceback" not in err.read_text(), err.read_text()
    lines = {t for _n, t, _cut, _bad in spool_env.lines("stdout") + spool_env.lines("stderr")}
    assert lines == {"to-out", "to-err"}, lines
    (exit_,) = spool_env.of(ProcessExit)
    assert exit_.exit_code == 3


def test_a_stage_name_that_is_not_utf8_runs_the_command_and_is_recorded_escaped(spool_env) -> None:
    stage = os.fsdecode(b"bench\xff\xfe")  # argv bytes that are not UTF-8 (surrogate escapes in Python)
    r = subprocess.run(
        [*spool_env.argv("run", "--stage", stage), "--", "sh", "-c", "echo ran; exit 4"],
        env=spool_env.env(),
        capture_output=True,
        timeout=120,
    )
    assert r.returncode == 4, r.stderr
    assert b"Traceback" not in r.stderr and r.stdout == b"ran\n"
    (exit_,) = spool_env.of(ProcessExit)
    assert exit_.stage == "bench\\xff\\xfe"


def test_a_setting_the_agent_cannot_read_does_not_stop_the_command(spool_env) -> None:
    """FLIGHTREC_HEARTBEAT_S=abc in an image's environment: the stage still runs and keeps its exit status; the
    agent says what it could not read and uses the default."""
    r = spool_env.run(
        "run", "--stage", "s", "--", "sh", "-c", "echo ran; exit 6", env=spool_env.env(FLIGHTREC_HEARTBEAT_S="abc")
    )
    assert r.returncode == 6 and r.stdout == b"ran\n", r.stderr
    assert b"FLIGHTREC_HEARTBEAT_S='abc' is not a number" in r.stderr and b"default" in r.stderr
    assert [e.state for e in spool_env.of(Lifecycle)][:1] == ["started"]
