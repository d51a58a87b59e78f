"""A seal never splits a boot: background stages and a slow facts probe belong to the boot being sealed.

Checked at the agent's spool (``spool_env``); one case goes through the real broker (``agent_env``)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from flightrec.schemas import InstanceFacts, Lifecycle, ProcessExit, Sealed

PY = sys.executable
TUNNEL = (
    "import sys, time\nprint('tunnel up', flush=True)\ntime.sleep({s})\nprint('tunnel down', flush=True)\nsys.exit(2)"
)


def _one_sealed_boot(evs: list) -> Sealed:
    assert len({e.boot_id for e in evs}) == 1, f"a phantom boot: {evs}"
    assert [e.seq for e in evs] == list(range(len(evs)))
    seal = evs[-1]
    assert isinstance(seal, Sealed) and seal.event_count == len(evs)
    return seal


def _start_tunnel(agent_env, env: dict[str, str], seconds: float) -> subprocess.Popen:
    p = subprocess.Popen(
        agent_env.argv("run", "--stage", "tunnel", "--no-facts", "--", PY, "-c", TUNNEL.format(s=seconds)),
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert p.stdout is not None and p.stdout.readline() == b"tunnel up\n"
    return p


def test_the_seal_waits_for_a_background_stage(agent_env) -> None:
    env = agent_env.env(FLIGHTREC_SEAL_WAIT="60")
    tunnel = _start_tunnel(agent_env, env, 3)
    r = agent_env.run("run", "--stage", "supervisor", "--no-facts", "--", "true", env=env)
    assert r.returncode == 0, r.stderr
    out, err = tunnel.communicate(timeout=60)
    assert tunnel.returncode == 2 and out == b"tunnel down\n", err
    evs = agent_env.events()
    seal = _one_sealed_boot(evs)
    assert "still running" not in seal.reason
    assert [e.exit_code for e in evs if isinstance(e, ProcessExit) and e.stage == "tunnel"] == [2]
    assert ("tunnel", "failed") in [(e.stage, e.state) for e in evs if isinstance(e, Lifecycle)]
    assert agent_env.lines("stdout", stage="tunnel") == [
        (1, "tunnel up", False, False),
        (2, "tunnel down", False, False),
    ]


@pytest.mark.slow
def test_a_stage_outliving_the_wait_is_named_in_the_seal_and_opens_no_new_boot(spool_env) -> None:
    env = spool_env.env(FLIGHTREC_SEAL_WAIT="1")
    tunnel = _start_tunnel(spool_env, env, 5)
    r = spool_env.run("run", "--stage", "supervisor", "--no-facts", "--", "true", env=env)
    assert r.returncode == 0, r.stderr
    out, err = tunnel.communicate(timeout=60)
    assert tunnel.returncode == 2 and out == b"tunnel down\n"  # the stage itself is untouched
    assert b"NOT RECORDED" in err and b"sealed" in err  # and it says what it could not record
    evs = spool_env.events()
    seal = _one_sealed_boot(evs)
    assert "still running" in seal.reason and "tunnel" in seal.reason


@pytest.mark.slow
def test_the_seal_waits_for_a_slow_nvidia_smi(spool_env, tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"  # a real process standing in for a slow driver (no GPU here)
    smi.write_text(
        '#!/bin/sh\ncase "$1" in\n  --query-gpu*) sleep 3; echo "NVIDIA H200, 143771, 550.54, 9.0";;\n'
        '  *) echo "| NVIDIA-SMI 550.54   Driver Version: 550.54   CUDA Version: 12.4 |";;\nesac\n'
    )
    smi.chmod(0o755)
    env = spool_env.env(PATH=f"{bin_dir}:/usr/bin:/bin", FLIGHTREC_SEAL_WAIT="60")
    r = spool_env.run("run", "--stage", "supervisor", "--", "true", env=env)
    assert r.returncode == 0, r.stderr
    evs = spool_env.events()
    _one_sealed_boot(evs)
    (facts,) = [e for e in evs if isinstance(e, InstanceFacts)]
    assert facts.gpu_model == "NVIDIA H200" and facts.cuda_version == "12.4"


def test_a_daemon_meant_to_live_on_holds_a_healthy_seal_at_most_the_late_wait(spool_env, tmp_path: Path) -> None:
    # the supervisor leaves its prover running (holding the stage's stdout, quiet), then ends normally
    env = spool_env.env(FLIGHTREC_LATE_WAIT="1.5")
    pidfile = tmp_path / "prover.pid"
    script = f'sleep 30 & echo $! > {pidfile}; echo "supervisor: prover started"; exit 0'
    with open(tmp_path / "out", "wb") as out:  # a file, as a container's log (a pipe would wait for the prover)
        t0 = time.monotonic()
        r = spool_env.run(
            "run",
            "--stage",
            "supervisor",
            "--no-facts",
            "--",
            "sh",
            "-c",
            script,
            env=env,
            capture_output=False,
            stdout=out,
            stderr=out,
        )
        took = time.monotonic() - t0
    prover = int(pidfile.read_text())
    try:
        assert r.returncode == 0, (tmp_path / "out").read_text()
        assert took < 1.5 + 3.0, f"the healthy seal took {took:.1f}s with FLIGHTREC_LATE_WAIT=1.5"
        seal = _one_sealed_boot(spool_env.events())
        assert "late output still running when sealed" in seal.reason, seal.reason
        assert f"stage supervisor (pid {prover} (sleep 30)), after waiting 1.5s" in seal.reason, seal.reason
        assert Path(f"/proc/{prover}").exists()  # the prover is untouched
    finally:
        os.kill(prover, signal.SIGKILL)


LATE_STAGE = 'sh -c \'sleep {delay}; echo "daemon: the decisive line"\' & echo "stage: started the daemon"; exit 1'


def _late_lines(evs: list, sealed: Sealed) -> list[str]:
    from flightrec.schemas import LogBatch

    return [t for b in evs if isinstance(b, LogBatch) and b.seq < sealed.seq for t in b.text]


@pytest.mark.slow
def test_a_seal_killed_while_it_waits_does_not_stop_the_recording(spool_env, tmp_path: Path) -> None:
    env = spool_env.env(FLIGHTREC_LATE_WAIT="1")
    with open(tmp_path / "out", "wb") as out:
        r = spool_env.run(
            "run",
            "--stage",
            "benchmark",
            "--",
            "sh",
            "-c",
            LATE_STAGE.format(delay=3),
            env=env,
            capture_output=False,
            stdout=out,
            stderr=out,
        )
    assert r.returncode == 1
    seal = subprocess.Popen(spool_env.argv("seal"), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(0.6)  # it asked the late-output process to finish the stage, and waits
    seal.kill()
    seal.wait()
    time.sleep(1.5)  # longer than FLIGHTREC_LATE_WAIT: a seal still waiting would have stopped the recording
    assert spool_env.run("seal", env=env).returncode == 0
    evs = spool_env.events()
    sealed = _one_sealed_boot(evs)
    assert "daemon: the decisive line" in _late_lines(evs, sealed), sealed.reason


@pytest.mark.slow
def test_a_late_output_process_killed_while_the_seal_waits_is_named(spool_env, tmp_path: Path) -> None:
    env = spool_env.env(FLIGHTREC_LATE_WAIT="30")
    with open(tmp_path / "out", "wb") as out:
        r = spool_env.run(
            "run",
            "--stage",
            "benchmark",
            "--",
            "sh",
            "-c",
            LATE_STAGE.format(delay=5),
            env=env,
            capture_output=False,
            stdout=out,
            stderr=out,
        )
    assert r.returncode == 1
    inst = spool_env.spool / spool_env.instance
    deadline = time.monotonic() + 30
    while not ((inst / "late.log").exists() and "handed off" in (inst / "late.log").read_text()):
        assert time.monotonic() < deadline, "the late-output process never took the stage"
        time.sleep(0.05)
    late = int((inst / "late.pid").read_text())
    seal = subprocess.Popen(spool_env.argv("seal"), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    time.sleep(1.0)
    os.kill(late, signal.SIGKILL)  # the OOM killer, mid-wait
    _out, err = seal.communicate(timeout=60)
    assert seal.returncode == 0
    sealed = _one_sealed_boot(spool_env.events())
    assert "stage benchmark (its late-output process" in sealed.reason and "is gone" in sealed.reason, sealed.reason
    assert b"is gone" in err


# a daemon that sets its own process title (over its environment, and so over the stage's token) and keeps its log
# open for writing: found by its open file, not by its environment
TITLED = """
import sys, time
log = open(sys.argv[1], "a", buffering=1)
import setproctitle
setproctitle.setproctitle("prover-daemon " + "x" * 300)
log.write("daemon: starting, loading parameters\\n")
time.sleep(3)
log.write("daemon: CUDA error: no kernel image is available for execution on the device\\n")
"""


@pytest.mark.slow
def test_a_daemon_that_hides_its_token_is_still_waited_for(spool_env, tmp_path: Path) -> None:
    from flightrec.schemas import LogBatch

    log = tmp_path / "daemon.log"
    log.touch()
    daemon = tmp_path / "daemon.py"
    daemon.write_text(TITLED)
    env = spool_env.env(FLIGHTREC_LATE_WAIT="30")
    script = f'setsid "{PY}" "{daemon}" "{log}" </dev/null >/dev/null 2>&1 & sleep 0.3; exit 1'
    with open(tmp_path / "out", "wb") as out:
        r = spool_env.run(
            "run",
            "--stage",
            "benchmark",
            "--tail",
            str(log),
            "--no-facts",
            "--",
            "sh",
            "-c",
            script,
            env=env,
            capture_output=False,
            stdout=out,
            stderr=out,
        )
    assert r.returncode == 1
    assert spool_env.run("seal", env=env).returncode == 0
    evs = spool_env.events()
    sealed = _one_sealed_boot(evs)
    lines = [t for b in evs if isinstance(b, LogBatch) and b.seq < sealed.seq for t in b.text]
    assert "daemon: CUDA error: no kernel image is available for execution on the device" in lines, lines


@pytest.mark.slow
def test_late_lines_after_the_seal_never_open_a_boot_of_their_own(spool_env, tmp_path: Path) -> None:
    """(Found by review.) The seal waits its own FLIGHTREC_LATE_WAIT, whatever the stage's was; what the leftover
    writes after the seal is passed on and not recorded, never spooled as a new boot."""
    ticker = '(for i in $(seq 1 16); do echo "tick $i"; sleep 0.5; done) & exit 0'
    with open(tmp_path / "out", "wb") as out:
        r = spool_env.run(
            "run",
            "--stage",
            "s",
            "--no-facts",
            "--",
            "sh",
            "-c",
            ticker,
            env=spool_env.env(FLIGHTREC_LATE_WAIT="30"),
            capture_output=False,
            stdout=out,
            stderr=out,
        )
        assert r.returncode == 0
        t0 = time.monotonic()
        seal = spool_env.run("seal", env=spool_env.env(FLIGHTREC_LATE_WAIT="2"))
        took = time.monotonic() - t0
    assert seal.returncode == 0 and took < 2 + 5, took
    time.sleep(9)  # the ticker goes on for its last seconds, passed on to the file
    assert "tick 16" in (tmp_path / "out").read_text()
    evs = spool_env.events()
    seal_ev = _one_sealed_boot(evs)  # one boot, sealed last: no phantom boot of late lines after it
    assert "still running when sealed" in seal_ev.reason and "after waiting 2s" in seal_ev.reason, seal_ev.reason
