"""The malicious host, end to end: real agents with enrolled keys, a host forging in other instances' names with
its own key, a revoked key after `destroyed`, a real materializer with the fleet key, the webhook, and the secrets
nowhere in the spool, the topics, the database or the logs."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest
from flightrec.db.query import run_query
from flightrec.db.trust import TrustConfig
from flightrec.db.views import prelude_for
from flightrec.schemas import Lifecycle, ManagerEvent, Sealed, encode, new_event_id, now_us
from flightrec.schemas.auth import Signer, new_fleet_key, parse_fleet_key
from materializer_helpers import flightrec, materialize
from test_alerts import Hook

pytestmark = pytest.mark.integration


def _enroll(instance: str, env: dict[str, str]) -> dict[str, str]:
    out = flightrec("manager", "enroll", "--instance", instance, env=env).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def _send_as_host(bootstrap: str, signer: Signer | None, events: list) -> None:
    """What a host holding an instance's key can do: sign anything it likes with it and send it."""

    async def go() -> None:
        from aiokafka import AIOKafkaProducer

        p = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=True)
        await p.start()
        try:
            for ev in events:
                key, value = ev.instance_id.encode(), encode(ev)
                part = partition_of(key, len(await p.partitions_for(ev.topic)))
                headers = [signer.header(ev.topic, part, key, value)] if signer else None
                await p.send_and_wait(ev.topic, value, key=key, partition=part, headers=headers)
        finally:
            await p.stop()

    asyncio.run(go())


def partition_of(key: bytes, partitions: int) -> int:
    """The partition the agent's client picks for ``key`` (the one its tag names)."""
    from aiokafka.partitioner import DefaultPartitioner

    return DefaultPartitioner()(key, list(range(partitions)), list(range(partitions)))


def _bytes_under(root: Path) -> bytes:
    return b"".join(p.read_bytes() for p in root.rglob("*") if p.is_file())


