"""`flightrec manager forget`: an instance made by mistake leaves the fleet (and its alerts) by a manager event, so a
replay forgets it too; heard from again, it comes back. The manager's spool folder of an instance it destroyed or
forgot is removed once delivered (it kept a 256 KiB reserve per instance for ever)."""

from __future__ import annotations

import socket
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from flightrec.db.query import run_query
from flightrec.db.views import VIEWS
from flightrec.producer.names import instance_dir
from flightrec.schemas import Lifecycle
from materializer_helpers import Boot, materialize, publish

pytestmark = pytest.mark.integration
EXE = str(Path(sys.executable).with_name("flightrec"))


def _run(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([EXE, *args], env=env, capture_output=True, text=True, timeout=120)


def _in_fleet(db: Path, instance: str) -> bool:
    rows = run_query(db, "SELECT count(*) AS n FROM fleet WHERE instance_id = ?", [instance], prelude=VIEWS)
    return bool(rows.to_pylist()[0]["n"])


def _status(db: Path, instance: str) -> str:
    rows = run_query(db, "SELECT status FROM instance_status WHERE instance_id = ?", [instance], prelude=VIEWS)
    return rows.to_pylist()[0]["status"]


def test_a_forgotten_instance_leaves_the_fleet_replay_agrees_and_it_comes_back_when_heard(
    kafka, tmp_path: Path, db: Path, env_for
) -> None:
    env = env_for(FLIGHTREC_SPOOL=str(tmp_path / "spool"))
    b = Boot()
    b.add(Lifecycle, stage="tunnel", state="started")  # made by mistake: never heard from again
    kafka.seed_at_mark(db)
    publish(kafka.bootstrap, b.events)
    materialize(kafka, db)
    assert _in_fleet(db, b.instance)
    r = _run("manager", "forget", "--instance", b.instance, "--detail", "rented by a typo", env=env)
    assert r.returncode == 0, r.stderr
    materialize(kafka, db)
    assert not _in_fleet(db, b.instance) and _status(db, b.instance) == "forgotten"
    gate = _run("wait-sealed", b.instance, "--db", str(db), "--timeout", "60", env=env)
    assert gate.returncode == 3 and "forgotten" in gate.stderr, gate.stderr  # at once: nothing more will come
    # replay-safe: a database rebuilt from the topics forgets it too
    replayed = tmp_path / "replayed.duckdb"
    r = _run("replay", "--db", str(replayed), "--instance", b.instance, env=env)
    assert r.returncode == 0, r.stderr
    assert not _in_fleet(replayed, b.instance) and _status(replayed, b.instance) == "forgotten"
    # heard from after the forget: it was a real instance after all
    again = Boot(instance=b.instance)
    again.add(Lifecycle, stage="tunnel", state="started")
    publish(kafka.bootstrap, again.events)
    materialize(kafka, db)
    assert _in_fleet(db, b.instance)


def test_the_managers_folder_of_a_destroyed_instance_goes_once_delivered(kafka, tmp_path: Path, env_for) -> None:
    spool = tmp_path / "spool"
    env = env_for(FLIGHTREC_SPOOL=str(spool), FLIGHTREC_FLUSH_TIMEOUT="10")
    source_root = spool / "manager" / "manager@test"
    kept, gone = f"kept-{uuid.uuid4().hex[:8]}", f"gone-{uuid.uuid4().hex[:8]}"
    for instance in (kept, gone):
        r = _run("manager", "event", "--instance", instance, "--kind", "rented", "--source", "manager@test", env=env)
        assert r.returncode == 0, r.stderr
    r = _run("manager", "event", "--instance", gone, "--kind", "destroyed", "--source", "manager@test", env=env)
    assert r.returncode == 0, r.stderr
    assert instance_dir(source_root, kept).is_dir()  # still rented: its folder stays
    assert not instance_dir(source_root, gone).exists()
    # destroyed while Kafka was away: kept until delivered, then `agent flush --all` removes it
    late = f"late-{uuid.uuid4().hex[:8]}"
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        away = {**env, "FLIGHTREC_BOOTSTRAP": f"127.0.0.1:{held.getsockname()[1]}", "FLIGHTREC_FLUSH_TIMEOUT": "0"}
        r = _run("manager", "event", "--instance", late, "--kind", "destroyed", "--source", "manager@test", env=away)
    assert r.returncode == 0 and instance_dir(source_root, late).is_dir(), r.stderr
    r = _run("agent", "flush", "--all", "--spool", str(source_root), env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert not instance_dir(source_root, late).exists(), list(source_root.iterdir())
    assert instance_dir(source_root, kept).is_dir()
