"""Stock Kafka limits: an oversized event never wedges an instance; a refused record becomes a visible marker."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest
from flightrec.broker.topics import topic_config
from flightrec.schemas import Dropped, Lifecycle, LogBatch, ProcessExit, Sealed

from flightrec.cluster import LOG_APPEND_TIME, TIMESTAMP_TYPE, describe_topic_configs
from flightrec.settings import TOPIC_LOGS

PY = sys.executable
FLIGHTREC = str(Path(sys.executable).parent / "flightrec")
pytestmark = pytest.mark.integration

STOCK_TOPIC_CONFIG = topic_config()  # AlterConfigs replaces the whole configuration: send all of it


def _materialize(agent_env, db: Path) -> None:
    agent_env.kafka.seed_at_mark(db)
    r = subprocess.run(
        [FLIGHTREC, "materialize", "--db", str(db), "--until-idle", "2", "--no-serve"],
        env=agent_env.env(),
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert r.returncode == 0, r.stderr[-3000:]


def _sql(db: Path, query: str, *params: object) -> list[tuple]:
    con = duckdb.connect(str(db), read_only=True)
    try:
        return con.execute(query, list(params)).fetchall()
    finally:
        con.close()


def test_a_huge_exit_event_never_wedges_the_instance(agent_env, tmp_path: Path) -> None:
    # 100 lines of 4,096 "█" (3 bytes each) on stdout: tails cut by characters made a 1.23 MB exit event
    cmd = "import sys; print(('\\u2588' * 4096 + '\\n') * 100, end=''); sys.exit(3)"
    r = agent_env.run("run", "--stage", "big", "--", PY, "-c", cmd)
    assert r.returncode == 3
    assert b"not yet acknowledged" not in r.stderr, r.stderr.decode()[-2000:]
    r = agent_env.run("event", "--stage", "later", "--state", "info", "--detail", "after the big one")
    assert r.returncode == 0, r.stderr.decode()[-2000:]
    r = agent_env.run("seal", "--reason", "done")
    assert r.returncode == 0, r.stderr.decode()[-2000:]
    flushed = agent_env.run("flush")
    assert flushed.returncode == 0 and b" 0 left" in flushed.stdout, flushed.stdout + flushed.stderr

    exits = agent_env.of(ProcessExit)
    assert len(exits) == 1 and exits[0].exit_code == 3
    tail = exits[0].stdout_tail
    assert all(len(line.encode()) <= 4096 + 16 for line in tail), "tail lines are cut by bytes"
    assert any("[cut]" in line for line in tail), "the cut is visible"
    assert any(isinstance(e, Lifecycle) and e.stage == "later" for e in agent_env.events())
    assert agent_env.of(Sealed)

    db = tmp_path / "fleet.duckdb"
    _materialize(agent_env, db)
    assert _sql(db, "SELECT count(*) FROM failures WHERE instance_id = ? AND stage = 'big'", agent_env.instance) == [
        (1,)
    ]
    assert _sql(
        db, "SELECT count(*) FROM lifecycle_events WHERE instance_id = ? AND stage = 'later'", agent_env.instance
    ) == [(1,)]
    assert _sql(db, "SELECT complete, dropped_events FROM instances WHERE instance_id = ?", agent_env.instance) == [
        (True, 0)
    ]
    cut = _sql(
        db,
        "SELECT len(list_filter(stdout_tail, lambda l: l LIKE '%[cut]%')) FROM process_exits WHERE instance_id = ?",
        agent_env.instance,
    )
    assert cut[0][0] > 0


def test_huge_lines_on_every_source_stay_under_the_limit(agent_env, tmp_path: Path) -> None:
    # 100 lines of 4,096 emoji (4 bytes each) on stdout, stderr and four followed files: a 9.8 MB exit event before
    files = [tmp_path / f"f{i}.log" for i in range(4)]
    script = (
        "import sys\nline = '\\U0001F600' * 4096 + '\\n'\n"
        "sys.stdout.write(line * 100); sys.stdout.flush(); sys.stderr.write(line * 100)\n"
        f"for p in {[str(f) for f in files]!r}:\n    open(p, 'w').write(line * 100)\n"
        "sys.exit(1)\n"
    )
    tails = [a for f in files for a in ("--tail", str(f))]
    r = agent_env.run(
        "run", "--stage", "emoji", *tails, "--", PY, "-c", script, env=agent_env.env(FLIGHTREC_FOLLOW_GRACE="3")
    )
    assert r.returncode == 1
    assert b"not yet acknowledged" not in r.stderr, r.stderr.decode()[-2000:]
    r = agent_env.run("seal")
    assert r.returncode == 0
    events = agent_env.events()
    exits = [e for e in events if isinstance(e, ProcessExit)]
    assert len(exits) == 1 and exits[0].exit_code == 1
    lines = [(b.source, t) for b in events if isinstance(b, LogBatch) for t in b.text]
    for source in ["stdout", "stderr", *map(str, files)]:
        assert sum(1 for s, _ in lines if s == source) == 100, source
    assert not [e for e in events if isinstance(e, Dropped)]
    assert [e.seq for e in events] == list(range(len(events)))


async def _set_max_message_bytes(bootstrap: str, topic: str, value: int | None) -> None:
    from aiokafka.admin import AIOKafkaAdminClient
    from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

    configs = dict(STOCK_TOPIC_CONFIG)
    if value is not None:
        configs["max.message.bytes"] = str(value)
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.alter_configs([ConfigResource(ConfigResourceType.TOPIC, topic, configs=configs)])
    finally:
        await admin.close()


async def _timestamp_type(bootstrap: str, topic: str) -> str:
    from aiokafka.admin import AIOKafkaAdminClient

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        return (await describe_topic_configs(admin, [topic]))[topic][TIMESTAMP_TYPE]
    finally:
        await admin.close()


def test_a_record_refused_for_good_becomes_a_marker_and_later_events_flow(agent_env, tmp_path: Path) -> None:
    # the topic's limit drops below the batch size while the stage runs (as when an operator changes it)
    shrink = (
        "import asyncio, os, time\n"
        "from aiokafka.admin import AIOKafkaAdminClient\n"
        "from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType\n"
        "async def go():\n"
        "    admin = AIOKafkaAdminClient(bootstrap_servers=os.environ['FLIGHTREC_BOOTSTRAP'])\n"
        "    await admin.start()\n"
        f"    cfg = {{**{STOCK_TOPIC_CONFIG!r}, 'max.message.bytes': '2048'}}\n"
        f"    await admin.alter_configs([ConfigResource(ConfigResourceType.TOPIC, {TOPIC_LOGS!r}, configs=cfg)])\n"
        "    await admin.close()\n"
        "asyncio.run(go())\n"
        "time.sleep(1)\n"
        "print('x' * 6000)\n"
    )
    env = agent_env.env()
    try:
        r = agent_env.run("run", "--stage", "shrunk", "--", PY, "-c", shrink, env=env)
        assert r.returncode == 0, r.stderr.decode()[-3000:]
    finally:
        asyncio.run(_set_max_message_bytes(agent_env.kafka.bootstrap, TOPIC_LOGS, None))
    # Kafka's AlterConfigs replaces a topic's whole configuration: what the test put back must be what flightrec
    # created, or the session broker's later tests read a CreateTime topic (retention then judges by the events'
    # own 2025 clocks and expires their lines)
    assert asyncio.run(_timestamp_type(agent_env.kafka.bootstrap, TOPIC_LOGS)) == LOG_APPEND_TIME
    assert b"dropped" in r.stderr, r.stderr.decode()[-3000:]  # the agent's last line says what was lost
    assert agent_env.run("event", "--stage", "later", "--state", "info").returncode == 0
    assert agent_env.run("seal").returncode == 0
    events = agent_env.events()
    markers = [e for e in events if isinstance(e, Dropped)]
    assert len(markers) == 1
    m = markers[0]
    assert m.original_type == "flightrec.v1.LogBatch" and m.original_bytes > 6000
    assert "MessageSizeTooLarge" in m.reason or "too large" in m.reason
    assert [e.seq for e in events] == list(range(len(events))), "the marker keeps the seq: no gap"
    assert any(isinstance(e, Lifecycle) and e.stage == "later" for e in events)
    raw = [m for m in agent_env.kafka.consume() if m.key == agent_env.instance.encode()]
    assert len(raw) == len(events) == len({e.event_id for e in events}), (
        "a retry never re-sends what Kafka acknowledged"
    )

    db = tmp_path / "fleet.duckdb"
    _materialize(agent_env, db)
    assert _sql(db, "SELECT complete, dropped_events FROM instances WHERE instance_id = ?", agent_env.instance) == [
        (True, 1)
    ]
    w = subprocess.run(
        [FLIGHTREC, "wait-sealed", agent_env.instance, "--db", str(db), "--timeout", "5"],
        env=agent_env.env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert w.returncode == 0, w.stderr
    assert "1 event dropped" in w.stdout and f"seq {m.seq}" in w.stdout and "LogBatch" in w.stdout, w.stdout
    for source in (["--db", str(db)], ["--from-topics", "--db", str(tmp_path / "none.duckdb")]):
        t = subprocess.run(
            [FLIGHTREC, "timeline", agent_env.instance, *source],
            env=agent_env.env(),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert t.returncode == 0 and "DROPPED LogBatch of" in t.stdout, t.stdout + t.stderr