def test_a_host_with_one_instance_s_key_forges_nothing_and_leaks_no_secret(kafka, tmp_path: Path) -> None:
    fleet_hex = new_fleet_key()
    operator = kafka.env(FLIGHTREC_FLEET_KEY=fleet_hex, FLIGHTREC_SPOOL=str(tmp_path / "manager-spool"))
    victim_env = _enroll("victim-7", operator)
    evil_env = _enroll("evil-3", operator)
    logs: list[str] = []

    def agent(instance_env: dict[str, str], *args: str, check: bool = True):
        env = kafka.env(FLIGHTREC_SPOOL=str(tmp_path / f"spool-{instance_env['FLIGHTREC_INSTANCE']}"), **instance_env)
        env.pop("FLIGHTREC_FLEET_KEY", None)  # an instance never holds it
        proc = flightrec("agent", *args, env={**env, "FLIGHTREC_FACTS": ""}, check=check)
        logs.extend([proc.stdout, proc.stderr])
        return proc

    # the victim: a healthy benchmark; the evil host: a real stage of its own, then forgeries
    assert agent(victim_env, "run", "--stage", "benchmark", "--", "sh", "-c", "echo proof 1 done").returncode == 0
    assert agent(evil_env, "run", "--stage", "benchmark", "--", "sh", "-c", "echo warming up").returncode == 0
    # both delivered before the destroy: on a loaded machine an agent may exit with events in its spool, which the
    # next agent command (the evil host's, after the destroy) would deliver late: refused then, by design
    for env in (victim_env, evil_env):
        assert agent(env, "flush", "--timeout", "60").returncode == 0
    evil = Signer.from_token(evil_env["FLIGHTREC_INSTANCE_KEY"])
    t = now_us()
    env_of = dict(instance_id="victim-7", boot_id="forged-boot", ts_us=t)
    _send_as_host(
        kafka.bootstrap,
        evil,
        [
            Lifecycle(event_id=new_event_id(), seq=0, stage="benchmark", state="failed", detail="CUDA error", **env_of),
            Sealed(event_id=new_event_id(), seq=1, event_count=2, **env_of),
            ManagerEvent(event_id=new_event_id(), seq=0, source_id="manager@evil", kind="destroyed", **env_of),
        ],
    )
    _send_as_host(
        kafka.bootstrap, None, [Lifecycle(event_id=new_event_id(), seq=2, stage="x", state="failed", **env_of)]
    )
    # the manager destroys the evil instance; what its key writes afterwards is refused
    logs.append(flightrec("manager", "event", "--instance", "evil-3", "--kind", "destroyed", env=operator).stderr)
    agent(evil_env, "event", "--stage", "benchmark", "--state", "failed", "--detail", "after the destroy")

    hook = Hook()
    db = tmp_path / "fleet.duckdb"
    try:
        stats = materialize(
            kafka, db, idle=2.0, webhook=hook.url, trust=TrustConfig(parse_fleet_key(fleet_hex), "refuse")
        )
        import time

        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not any(a["flightrec"]["kind"] == "refused" for a in hook.delivered):
            time.sleep(0.2)
    finally:
        hook.close()
    assert stats.dead_letters >= 5, stats  # another test's late events, read from the mark, may be refused too

    def sql(query: str) -> list[tuple]:
        table = run_query(str(db), query, prelude=prelude_for(query))
        return [tuple(r.values()) for r in table.to_pylist()]

    assert sql("SELECT status FROM fleet WHERE instance_id = 'victim-7'")[0][0] not in ("failed", "destroyed", "lost")
    assert sql("SELECT count(*) FROM lifecycle_events WHERE boot_id = 'forged-boot'") == [(0,)]
    assert sql("SELECT count(*) FROM manager_events WHERE instance_id = 'victim-7'") == [(0,)]
    rows = sql(
        "SELECT instance_id, reason FROM dead_letters WHERE instance_id IN ('victim-7', 'evil-3') ORDER BY reason"
    )
    every = sql('SELECT topic, "partition", "offset", instance_id, reason, event_id, md5(value) FROM dead_letters')
    # the victim: exactly its 4 forged or untagged events; the evil host: what its key wrote after the destroy, each
    # kept unverified, not trusted (on a loaded machine the evil agent's late-output process can deliver an event of
    # its run after the destroy too: kept unverified then, by design, one dead letter more)
    victim = [r for r in rows if r[0] == "victim-7"]
    revoked = [r for r in rows if r[0] == "evil-3"]
    assert len(victim) == 4 and revoked, every
    assert all(r[1].startswith("unverified: delivered after instance 'evil-3' was destroyed") for r in revoked), every
    reasons = " | ".join(r[1] for r in rows)
    assert "instance 'evil-3''s key wrote an event claiming instance 'victim-7'" in reasons
    assert "instance 'evil-3''s key wrote a manager event about 'victim-7'" in reasons
    assert "unverified: delivered after instance 'evil-3' was destroyed" in reasons
    assert sql("SELECT authenticated, refused_events FROM instance_trust WHERE instance_id = 'victim-7'") == [(True, 4)]

    refused = [a["flightrec"] for a in hook.delivered if a["flightrec"]["kind"] == "refused"]
    # one alert for all refused events of the window, with their count (never one per claimed id: any host can
    # claim made-up ids by the hundred); evil-3's late event is kept unverified, not counted as refused
    assert len(refused) == 1 and refused[0]["refused_events"] >= 4 and "victim-7" in refused[0]["examples"], refused

    # the secrets: nowhere but where they were put
    secrets = [parse_fleet_key(fleet_hex), evil.secret, Signer.from_token(victim_env["FLIGHTREC_INSTANCE_KEY"]).secret]
    seen = _bytes_under(tmp_path / "spool-evil-3") + _bytes_under(tmp_path / "spool-victim-7")
    seen += _bytes_under(tmp_path / "manager-spool") + db.read_bytes() + "".join(logs).encode()
    for rec in kafka.consume():
        seen += (rec.value or b"") + b"".join(v for _, v in rec.headers or ())
    assert len(seen) > 10_000
    for s in secrets:
        assert s not in seen and s.hex().encode() not in seen and s.hex().upper().encode() not in seen
    assert os.environ.get("FLIGHTREC_FLEET_KEY") is None


