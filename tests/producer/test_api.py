"""The library API (sync and async), `agent event/seal/facts`, instance facts, and seq shared by concurrent agents.

The library API delivers through the real broker (``agent_env``); the `agent` commands' events are checked
at the spool (``spool_env``: no broker, Kafka adds nothing to them)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest
from flightrec.producer import Agent, open_agent
from flightrec.producer.facts import parse_cuda_version, parse_gpu_query
from flightrec.schemas import Heartbeat, InstanceFacts, Lifecycle, Sealed, Throughput

from flightrec import __version__
from flightrec.errors import ConfigError


def _settings(agent_env, **kw):
    return dataclasses.replace(agent_env.kafka.settings, spool=str(agent_env.spool), flush_timeout=30.0, **kw)


def test_sync_api_emit_stage_seal(agent_env) -> None:
    s = _settings(agent_env)
    with open_agent(instance_id=agent_env.instance, settings=s) as agent:
        ev = agent.emit(Throughput, stage="benchmark", backend="cpu", proofs=1, seconds=2.0, proofs_per_hour=1800.0)
        assert (ev.instance_id, ev.seq) == (agent_env.instance, 0) and ev.event_id and ev.ts_us > 0
        with agent.stage("benchmark"):
            pass
        with pytest.raises(RuntimeError, match="no GPU"), agent.stage("prove"):
            raise RuntimeError("no GPU")
        sealed = agent.seal("done")
        assert agent.flush(30)
    evs = agent_env.events()
    assert [e.seq for e in evs] == list(range(8))  # each stage sends a heartbeat as it starts
    assert [(e.stage, e.interval_s) for e in evs if isinstance(e, Heartbeat)] == [("benchmark", 30.0), ("prove", 30.0)]
    assert [(e.stage, e.state) for e in evs if isinstance(e, Lifecycle)] == [
        ("benchmark", "started"),
        ("benchmark", "succeeded"),
        ("prove", "started"),
        ("prove", "failed"),
    ]
    failed = [e for e in evs if isinstance(e, Lifecycle)][-1]
    assert failed.detail == "RuntimeError: no GPU"
    assert isinstance(evs[-1], Sealed) and evs[-1] == sealed and sealed.event_count == 8
    assert len({e.boot_id for e in evs}) == 1
    with pytest.raises(TypeError, match="fills seq"):
        open_agent(instance_id=agent_env.instance, settings=s, deliver=False).emit(
            Lifecycle, seq=3, stage="x", state="info"
        )


def test_a_huge_detail_is_cut_so_the_event_still_fits_a_kafka_message(agent_env) -> None:
    s = _settings(agent_env)
    with open_agent(instance_id=agent_env.instance, settings=s) as agent:
        ev = agent.event("params", "failed", detail="x" * 10_000_000, attributes={"why": "y" * 200_000})
        assert agent.flush(30)
    assert len(ev.detail) == s.max_line + len(" [cut]") and ev.detail.endswith(" [cut]")
    assert ev.attributes["why"].endswith(" [cut]")
    (got,) = agent_env.of(Lifecycle)
    assert got == ev


async def test_async_api(agent_env) -> None:
    s = _settings(agent_env)
    async with Agent(instance_id=agent_env.instance, settings=s) as agent:
        async with agent.stage("tunnel", port="2222"):
            agent.emit(Lifecycle, stage="tunnel", state="info", detail="connected to https://u:pw@relay")
        assert await agent.flush(30)
    evs = await asyncio.to_thread(agent_env.of, Lifecycle)  # the helper runs a loop of its own
    assert [e.state for e in evs] == ["started", "info", "succeeded"]
    assert evs[0].attributes == {"port": "2222"}
    assert evs[1].detail == "connected to https://***:***@relay"


def test_after_a_seal_a_new_boot_begins(agent_env) -> None:
    s = _settings(agent_env)
    with open_agent(instance_id=agent_env.instance, settings=s) as agent:
        first = agent.event("a", "info")
        agent.seal()
        second = agent.event("a", "info")
    assert first.boot_id != second.boot_id and second.seq == 0


def test_event_cli_with_attributes(spool_env) -> None:
    r = spool_env.run(
        "event",
        "--stage",
        "register",
        "--state",
        "succeeded",
        "--detail",
        "id 42",
        "--attr",
        "manager=m1",
        "--attr",
        "slot=3",
        "--no-facts",
    )
    assert r.returncode == 0, r.stderr
    (ev,) = spool_env.of(Lifecycle)
    assert (ev.stage, ev.state, ev.detail, dict(ev.attributes)) == (
        "register",
        "succeeded",
        "id 42",
        {"manager": "m1", "slot": "3"},
    )
    bad = spool_env.run("event", "--stage", "x", "--state", "exploded")
    assert bad.returncode == 1 and b"not one of" in bad.stderr


def test_concurrent_agents_share_boot_and_gap_free_seq_then_seal(spool_env) -> None:
    procs = [
        subprocess.Popen(
            spool_env.argv("event", "--stage", f"s{i}", "--state", "info"),
            env=spool_env.env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for i in range(6)
    ]
    procs.append(
        subprocess.Popen(
            spool_env.argv("run", "--stage", "r", "--", "sh", "-c", "seq 1 2000"),
            env=spool_env.env(),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
    )
    assert [p.wait(120) for p in procs] == [0] * 7
    r = spool_env.run("seal")
    assert r.returncode == 0, r.stderr
    evs = spool_env.events()
    assert len({e.boot_id for e in evs}) == 1
    assert [e.seq for e in evs] == list(range(len(evs)))
    assert len([e for e in evs if isinstance(e, InstanceFacts)]) == 1  # once per boot, whoever sends it
    seal = evs[-1]
    assert isinstance(seal, Sealed) and seal.event_count == len(evs)


def test_supervisor_stage_seals_on_normal_end(spool_env) -> None:
    r = spool_env.run("run", "--stage", "supervisor", "--no-facts", "--", "true")
    assert r.returncode == 0
    evs = spool_env.events()
    assert isinstance(evs[-1], Sealed) and evs[-1].event_count == len(evs)


def _fake_smi(tmp_path: Path, body: str) -> dict[str, str]:
    # A GPU cannot run here: a stand-in nvidia-smi on PATH answers as the real one would.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    smi = bin_dir / "nvidia-smi"
    smi.write_text("#!/bin/sh\n" + body)
    smi.chmod(0o755)
    return {"PATH": f"{bin_dir}:/usr/bin:/bin"}


def test_facts_without_nvidia_smi_say_so(spool_env, tmp_path: Path) -> None:
    r = spool_env.run("facts", env=spool_env.env(PATH=str(tmp_path)))  # an empty PATH: no nvidia-smi
    assert r.returncode == 0, r.stderr
    (f,) = spool_env.of(InstanceFacts)
    assert "nvidia-smi not found" in f.gpu_probe_error
    assert f.host and f.cpu_count > 0 and f.ram_mib > 0 and f.gpu_count == 0


def test_facts_when_nvidia_smi_fails(spool_env, tmp_path: Path) -> None:
    env = spool_env.env(
        **_fake_smi(
            tmp_path,
            "echo 'NVIDIA-SMI has failed because it could not communicate with the NVIDIA driver.' >&2\nexit 9\n",
        )
    )
    assert spool_env.run("facts", env=env).returncode == 0
    (f,) = spool_env.of(InstanceFacts)
    assert "exited with code 9" in f.gpu_probe_error and "NVIDIA driver" in f.gpu_probe_error


def test_facts_from_nvidia_smi(spool_env, tmp_path: Path) -> None:
    body = (
        'case "$1" in --query-gpu*) echo "NVIDIA H100 80GB HBM3, 81559, 550.54.15, 9.0";'
        ' echo "NVIDIA H100 80GB HBM3, 81559, 550.54.15, 9.0";;\n'
        '*) echo "| NVIDIA-SMI 550.54.15    Driver Version: 550.54.15    CUDA Version: 12.4 |";; esac\n'
    )
    assert spool_env.run("facts", env=spool_env.env(**_fake_smi(tmp_path, body))).returncode == 0
    (f,) = spool_env.of(InstanceFacts)
    assert (
        f.gpu_model,
        f.gpu_count,
        f.gpu_memory_mib,
        f.driver_version,
        f.cuda_version,
        f.compute_capability,
        f.gpu_probe_error,
    ) == ("NVIDIA H100 80GB HBM3", 2, 81559, "550.54.15", "12.4", "9.0", None)
    again = spool_env.run("facts", env=spool_env.env(**_fake_smi(tmp_path, body)))
    assert b"already has" in again.stdout and len(spool_env.of(InstanceFacts)) == 1


def test_facts_override_file(spool_env, tmp_path: Path) -> None:
    path = tmp_path / "facts.json"
    path.write_text(
        json.dumps(
            {
                "gpu_model": "NVIDIA GeForce RTX 4090",
                "gpu_count": 1,
                "gpu_memory_mib": 24564,
                "price_per_hour": 0.35,
                "attributes": {"region": "eu"},
            }
        )
    )
    r = spool_env.run("run", "--stage", "tunnel", "--", "true", env=spool_env.env(FLIGHTREC_FACTS=str(path)))
    assert r.returncode == 0
    (f,) = spool_env.of(InstanceFacts)
    assert (f.gpu_model, f.gpu_memory_mib, f.price_per_hour, f.gpu_probe_error, dict(f.attributes)) == (
        "NVIDIA GeForce RTX 4090",
        24564,
        0.35,
        None,
        {"agent_version": __version__, "region": "eu"},  # which agent sent them, beside the file's own
    )
    path.write_text(json.dumps({"gpu_modle": "typo"}))
    bad = spool_env.run("facts", "--force", env=spool_env.env(FLIGHTREC_FACTS=str(path)))
    assert bad.returncode == 1 and b"unknown fields" in bad.stderr


def test_parse_nvidia_smi_output() -> None:
    mixed = "NVIDIA A100, 40960, 535.1, 8.0\nNVIDIA A10, 23028, 535.1, 8.6\n"
    assert parse_gpu_query(mixed) == {
        "gpu_model": "NVIDIA A100 + NVIDIA A10",
        "gpu_count": 2,
        "gpu_memory_mib": 23028,
        "driver_version": "535.1",
        "compute_capability": "8.0,8.6",
    }
    assert parse_cuda_version("CUDA Version: 12.2 ") == "12.2" and parse_cuda_version("nothing") == ""
    with pytest.raises(ValueError):
        parse_gpu_query("")


def test_bad_settings_value_is_a_config_error() -> None:
    from flightrec.settings import Settings

    with pytest.raises(ConfigError, match="FLIGHTREC_FLUSH_TIMEOUT"):
        Settings.from_env({"FLIGHTREC_FLUSH_TIMEOUT": "soon"})
    assert sys.version_info >= (3, 11)


def test_close_inside_the_with_block_then_leaving_it_is_fine(agent_env) -> None:
    s = _settings(agent_env)
    with open_agent(instance_id=agent_env.instance, settings=s) as agent:
        agent.event("s", "info", detail="one")
        assert agent.close(30)
        assert agent.close(30)  # a second close is a no-op that says how the first one went
    assert [e.detail for e in agent_env.of(Lifecycle)] == ["one"]
