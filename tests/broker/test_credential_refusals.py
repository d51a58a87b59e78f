"""A credential the broker refuses ends every command at once in one line naming its role and what it may not do:
non-zero exit, no retry loop, no traceback, no empty database left behind (docs/security.md)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from flightrec.broker.local import LocalBroker
from flightrec.broker.secure import read_env_file

pytestmark = pytest.mark.integration

FLIGHTREC = str(Path(sys.executable).parent / "flightrec")
QUICK_S = 30.0  # a refusal is said at once: far below any retry loop (replay retried for 10 minutes)


def _env(broker: LocalBroker, env_file: str, tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLIGHTREC_")}
    env.update(read_env_file(broker.data / env_file))
    env.update(PYTHONSAFEPATH="1", FLIGHTREC_SPOOL=str(tmp_path / "spool"), FLIGHTREC_FACTS="")
    env.update(extra)
    return env


def _run(*args: str, env: dict[str, str]) -> tuple[subprocess.CompletedProcess, float]:
    t0 = time.monotonic()
    r = subprocess.run([FLIGHTREC, *args], env=env, capture_output=True, text=True, timeout=120)
    return r, time.monotonic() - t0


def _said_once(r: subprocess.CompletedProcess, command: str) -> str:
    """The one line the command ended with (no traceback)."""
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith(f"flightrec {command}")]
    assert len(lines) == 1, r.stderr[-3000:]
    return lines[0]


@pytest.fixture(scope="module")
def seeded(sasl_kafka: LocalBroker, tmp_path_factory: pytest.TempPathFactory) -> str:
    """An instance whose events are in the topics (written with the agent's credential)."""
    instance = f"refusals-{uuid.uuid4().hex[:8]}"
    env = _env(sasl_kafka, "agent.env", tmp_path_factory.mktemp("seed"), FLIGHTREC_INSTANCE=instance)
    r = subprocess.run(
        [FLIGHTREC, "agent", "run", "--stage", "s", "--", "echo", "hi"], env=env, capture_output=True, timeout=120
    )
    assert r.returncode == 0, r.stderr[-2000:]
    return instance


@pytest.mark.parametrize("command", ["replay", "materialize"])
def test_reading_with_the_agents_credential_ends_at_once_naming_the_agent_role(
    sasl_kafka, seeded, tmp_path: Path, command: str
) -> None:
    db = tmp_path / "fleet.duckdb"
    r, took = _run(
        command,
        "--db",
        str(db),
        "--no-serve" if command == "materialize" else "--instance=x",
        env=_env(sasl_kafka, "agent.env", tmp_path),
    )
    assert r.returncode != 0 and took < QUICK_S, (r.returncode, took, r.stderr[-2000:])
    line = _said_once(r, command)
    assert "'flightrec-agent'" in line and "agent role" in line and "may not read" in line, line
    assert "client.env" in line, line  # which credential would
    assert not db.exists(), "an empty database was left behind"


def test_timeline_from_the_topics_with_the_agents_credential_is_one_line(sasl_kafka, seeded, tmp_path: Path) -> None:
    r, took = _run(
        "timeline",
        seeded,
        "--db",
        str(tmp_path / "none.duckdb"),
        "--from-topics",
        env=_env(sasl_kafka, "agent.env", tmp_path),
    )
    assert r.returncode != 0 and took < QUICK_S, (r.returncode, took, r.stderr[-2000:])
    line = _said_once(r, "timeline")
    assert "agent role" in line and "may not read" in line, line


def test_flush_and_manager_event_with_the_readers_credential_end_at_once(sasl_kafka, tmp_path: Path) -> None:
    instance = f"refusals-{uuid.uuid4().hex[:8]}"
    reader = _env(sasl_kafka, "reader.env", tmp_path, FLIGHTREC_INSTANCE=instance, FLIGHTREC_FLUSH_TIMEOUT="0")
    r, _ = _run("agent", "run", "--stage", "s", "--", "echo", "hi", env=reader)
    assert r.returncode == 0, r.stderr[-2000:]  # the stage is never stopped for it
    r, took = _run("agent", "flush", env=reader)  # its default timeout is 30 s: a refusal is not waited out
    assert r.returncode == 1 and took < 20, (r.returncode, took, r.stderr[-2000:])
    line = _said_once(r, "agent flush")
    assert "'flightrec-reader'" in line and "reader role" in line and "may not write" in line, line
    assert "agent.env" in line, line
    manager = {**reader, "FLIGHTREC_FLUSH_TIMEOUT": "10"}  # waits for Kafka's answer: the refusal, said at once
    r, took = _run("manager", "event", "--instance", instance, "--kind", "note", env=manager)
    assert r.returncode == 1 and took < 20, (r.returncode, took, r.stderr[-2000:])
    line = _said_once(r, "manager")
    assert "reader role" in line and "may not write" in line and "stays spooled" in line, line


def test_a_wrong_password_names_the_role_and_ends_at_once(sasl_kafka, tmp_path: Path) -> None:
    wrong = tmp_path / "wrong.password"
    wrong.write_text("not-the-password\n")
    env = _env(sasl_kafka, "client.env", tmp_path, FLIGHTREC_SASL_PASSWORD_FILE=str(wrong))
    r, took = _run("materialize", "--db", str(tmp_path / "fleet.duckdb"), "--no-serve", env=env)
    assert r.returncode != 0 and took < QUICK_S, (r.returncode, took, r.stderr[-2000:])
    line = _said_once(r, "materialize")
    assert "refused the SASL credentials" in line and "operator role" in line, line
