"""Helpers for the agent's tests: run `flightrec agent ...` as a real subprocess and read its events back."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

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
        env = self.kafka.env(FLIGHTREC_SPOOL=str(self.spool), FLIGHTREC_INSTANCE=self.instance,
                             FLIGHTREC_FLUSH_TIMEOUT="30", FLIGHTREC_FACTS="")
        env.update(extra)
        return env

    def argv(self, action: str, *args: str) -> list[str]:
        return [FLIGHTREC, "agent", action, *args]

    def run(self, action: str, *args: str, env: dict[str, str] | None = None, **kw: Any) -> subprocess.CompletedProcess:
        kw.setdefault("capture_output", True)
        kw.setdefault("timeout", 120)
        return subprocess.run(self.argv(action, *args), env=env or self.env(), **kw)

    def events(self, instance: str | None = None) -> list[Event]:
        """Every event of this instance now in Kafka, in the order they are in their partitions, by seq."""
        key = (instance or self.instance).encode()
        msgs = [m for m in self.kafka.consume(TOPICS) if m.key == key]
        evs = [decode(m.value) for m in msgs]
        return sorted(evs, key=lambda e: (e.boot_id, e.seq))

    def of(self, cls: type, instance: str | None = None) -> list[Any]:
        return [e for e in self.events(instance) if isinstance(e, cls)]

    def lines(self, source: str, instance: str | None = None, stage: str | None = None) -> list[tuple[int, str, bool, bool]]:
        """(line_no, text, truncated, invalid_utf8) of one source, in seq order."""
        out: list[tuple[int, str, bool, bool]] = []
        for b in self.of(LogBatch, instance):
            if b.source == source and (stage is None or b.stage == stage):
                out.extend(zip(b.line_no, b.text, b.truncated, b.invalid_utf8))
        return out


    def late_lines(self, source: str, stage: str | None = None) -> list[tuple[int, str, bool]]:
        """(line_no, text, late) of one source, in seq order."""
        out: list[tuple[int, str, bool]] = []
        for b in self.of(LogBatch):
            if b.source == source and (stage is None or b.stage == stage):
                out.extend(zip(b.line_no, b.text, getattr(b, "late", ()) or [False] * len(b.text)))
        return out

    def wait_for_line(self, source: str, text: str, timeout: float = 60.0) -> list[tuple[int, str, bool]]:
        """Poll Kafka until a line of ``source`` holds ``text`` (late lines arrive after the agent exited)."""
        deadline = time.monotonic() + timeout
        while True:
            got = self.late_lines(source)
            if any(text in t for _, t, _ in got) or time.monotonic() > deadline:
                return got
            time.sleep(0.5)


@pytest.fixture
def agent_env(kafka: Any, tmp_path: Path) -> AgentEnv:
    """A fresh instance id and spool on the session broker."""
    return AgentEnv(kafka, tmp_path, f"test-{uuid.uuid4()}", tmp_path / "spool")


@pytest.fixture
def fresh_agent_env(fresh_kafka: Any, tmp_path: Path) -> AgentEnv:
    """A fresh instance id and spool on a broker of the test's own (tests that stop it)."""
    return AgentEnv(fresh_kafka, tmp_path, f"test-{uuid.uuid4()}", tmp_path / "spool")