def test_the_malicious_host_against_a_sasl_ssl_broker_with_the_authorizer_on(sasl_kafka, tmp_path: Path) -> None:
    """The same host at a SASL_SSL broker with Kafka's authorizer: it holds `agent.env` (the agents' write-only
    login) and one enrolled instance's key. What it forges in other names reaches no table; what it writes after
    its `destroyed` is refused; the operator's login (client.env) with the fleet key folds the rest.
    (tests/broker/test_roles.py: the same login cannot read, join the materializer's group or administer.)"""
    import subprocess
    import sys
    import uuid

    from flightrec.broker.secure import read_env_file

    from flightrec.settings import Settings

    exe = str(Path(sys.executable).parent / "flightrec")
    base = {k: v for k, v in os.environ.items() if not k.startswith("FLIGHTREC_")}
    base.update(PYTHONSAFEPATH="1", FLIGHTREC_FACTS="", FLIGHTREC_FLUSH_TIMEOUT="30")
    fleet_hex = new_fleet_key()
    operator = {
        **base,
        **read_env_file(sasl_kafka.data / "client.env"),
        "FLIGHTREC_FLEET_KEY": fleet_hex,
        "FLIGHTREC_SPOOL": str(tmp_path / "manager-spool"),
    }
    host_login = read_env_file(sasl_kafka.data / "agent.env")

    def run(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
        r = subprocess.run([exe, *args], env=env, capture_output=True, text=True, timeout=180)
        assert r.returncode == 0, (args, r.stderr[-3000:])
        return r

    tag = uuid.uuid4().hex[:8]
    victim, evil = f"victim-{tag}", f"evil-{tag}"
    keys = {i: _enroll(i, operator) for i in (victim, evil)}

    def instance_env(instance: str) -> dict[str, str]:
        return {**base, **host_login, **keys[instance], "FLIGHTREC_SPOOL": str(tmp_path / f"spool-{instance}")}

    run("agent", "run", "--stage", "benchmark", "--", "sh", "-c", "echo proof 1 done", env=instance_env(victim))
    run("agent", "run", "--stage", "benchmark", "--", "sh", "-c", "echo warming up", env=instance_env(evil))
    for instance in (victim, evil):  # delivered before the destroy (see the test above)
        run("agent", "flush", "--timeout", "60", env=instance_env(instance))
    signer = Signer.from_token(keys[evil]["FLIGHTREC_INSTANCE_KEY"])
    env_of = dict(instance_id=victim, boot_id=f"forged-{tag}", ts_us=now_us())
    forged = [
        Lifecycle(event_id=new_event_id(), seq=0, stage="benchmark", state="failed", detail="CUDA error", **env_of),
        Sealed(event_id=new_event_id(), seq=1, event_count=2, **env_of),
        ManagerEvent(event_id=new_event_id(), seq=0, source_id="manager@evil", kind="destroyed", **env_of),
    ]
    kwargs = Settings.from_env(host_login).kafka_kwargs()

    async def send_as_host() -> None:
        from aiokafka import AIOKafkaProducer

        p = AIOKafkaProducer(**kwargs, acks="all", enable_idempotence=True)
        await p.start()
        try:
            for ev in forged:
                key, value = ev.instance_id.encode(), encode(ev)
                part = partition_of(key, len(await p.partitions_for(ev.topic)))
                headers = [signer.header(ev.topic, part, key, value)]
                await p.send_and_wait(ev.topic, value, key=key, partition=part, headers=headers)
        finally:
            await p.stop()

    asyncio.run(send_as_host())
    run("manager", "event", "--instance", evil, "--kind", "destroyed", env=operator)
    late = ("agent", "event", "--stage", "benchmark", "--state", "failed", "--detail", "after the destroy")
    run(*late, env=instance_env(evil))

    db = tmp_path / "fleet.duckdb"
    run("materialize", "--db", str(db), "--until-idle", "3", "--no-serve", env=operator)

    def sql(query: str) -> list[str]:
        return run("sql", "--db", str(db), "--csv", query, env=operator).stdout.strip().splitlines()[1:]

    assert sql(f"SELECT count(*) FROM log_lines WHERE instance_id = '{victim}' AND text LIKE 'proof 1 done%'") == ["1"]
    assert sql(f"SELECT status IN ('failed', 'destroyed', 'lost') FROM fleet WHERE instance_id = '{victim}'") == [
        "False"
    ]
    assert sql(f"SELECT count(*) FROM lifecycle_events WHERE boot_id = 'forged-{tag}'") == ["0"]
    assert sql(f"SELECT count(*) FROM manager_events WHERE instance_id = '{victim}'") == ["0"]
    dead = "SELECT count(*) FROM dead_letters WHERE "
    assert sql(dead + f"instance_id = '{victim}' AND reason LIKE 'forged:%'") == ["3"]
    assert sql(dead + f"instance_id = '{evil}' AND reason LIKE 'unverified:%'") == ["1"]  # kept, not trusted
    assert sql(dead + f"instance_id IN ('{victim}', '{evil}')") == ["4"]


def test_a_destroyed_instances_spooled_evidence_is_kept_unverified_and_shown(kafka, tmp_path: Path) -> None:
    """The README's h100-01 with a fleet key: its network cut, its stage fails into the spool, the manager destroys
    it, `agent flush` delivers later. Before: every event refused as `revoked`, the evidence gone. Now: kept, shown
    in the timeline flagged unverified, no failure row, the status `destroyed`."""
    import socket
    import uuid

    fleet_hex = new_fleet_key()
    operator = kafka.env(FLIGHTREC_FLEET_KEY=fleet_hex, FLIGHTREC_SPOOL=str(tmp_path / "manager-spool"))
    instance = f"h100-{uuid.uuid4().hex[:6]}"
    keys = _enroll(instance, operator)
    env = kafka.env(FLIGHTREC_SPOOL=str(tmp_path / "spool"), FLIGHTREC_FACTS="", **keys)
    env.pop("FLIGHTREC_FLEET_KEY", None)
    flightrec("agent", "run", "--stage", "tunnel", "--", "sh", "-c", "echo tunnel up", env=env)
    assert flightrec("agent", "flush", "--timeout", "60", env=env).returncode == 0  # delivered before the cut
    with socket.socket() as held:  # the network cut: a port that refuses every connection
        held.bind(("127.0.0.1", 0))
        cut = {**env, "FLIGHTREC_BOOTSTRAP": f"127.0.0.1:{held.getsockname()[1]}", "FLIGHTREC_FLUSH_TIMEOUT": "0"}
        script = "echo proving; echo 'CUDA error: an illegal memory access was encountered' >&2; exit 1"
        run = flightrec("agent", "run", "--stage", "supervisor", "--", "sh", "-c", script, env=cut, check=False)
        assert run.returncode == 1, run.stderr
    flightrec("manager", "event", "--instance", instance, "--kind", "destroyed", env=operator)
    assert flightrec("agent", "flush", "--timeout", "60", env=env).returncode == 0

    db = tmp_path / "fleet.duckdb"
    materialize(kafka, db, idle=2.0, trust=TrustConfig(parse_fleet_key(fleet_hex)))

    def sql(query: str) -> list[tuple]:
        table = run_query(str(db), query, prelude=prelude_for(query))
        return [tuple(r.values()) for r in table.to_pylist()]

    assert sql(f"SELECT status FROM fleet WHERE instance_id = '{instance}'") == [("destroyed",)]
    assert sql(f"SELECT text FROM log_lines WHERE instance_id = '{instance}'") == [("tunnel up",)]
    assert sql(f"SELECT count(*) FROM failures WHERE instance_id = '{instance}'") == [(0,)]
    kept = sql(f"SELECT count(*) FROM dead_letters WHERE instance_id = '{instance}' AND reason LIKE 'unverified:%'")
    assert kept[0][0] >= 4, kept  # started, its lines, its exit, failed (and the facts, the seal)
    assert sql(
        f"SELECT unverified_events > 0, refused_events FROM instance_trust WHERE instance_id = '{instance}'"
    ) == [(True, 0)]
    shown = flightrec("timeline", instance, "--db", str(db), env=operator).stdout
    flagged = [line for line in shown.splitlines() if "UNVERIFIED (delivered after the destroy)" in line]
    assert any("CUDA error: an illegal memory access" in line for line in flagged), shown
    assert any("exit code 1" in line for line in flagged), shown
    assert not [line for line in flagged if line.startswith("!!")], "no unverified event is shown as a failure"
