"""examples/entrypoint.sh end to end with its stand-in tools: a good boot and the motivating failure."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from flightrec.schemas import Lifecycle, ProcessExit, Sealed

pytestmark = pytest.mark.integration
ENTRYPOINT = Path(__file__).resolve().parents[2] / "examples" / "entrypoint.sh"


def _env(agent_env, tmp_path: Path, **extra: str) -> dict[str, str]:
    bin_dir = str(Path(sys.executable).parent)
    return agent_env.env(PATH=f"{bin_dir}:{os.environ['PATH']}", WORK=str(tmp_path / "work"),
                         MANAGER_TOKEN="mgr-token-5e2f9a", **extra)


def test_entrypoint_good_boot_is_sealed_and_complete(agent_env, tmp_path: Path) -> None:
    import subprocess

    p = subprocess.run(["bash", str(ENTRYPOINT)], env=_env(agent_env, tmp_path), capture_output=True, timeout=180)
    assert p.returncode == 0, p.stderr.decode()[-3000:]
    assert b"supervisor: proof batch 3 done" in p.stdout
    evs = agent_env.events()
    last_boot = [e for e in evs if e.boot_id == evs[-1].boot_id]
    assert isinstance(last_boot[-1], Sealed) and last_boot[-1].event_count == len(last_boot)
    assert [e.seq for e in last_boot] == list(range(len(last_boot)))
    stages = {(e.stage, e.state) for e in last_boot if isinstance(e, Lifecycle)}
    for st in ("tunnel", "register", "params", "benchmark", "supervisor"):
        assert (st, "started") in stages and (st, "succeeded") in stages, st
    shipped = b"".join(m.value for m in agent_env.kafka.consume() if m.key == agent_env.instance.encode())
    assert b"mgr-token-5e2f9a" not in shipped
    assert ["params: downloading 100%", "params: ready in " + str(tmp_path / "work" / "params")] == [
        t for _, t, *_ in agent_env.lines("stdout", stage="params")]


def test_entrypoint_gpu_failure_is_explained(agent_env, tmp_path: Path) -> None:
    import subprocess

    p = subprocess.run(["bash", str(ENTRYPOINT)], env=_env(agent_env, tmp_path, FAKE_GPU_FAIL="1"),
                       capture_output=True, timeout=180)
    assert p.returncode == 1
    evs = agent_env.events()
    (ex,) = [e for e in evs if isinstance(e, ProcessExit) and e.stage == "benchmark"]
    assert ex.exit_code == 1 and ex.stderr_tail == ("benchmark exited with error",)
    # the daemon says why 0.5 s after it started, after the benchmark script exited: a late line of the
    # stage, spooled before the exit trap's seal (which waits for it)
    daemon_log = ex.file_tails[0].path
    lines = [t for _, t, late in agent_env.late_lines(daemon_log, stage="benchmark") if late]
    assert any(t.startswith("daemon: CUDA error 700") for t in ex.file_tails[0].lines + tuple(lines)), lines
    assert not any(isinstance(e, Lifecycle) and e.stage == "supervisor" for e in evs)
    assert isinstance(evs[-1], Sealed) and evs[-1].event_count == len(evs)  # sealed before it may be destroyed
    assert [e.seq for e in evs] == list(range(len(evs)))
