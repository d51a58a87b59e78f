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
    return agent_env.env(
        PATH=f"{bin_dir}:{os.environ['PATH']}", WORK=str(tmp_path / "work"), MANAGER_TOKEN="mgr-token-5e2f9a", **extra
    )


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
        t for _, t, *_ in agent_env.lines("stdout", stage="params")
    ]


def test_entrypoint_gpu_failure_is_explained(agent_env, tmp_path: Path) -> None:
    import subprocess

    p = subprocess.run(
        ["bash", str(ENTRYPOINT)], env=_env(agent_env, tmp_path, FAKE_GPU_FAIL="1"), capture_output=True, timeout=180
    )
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


# flightrec without flightrec: `agent run [FLAGS] -- CMD` runs CMD itself; every other command does nothing
NO_AGENT = """#!/bin/sh
[ "$1 $2" = "agent run" ] || exit 0
while [ "$1" != "--" ]; do shift; done
shift
exec "$@"
"""


def test_broker_away_costs_the_entrypoint_nothing_and_flush_delivers_everything_once(agent_env, tmp_path: Path) -> None:
    import socket
    import subprocess
    import time

    from flightrec.producer.spool import instance_dir
    from flightrec.schemas import Event, decode

    stub = tmp_path / "no-agent"
    stub.write_text(NO_AGENT)
    stub.chmod(0o755)

    def timed(env: dict[str, str]) -> float:
        t0 = time.monotonic()
        p = subprocess.run(
            ["bash", str(ENTRYPOINT)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=300
        )
        assert p.returncode == 0, p.stderr.decode()[-3000:]
        return time.monotonic() - t0

    with socket.socket() as held:  # bound, never listening: every connection to it is refused
        held.bind(("127.0.0.1", 0))
        away = f"127.0.0.1:{held.getsockname()[1]}"
        env = _env(agent_env, tmp_path, FLIGHTREC_BOOTSTRAP=away, FLIGHTREC_FLUSH_TIMEOUT="10")
        without = timed({**env, "FLIGHTREC": str(stub), "WORK": str(tmp_path / "work0")})
        took = timed(env)
    assert took < without + 5, f"the 5-stage entrypoint took {took:.1f}s under the agent, {without:.1f}s without"
    spooled = len(list(instance_dir(agent_env.spool, agent_env.instance).glob("*.seg")))
    assert spooled and not agent_env.events(), "nothing may have reached Kafka while it was away"

    r = agent_env.run("flush", "--timeout", "60")
    assert r.returncode == 0, r.stderr
    evs: list[Event] = agent_env.events()
    assert evs and isinstance(evs[-1], Sealed)
    assert [e.seq for e in evs] == list(range(len(evs))) == list(range(evs[-1].event_count))  # each once, none lost
    assert len({e.event_id for e in evs}) == len(evs)
    assert {decode(m.value).event_id for m in agent_env.kafka.consume() if m.key == agent_env.instance.encode()} == {
        e.event_id for e in evs
    }
