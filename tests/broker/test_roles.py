"""Roles at a SASL_SSL broker: the agent's credential (agent.env) produces and nothing else, the operator's
(client.env) runs the materializer and the manager, the reader's reads; the agents' produce quota is in force."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import (
    ClusterAuthorizationFailedError,
    GroupAuthorizationFailedError,
    TopicAuthorizationFailedError,
    for_code,
)
from flightrec.broker.local import ACL_COMMAND, CONFIG_COMMAND, LocalBroker, free_port
from flightrec.broker.roles import ADMIN, AGENT, GRANTS, OPERATOR, READER, ROLES, quota_args
from flightrec.broker.secure import MECHANISM, Secure, read_env_file

from flightrec.errors import BrokerError
from flightrec.settings import TOPICS, Settings

pytestmark = pytest.mark.integration

FLIGHTREC = str(Path(sys.executable).parent / "flightrec")
DOCS = Path(__file__).resolve().parents[2] / "docs" / "security.md"
MATERIALIZER_GROUP = "flightrec-materializer"


def _role_env(broker: LocalBroker, env_file: str, tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLIGHTREC_")}
    env.update(read_env_file(broker.data / env_file))
    env.update(
        PYTHONSAFEPATH="1", FLIGHTREC_SPOOL=str(tmp_path / "spool"), FLIGHTREC_FACTS="", FLIGHTREC_FLUSH_TIMEOUT="30"
    )
    env.update(extra)
    return env


def _kwargs(broker: LocalBroker, env_file: str) -> dict[str, Any]:
    """aiokafka's connection arguments for the credential an env file names (what a host holding it can do)."""
    return Settings.from_env(read_env_file(broker.data / env_file)).kafka_kwargs()


