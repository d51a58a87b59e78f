"""A host copying its own tagged events, verbatim, into other partitions of their topics (its write credential and
its instance key allow it): the copies are refused in a file and in a 2-member lake group alike, so the lake equals
the file and nothing of the instance is counted twice (lines, events seen, failures, the fleet view)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from flightrec.db.trust import TrustConfig
from flightrec.schemas.auth import new_fleet_key, parse_fleet_key
from lake_helpers import assert_lake_equals_file, lake_con, seed_lake_at_mark
from materializer_helpers import flightrec, materialize

pytestmark = pytest.mark.integration
PARTITIONS = 6


def _enroll(instance: str, env: dict[str, str]) -> dict[str, str]:
    out = flightrec("manager", "enroll", "--instance", instance, env=env).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def _copy_into_other_partitions(bootstrap: str, records: list) -> int:
    """What the host can do with what it sent: the same key, value and headers, into two other partitions each."""

    async def go() -> int:
        from aiokafka import AIOKafkaProducer

        p = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
        await p.start()
        n = 0
        try:
            for r in records:
                for shift in (1, 2):
                    part = (r.partition + shift) % PARTITIONS
                    await p.send_and_wait(r.topic, r.value, key=r.key, partition=part, headers=list(r.headers))
                    n += 1
        finally:
            await p.stop()
        return n

    return asyncio.run(go())


def _member(db: str, data_path: str, group: str, env: dict[str, str], log: Path) -> subprocess.Popen:
    exe = Path(sys.executable).with_name("flightrec")
    return subprocess.Popen(
        [str(exe), "materialize", "--db", db, "--data-path", data_path, "--group", group, "--until-idle", "6"],
        env={**env, "PYTHONSAFEPATH": "1", "FLIGHTREC_LOG_LEVEL": "WARNING"},
        stdout=subprocess.DEVNULL,
        stderr=log.open("ab"),
    )


def test_copies_into_other_partitions_are_refused_and_the_lake_equals_the_file(kafka, lake, tmp_path) -> None:
    db, data_path = lake
    fleet_hex = new_fleet_key()
    operator = kafka.env(FLIGHTREC_FLEET_KEY=fleet_hex, FLIGHTREC_SPOOL=str(tmp_path / "manager-spool"))
    instances = [f"copy-{uuid.uuid4().hex[:6]}-{k}" for k in range(2)]
    for k, inst in enumerate(instances):
        env = kafka.env(FLIGHTREC_SPOOL=str(tmp_path / f"spool-{k}"), FLIGHTREC_FACTS="", **_enroll(inst, operator))
        env.pop("FLIGHTREC_FLEET_KEY", None)
        script = "echo one; echo two; echo three; exit 1" if k == 0 else "echo fine"
        flightrec("agent", "run", "--stage", "benchmark", "--", "sh", "-c", script, env=env, check=False)
        assert flightrec("agent", "flush", "--timeout", "60", env=env).returncode == 0
    mine = [r for r in kafka.consume() if r.key in {i.encode() for i in instances}]
    assert mine and all(any(h[0] == "flightrec-tag" for h in r.headers) for r in mine)
    copies = _copy_into_other_partitions(kafka.bootstrap, mine)

    group = f"copies-{uuid.uuid4().hex[:8]}"
    seed_lake_at_mark(kafka, db, data_path, group)
    logs = [tmp_path / "a.log", tmp_path / "b.log"]
    members = [_member(db, data_path, group, {**kafka.env(), "FLIGHTREC_FLEET_KEY": fleet_hex}, g) for g in logs]
    try:
        codes = [m.wait(240) for m in members]
    finally:
        for m in members:
            if m.poll() is None:
                m.kill()
                m.wait(30)
    assert codes == [0, 0], "\n".join(g.read_text()[-3000:] for g in logs)
    file = tmp_path / "file.duckdb"
    materialize(kafka, file, trust=TrustConfig(parse_fleet_key(fleet_hex)))
    assert_lake_equals_file(db, file)

    con = lake_con(db)
    try:
        ids = sorted(instances)

        def one(sql: str) -> object:
            return con.execute(sql, [ids]).fetchone()[0]

        assert one("SELECT count(*) FROM log_lines WHERE list_contains(?, instance_id)") == 4  # one, two, three, fine
        assert one("SELECT count(*) FROM events_seen WHERE list_contains(?, instance_id)") == len(mine)
        assert one("SELECT count(*) FROM failures WHERE list_contains(?, instance_id)") == 1
        assert one("SELECT count(*) FROM instances WHERE list_contains(?, instance_id)") == 2
        assert one("SELECT count(*) FROM fleet WHERE list_contains(?, instance_id)") == 2
        dead = con.execute(
            "SELECT count(*), count(*) FILTER (WHERE reason LIKE 'forged:%partition%') FROM dead_letters "
            "WHERE list_contains(?, instance_id)",
            [ids],
        ).fetchone()
        assert dead == (copies, copies)
    finally:
        con.close()
