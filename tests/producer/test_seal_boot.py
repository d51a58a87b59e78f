"""A seal never splits a boot: background stages and a slow facts probe belong to the boot being sealed.

Checked at the agent's spool (``spool_env``); one case goes through the real broker (``agent_env``)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from flightrec.schemas import InstanceFacts, Lifecycle, ProcessExit, Sealed

PY = sys.executable
TUNNEL = "import sys, time\nprint('tunnel up', flush=True)\ntime.sleep({s})\nprint('tunnel down', flush=True)\nsys.exit(2)"


def _one_sealed_boot(evs: list) -> Sealed:
    assert len({e.boot_id for e in evs}) == 1, f"a phantom boot: {evs}"
    assert [e.seq for e in evs] == list(range(len(evs)))
    seal = evs[-1]
    assert isinstance(seal, Sealed) and seal.event_count == len(evs)
    return seal


def _start_tunnel(agent_env, env: dict[str, str], seconds: float) -> subprocess.Popen:
    p = subprocess.Popen(agent_env.argv("run", "--stage", "tunnel", "--no-facts", "--", PY, "-c",
                                        TUNNEL.format(s=seconds)),
                         env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
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
    assert agent_env.lines("stdout", stage="tunnel") == [(1, "tunnel up", False, False), (2, "tunnel down", False, False)]


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


def test_the_seal_waits_for_a_slow_nvidia_smi(spool_env, tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"  # a real process standing in for a slow driver (no GPU here)
    smi.write_text('#!/bin/sh\ncase "$1" in\n  --query-gpu*) sleep 3; echo "NVIDIA H200, 143771, 550.54, 9.0";;\n'
                   '  *) echo "| NVIDIA-SMI 550.54   Driver Version: 550.54   CUDA Version: 12.4 |";;\nesac\n')
    smi.chmod(0o755)
    env = spool_env.env(PATH=f"{bin_dir}:/usr/bin:/bin", FLIGHTREC_SEAL_WAIT="60")
    r = spool_env.run("run", "--stage", "supervisor", "--", "true", env=env)
    assert r.returncode == 0, r.stderr
    evs = spool_env.events()
    _one_sealed_boot(evs)
    (facts,) = [e for e in evs if isinstance(e, InstanceFacts)]
    assert facts.gpu_model == "NVIDIA H200" and facts.cuda_version == "12.4"