def _run(*args: str, env: dict[str, str], timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run([FLIGHTREC, *args], env=env, capture_output=True, text=True, timeout=timeout)


def test_each_role_gets_its_own_user_and_env_file_and_no_env_file_names_the_super_user(sasl_kafka):
    users = {}
    for role in (OPERATOR, READER, AGENT):
        values = read_env_file(sasl_kafka.data / role.env_file)
        users[role.env_file] = values["FLIGHTREC_SASL_USERNAME"]
        password_file = Path(values["FLIGHTREC_SASL_PASSWORD_FILE"])
        assert oct(password_file.stat().st_mode & 0o777) == "0o600"
        assert password_file.read_text().strip() not in (sasl_kafka.data / role.env_file).read_text()
    assert users == {
        "client.env": "flightrec-operator",
        "reader.env": "flightrec-reader",
        "agent.env": "flightrec-agent",
    }
    admin_password = sasl_kafka.secure.password()
    for path in sasl_kafka.data.iterdir():
        if path.suffix == ".env":
            assert admin_password not in path.read_text() and "admin.password" not in path.read_text(), path
    secret = ("admin.properties", "admin.password", "server.properties", "tls/server-keystore.pem", "tls/ca.key")
    for path in (sasl_kafka.data / name for name in secret):
        assert oct(path.stat().st_mode & 0o777) == "0o600", path


def test_the_agent_credential_delivers_and_the_operator_credential_folds_it(sasl_kafka, tmp_path: Path):
    instance = f"roles-{uuid.uuid4().hex[:10]}"
    agent = _role_env(sasl_kafka, "agent.env", tmp_path, FLIGHTREC_INSTANCE=instance)
    r = _run("agent", "run", "--stage", "benchmark", "--", sys.executable, "-c", "print('proof 1 of 3')", env=agent)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "not yet acknowledged" not in r.stderr and "cannot deliver" not in r.stderr, r.stderr
    r = _run("agent", "seal", env=agent)
    assert r.returncode == 0, r.stderr[-3000:]
    flushed = _run("agent", "flush", env=agent)
    assert flushed.returncode == 0 and " 0 left" in flushed.stdout, flushed.stdout + flushed.stderr[-3000:]

    operator = _role_env(sasl_kafka, "client.env", tmp_path, FLIGHTREC_SPOOL=str(tmp_path / "manager-spool"))
    r = _run(
        "manager", "event", "--instance", instance, "--kind", "destroyed", "--detail", "by the roles test", env=operator
    )
    assert r.returncode == 0, r.stderr[-3000:]
    db = tmp_path / "fleet.duckdb"
    r = _run("materialize", "--db", str(db), "--until-idle", "2", "--no-serve", env=operator)
    assert r.returncode == 0, r.stderr[-3000:]
    q = (
        f"SELECT (SELECT count(*) FROM log_lines WHERE instance_id = '{instance}' AND text LIKE 'proof 1 of 3%'), "
        f"(SELECT count(*) FROM manager_events WHERE instance_id = '{instance}')"
    )
    r = _run("sql", "--db", str(db), "--csv", q, env=operator)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip().splitlines()[-1].replace(" ", "") == "1,1", r.stdout


async def _fetch_one(kwargs: dict[str, Any], **consumer: Any) -> None:
    c = AIOKafkaConsumer(**kwargs, enable_auto_commit=False, auto_offset_reset="earliest", **consumer)
    await c.start()
    try:
        if consumer.get("group_id") is None:
            c.assign([TopicPartition(TOPICS[0], 0)])
        else:
            c.subscribe(list(TOPICS))
        await asyncio.wait_for(c.getone(), 30)
    finally:
        await c.stop()


async def _admin(kwargs: dict[str, Any], what: str) -> type[Exception] | None:
    """What the broker answers an admin request ``what`` (the aiokafka error class of its first error; None: ok)."""
    admin = AIOKafkaAdminClient(**kwargs)
    await admin.start()
    try:
        if what == "create topic":
            codes = [
                e[1]
                for e in (
                    await admin.create_topics([NewTopic(f"flightrec.evil-{uuid.uuid4().hex[:6]}", 1, 1)])
                ).topic_errors
            ]
        elif what == "delete topic":
            codes = [e[1] for e in (await admin.delete_topics([TOPICS[1]])).topic_error_codes]
        elif what == "alter topic config":
            res = ConfigResource(ConfigResourceType.TOPIC, TOPICS[1], {"retention.ms": "1"})
            codes = [r[0] for resp in await admin.alter_configs([res]) for r in resp.resources]
        elif what == "alter broker config":
            res = ConfigResource(ConfigResourceType.BROKER, "1", {"log.retention.ms": "1"})
            codes = [r[0] for resp in await admin.alter_configs([res]) for r in resp.resources]
        elif what == "delete the materializer's group offsets":
            codes = []
            try:
                await admin.list_consumer_group_offsets(MATERIALIZER_GROUP)
            except Exception as exc:  # the error class is the answer
                return type(exc)
        else:
            raise AssertionError(what)
    finally:
        await admin.close()
    bad = [c for c in codes if c]
    return for_code(bad[0]) if bad else None


def test_a_host_holding_the_agent_credential_can_only_produce(sasl_kafka):
    agent = _kwargs(sasl_kafka, "agent.env")
    # reading any flightrec topic
    for topic in TOPICS:
        with pytest.raises(TopicAuthorizationFailedError):

            async def read(topic: str = topic) -> None:
                c = AIOKafkaConsumer(**agent, group_id=None, enable_auto_commit=False, auto_offset_reset="earliest")
                await c.start()
                try:
                    c.assign([TopicPartition(topic, 0)])
                    await asyncio.wait_for(c.getone(), 30)
                finally:
                    await c.stop()

            asyncio.run(read())
    # joining the materializer's consumer group (to take its partitions)
    with pytest.raises(GroupAuthorizationFailedError):
        asyncio.run(_fetch_one(agent, group_id=MATERIALIZER_GROUP))
    # creating, deleting a topic; altering a topic's or the broker's configuration; the group's offsets
    assert asyncio.run(_admin(agent, "create topic")) is TopicAuthorizationFailedError
    assert asyncio.run(_admin(agent, "delete topic")) is TopicAuthorizationFailedError
    assert asyncio.run(_admin(agent, "alter topic config")) is TopicAuthorizationFailedError
    assert asyncio.run(_admin(agent, "alter broker config")) is ClusterAuthorizationFailedError
    assert asyncio.run(_admin(agent, "delete the materializer's group offsets")) is GroupAuthorizationFailedError
    # ACLs and quotas, with Kafka's own tools (aiokafka has no ACL API): the cluster refuses both
    grant_itself = ["--add", "--allow-principal", f"User:{AGENT.user}", "--operation", "Read", "--topic", TOPICS[0]]
    acls = sasl_kafka.kafka_tool(ACL_COMMAND, *grant_itself, role=AGENT)
    quota = sasl_kafka.kafka_tool(CONFIG_COMMAND, *quota_args(10**9), role=AGENT)
    for cmd in (acls, quota, sasl_kafka.kafka_tool(ACL_COMMAND, "--list", role=AGENT)):
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        assert r.returncode != 0 and "ClusterAuthorizationException" in r.stdout + r.stderr, (
            cmd[-8:],
            r.stdout,
            r.stderr,
        )

    # and what it may do: produce, idempotently, as the agent does
    async def produce() -> None:
        p = AIOKafkaProducer(**agent, acks="all", enable_idempotence=True)
        await p.start()
        try:
            await p.send_and_wait(TOPICS[0], b"not avro: kept as a dead letter", key=b"roles-test")
        finally:
            await p.stop()

    asyncio.run(produce())


def test_a_reader_reads_and_cannot_write(sasl_kafka):
    reader = _kwargs(sasl_kafka, "reader.env")
    asyncio.run(_produce(_kwargs(sasl_kafka, "agent.env"), b"for the reader"))  # to partition 0, which it reads
    asyncio.run(_fetch_one(reader, group_id=None))

    async def produce() -> None:
        p = AIOKafkaProducer(**reader, acks="all")
        await p.start()
        try:
            await p.send_and_wait(TOPICS[0], b"x", key=b"roles-test")
        finally:
            await p.stop()

    with pytest.raises(TopicAuthorizationFailedError):
        asyncio.run(produce())
    with pytest.raises(GroupAuthorizationFailedError):
        asyncio.run(_fetch_one(reader, group_id=MATERIALIZER_GROUP))


def test_the_agents_quota_is_set_from_the_setting(sasl_kafka):
    r = subprocess.run(
        sasl_kafka.kafka_tool(
            CONFIG_COMMAND,
            "--describe",
            "--entity-type",
            "users",
            "--entity-name",
            AGENT.user,
            "--entity-type",
            "clients",
            "--entity-default",
        ),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    rate = Settings.from_env({}).agent_byte_rate
    assert f"producer_byte_rate={rate}" in r.stdout.replace(f"{rate}.0", str(rate)), r.stdout


def test_the_docs_show_the_same_acls_and_quota_for_a_managed_cluster():
    text = DOCS.read_text()
    for grant in GRANTS:
        assert " ".join(grant.acl_args()) in " ".join(text.replace("\\\n", " ").split()), grant
    assert " ".join(quota_args(Settings.from_env({}).agent_byte_rate)) in " ".join(text.replace("\\\n", " ").split())


async def _burst(kwargs: dict[str, Any], client_id: str, total: int) -> float:
    p = AIOKafkaProducer(**kwargs, client_id=client_id, acks="all", max_batch_size=200_000, linger_ms=0)
    await p.start()
    try:
        value = os.urandom(100_000)
        t = time.monotonic()
        for _ in range(total // len(value)):
            await p.send_and_wait(TOPICS[1], value, key=b"quota-test")
        return time.monotonic() - t
    finally:
        await p.stop()


def test_a_flooding_agent_is_slowed_to_its_quota_and_the_operator_is_not(tmp_path: Path):
    rate = 50_000
    settings = Settings.from_env({"FLIGHTREC_AGENT_BYTE_RATE": str(rate)})
    broker = LocalBroker(port=free_port(), data=tmp_path / "broker", settings=settings, security="sasl_ssl")
    try:
        broker.start(timeout=120)
        total = 900_000  # over the 50 kB/s Kafka averages over its 11 one-second windows (unthrottled: 0.2 s)
        agent = asyncio.run(_burst(_kwargs(broker, "agent.env"), "flightrec-agent:flooder", total))
        operator = asyncio.run(_burst(_kwargs(broker, "client.env"), "flightrec-materializer", total))
        print(f"{total} bytes: the agent's client id took {agent:.1f} s, the operator's {operator:.1f} s")
        assert agent >= 2.0 and operator < agent / 2, (agent, operator)
        # a second start finds the roles in place (its marker) and does not run Kafka's tools again
        broker.stop()
        marker = (broker.data / "roles.applied").stat().st_mtime_ns
        broker.start(timeout=120)
        assert (broker.data / "roles.applied").stat().st_mtime_ns == marker
    finally:
        broker.stop()


def test_nobody_administers_the_cluster_through_the_controller_port_without_the_super_users_password(
    sasl_kafka, tmp_path: Path
):
    # KRaft's controller listener takes admin requests too (--bootstrap-controller): were it PLAINTEXT with
    # User:ANONYMOUS a super user, any local process could grant itself everything there.
    cport = (sasl_kafka.data / "controller.port").read_text().strip()
    grant = ["--add", "--allow-principal", f"User:{AGENT.user}", "--operation", "All", "--topic", "*"]
    cmd = sasl_kafka.kafka_tool(ACL_COMMAND, *grant)
    at = cmd.index("--bootstrap-server")
    cmd[at : at + 2] = ["--bootstrap-controller", f"127.0.0.1:{cport}"]
    anonymous = tmp_path / "anonymous.properties"  # no credentials; give up after seconds, not forever
    anonymous.write_text("security.protocol=PLAINTEXT\nrequest.timeout.ms=3000\ndefault.api.timeout.ms=6000\n")
    cmd[cmd.index("--command-config") + 1] = str(anonymous)
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert r.returncode != 0, r.stdout + r.stderr
    listed = subprocess.run(
        sasl_kafka.kafka_tool(ACL_COMMAND, "--list", "--topic", "*"), capture_output=True, text=True
    )
    assert listed.returncode == 0 and "flightrec-agent" not in listed.stdout, listed.stdout


async def _produce(kwargs: dict[str, Any], value: bytes) -> None:
    p = AIOKafkaProducer(**kwargs, acks="all", enable_idempotence=True)
    await p.start()
    try:
        await p.send_and_wait(TOPICS[0], value, key=b"roles-test", partition=0)
    finally:
        await p.stop()


def test_a_broker_formatted_before_the_roles_gets_them_at_its_next_start(tmp_path: Path, monkeypatch):
    data = tmp_path / "broker"
    settings = Settings.from_env({})
    broker = LocalBroker(port=free_port(), data=data, settings=settings, security="sasl_ssl")
    # as the release before the roles: one SCRAM user (the super user, its password in client.password), no ACLs
    monkeypatch.setattr(
        Secure, "format_args", lambda self: [f"--add-scram={MECHANISM}=[name={ADMIN.user},password={self.password()}]"]
    )
    monkeypatch.setattr(Secure, "record_users", lambda self, roles=ROLES: None)
    monkeypatch.setattr(LocalBroker, "_apply_roles", lambda self, *a, **k: None)
    without_authorizer = Secure.server_properties
    monkeypatch.setattr(
        Secure,
        "server_properties",
        lambda self, port, cport: {
            k: v for k, v in without_authorizer(self, port, cport).items() if k != "authorizer.class.name"
        },
    )
    try:
        broker.start(timeout=120)
        os.replace(data / "admin.password", data / "client.password")
        monkeypatch.undo()
        broker = LocalBroker(port=broker.port, data=data, settings=settings)
        with pytest.raises(BrokerError, match="runs without an authorizer .* restart it"):
            broker.start(timeout=120)  # still running as the old release started it
        broker.stop()
        broker.start(timeout=120)
        assert (data / "users").read_text().split() == sorted(r.user for r in ROLES)
        asyncio.run(_produce(_kwargs(broker, "agent.env"), b"from an agent"))
        with pytest.raises(TopicAuthorizationFailedError):
            asyncio.run(_fetch_one(_kwargs(broker, "agent.env"), group_id=None))
        asyncio.run(_fetch_one(_kwargs(broker, "client.env"), group_id=None))
    finally:
        broker.stop()
