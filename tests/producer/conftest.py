"""Helpers for the agent's tests: run `flightrec agent ...` as a real subprocess and read its events back
(from the session broker, ``agent_env``, or straight from the agent's spool with no broker, ``spool_env``)."""

from __future__ import annotations

import dataclasses
import os
import re
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from flightrec.producer.segment import iter_records, parse_header
from flightrec.producer.spool import instance_dir
from flightrec.schemas import TOPICS, Event, LogBatch, decode

FLIGHTREC = str(Path(sys.executable).parent / "flightrec")
PY = sys.executable


@dataclasses.dataclass
class AgentEnv:
    """One test's instance: a unique id, its own spool folder, and the broker to read from."""

    kafka: Any
    tmp: Path
    instance: str
    spool: Path

    def env(self, **extra: str) -> dict[str, str]:
        env = self.kafka.env(
            FLIGHTREC_SPOOL=str(self.spool),
            FLIGHTREC_INSTANCE=self.instance,
            FLIGHTREC_FLUSH_TIMEOUT="30",
            FLIGHTREC_FACTS="",
        )
        env.update(extra)
        return env

    def argv(self, action: str, *args: str) -> list[str]:
        return [FLIGHTREC, "agent", action, *args]

    def run(self, action: str, *args: str, env: dict[str, str] | None = None, **kw: Any) -> subprocess.CompletedProcess:
        kw.setdefault("capture_output", True)
        kw.setdefault("timeout", 120)
        return subprocess.run(self.argv(action, *args), env=env or self.env(), **kw)

    def events(self, instance: str | None = None) -> list[Event]:
        """Every event of this instance now in Kafka (since the test's mark), by boot and seq."""
        key = (instance or self.instance).encode()
        msgs = [m for m in self.kafka.consume(TOPICS) if m.key == key]
        evs = [decode(m.value) for m in msgs]
        return sorted(evs, key=lambda e: (e.boot_id, e.seq))

    def of(self, cls: type, instance: str | None = None) -> list[Any]:
        return [e for e in self.events(instance) if isinstance(e, cls)]

    def lines(
        self, source: str, instance: str | None = None, stage: str | None = None
    ) -> list[tuple[int, str, bool, bool]]:
        """(line_no, text, truncated, invalid_utf8) of one source, in seq order."""
        out: list[tuple[int, str, bool, bool]] = []
        for b in self.of(LogBatch, instance):
            if b.source == source and (stage is None or b.stage == stage):
                out.extend(zip(b.line_no, b.text, b.truncated, b.invalid_utf8, strict=True))
        return out

    def late_lines(self, source: str, stage: str | None = None) -> list[tuple[int, str, bool]]:
        """(line_no, text, late) of one source, in seq order."""
        out: list[tuple[int, str, bool]] = []
        for b in self.of(LogBatch):
            if b.source == source and (stage is None or b.stage == stage):
                out.extend(zip(b.line_no, b.text, getattr(b, "late", ()) or [False] * len(b.text), strict=True))
        return out

    def wait_for_line(self, source: str, text: str, timeout: float = 60.0) -> list[tuple[int, str, bool]]:
        """Poll Kafka until a line of ``source`` holds ``text`` (late lines arrive after the agent exited)."""
        deadline = time.monotonic() + timeout
        while True:
            got = self.late_lines(source)
            if any(text in t for _, t, _ in got) or time.monotonic() > deadline:
                return got
            time.sleep(0.5)


def spool_events(root: Path, instance: str) -> list[Event]:
    """Every event of one instance in a spool folder, decoded with the real codec, by boot and seq (a read of
    the segment files only: no lock taken, nothing changed)."""
    evs: list[Event] = []
    for seg in sorted(instance_dir(root, instance).glob("*.seg")):
        data = seg.read_bytes()
        _, start = parse_header(data, seg)
        evs.extend(decode(value) for _, _, _, _, value in iter_records(data, start))
    return sorted(evs, key=lambda e: (e.boot_id, e.seq))


# What an agent with no broker says on its own stderr about that (and only that): aiokafka's refused
# connection, the deliverer's "cannot deliver", the agent's "not yet acknowledged ... they stay in".
_AWAY_LOG = re.compile(
    rb"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} [A-Z]+ (aiokafka[\w.]*|flightrec\.producer\.deliver"
    rb"|flightrec\.producer\.agent(?=: \d+ events of .* "
    rb"(?:not yet acknowledged|Kafka at .* does not answer))): [^\n]*\n",
    re.M,
)


def without_away_log(stderr: bytes) -> bytes:
    """``stderr`` less the agent's own lines about the broker being away (see ``_AWAY_LOG``)."""
    return _AWAY_LOG.sub(b"", stderr)


@dataclasses.dataclass
class SpoolEnv(AgentEnv):
    """One test's instance with no broker: the agent spools every event and delivers nothing (its broker
    address has no listener, its flush timeout is 0), and the events are read back from the spool.

    For the agent's own behaviour (exit codes, signals, lines, limits) Kafka adds nothing; the delivery
    path keeps its own tests on ``agent_env``. ``run`` hands back stderr without the agent's lines about
    the broker being away (the wrapped command's stderr is byte for byte what it wrote)."""

    away: str = ""

    def env(self, **extra: str) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            FLIGHTREC_BOOTSTRAP=self.away,
            FLIGHTREC_SPOOL=str(self.spool),
            FLIGHTREC_INSTANCE=self.instance,
            FLIGHTREC_FLUSH_TIMEOUT="0",
            FLIGHTREC_FACTS="",
        )
        env.update(extra)
        return env

    def run(self, action: str, *args: str, env: dict[str, str] | None = None, **kw: Any) -> subprocess.CompletedProcess:
        r = super().run(action, *args, env=env, **kw)
        if isinstance(r.stderr, bytes):
            r.stderr = without_away_log(r.stderr)
        elif isinstance(r.stderr, str):
            r.stderr = without_away_log(r.stderr.encode()).decode()
        return r

    def events(self, instance: str | None = None) -> list[Event]:
        """Every event of this instance in the spool, by boot and seq."""
        return spool_events(self.spool, instance or self.instance)


@pytest.fixture
def spool_env(tmp_path: Path) -> Iterator[SpoolEnv]:
    """A fresh instance id and spool with no reachable broker (no Kafka started: not an integration test).

    The broker address is a port this fixture holds bound and never listens on: every connection is refused,
    and no broker started meanwhile (by this or a parallel test session) can take it."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as held:
        held.bind(("127.0.0.1", 0))
        yield SpoolEnv(
            None, tmp_path, f"test-{uuid.uuid4()}", tmp_path / "spool", away=f"127.0.0.1:{held.getsockname()[1]}"
        )


@pytest.fixture
def agent_env(kafka: Any, tmp_path: Path) -> AgentEnv:
    """A fresh instance id and spool on the session broker."""
    return AgentEnv(kafka, tmp_path, f"test-{uuid.uuid4()}", tmp_path / "spool")


@pytest.fixture
def fresh_agent_env(fresh_kafka: Any, tmp_path: Path) -> AgentEnv:
    """A fresh instance id and spool on a broker of the test's own (tests that stop it)."""
    return AgentEnv(fresh_kafka, tmp_path, f"test-{uuid.uuid4()}", tmp_path / "spool")
