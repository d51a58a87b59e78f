"""A fleet's history written into a database the way the materializer writes it: events encoded with the real codec,
folded with the real fold, committed by the real store, with the broker's receive times spread over days.

Used by bench_retention.py: what retention and compaction work on must be laid out as a materializer lays it out
(row groups in commit order, one events_seen row per batch), so it is made through the same code, not with SQL.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

from flightrec.db.fold import LOG_APPEND_TIME, RawMessage, fold
from flightrec.db.store import Store
from flightrec.schemas import Event, Lifecycle, LogBatch, ProcessExit, Sealed, encode

DAY_US = 86_400_000_000
TEXTS = (
    "proof {n} done in {ms} ms, root 0x{root:08x}, gpu0 util 97% mem 21311MiB",
    "supervisor: job {n} accepted from queue east-{q}, {ms} ms since the last",
    "daemon: batch {n} verified ({ms} ms), 4096 constraints, msm {q}/16",
)


@dataclass(frozen=True)
class Fleet:
    """``instances`` instances, each writing ``lines_per_day`` lines a day for ``days`` days ending at ``end_us``, in
    batches of ``batch`` lines; every ``fail_every``-th instance's benchmark fails (its lines are its evidence)."""

    instances: int
    days: float
    lines_per_day: int
    batch: int = 50
    fail_every: int = 10
    end_us: int = 1_767_225_600_000_000  # 2026-01-01
    keep_every: int = 1  # >1: only every keep_every-th line (a fresh rebuild of what a deletion kept)

    @property
    def lines(self) -> int:
        return int(self.instances * self.days * self.lines_per_day)


def _text(n: int) -> str:
    return TEXTS[n % len(TEXTS)].format(n=n, ms=(n * 7919) % 997, root=(n * 2654435761) % 2**32, q=n % 16)


class _Instance:
    def __init__(self, fleet: Fleet, i: int) -> None:
        self.id = f"inst-{i:05d}"
        self.boot = f"boot-{uuid.uuid4().hex[:8]}"
        self.failing = fleet.fail_every > 0 and i % fleet.fail_every == 0
        self.seq = 0
        self.line = 0

    def env(self, ts_us: int) -> dict[str, object]:
        self.seq += 1
        return dict(event_id=str(uuid.uuid4()), instance_id=self.id, boot_id=self.boot, seq=self.seq - 1, ts_us=ts_us)

    def lines(self, stage: str, n: int, ts_us: int, keep_every: int = 1) -> LogBatch:
        first, self.line = self.line, self.line + n
        numbers = [k for k in range(first, first + n) if k % keep_every == 0]
        return LogBatch(
            **self.env(ts_us),
            stage=stage,
            source="stdout",
            pid=4242,
            line_no=numbers,
            line_ts_us=[ts_us] * len(numbers),
            text=[_text(k) for k in numbers],
            truncated=[False] * len(numbers),
            invalid_utf8=[False] * len(numbers),
        )


def _exit(t: int) -> dict[str, object]:
    return dict(argv=["bench"], pid=1, started_us=t, ended_us=t + 2000, duration_s=0.002)


def events(fleet: Fleet) -> Iterator[Event]:
    """The fleet's events in time order: each instance's benchmark (failing or not) at the start, then its
    supervisor's lines through the days, sealed at the end."""
    start = fleet.end_us - int(fleet.days * DAY_US)
    fleet_list = [_Instance(fleet, i) for i in range(fleet.instances)]
    for inst in fleet_list:
        t = start
        yield Lifecycle(**inst.env(t), stage="benchmark", state="started")
        yield inst.lines("benchmark", fleet.batch, t + 1000, fleet.keep_every)
        if inst.failing:
            yield ProcessExit(**inst.env(t + 2000), stage="benchmark", exit_code=1, **_exit(t))
            yield Lifecycle(**inst.env(t + 3000), stage="benchmark", state="failed", detail="exited with 1")
        else:
            yield ProcessExit(**inst.env(t + 2000), stage="benchmark", exit_code=0, **_exit(t))
            yield Lifecycle(**inst.env(t + 3000), stage="benchmark", state="succeeded")
            yield Lifecycle(**inst.env(t + 4000), stage="supervisor", state="started")
    per_instance = max(1, fleet.lines // max(1, fleet.instances) // fleet.batch)
    span = int(fleet.days * DAY_US) - 10_000
    for k in range(per_instance):
        t = start + 10_000 + span * k // per_instance
        for inst in fleet_list:
            if not inst.failing:
                yield inst.lines("supervisor", fleet.batch, t, fleet.keep_every)
    for inst in fleet_list:
        if not inst.failing:
            yield Sealed(**inst.env(fleet.end_us), event_count=inst.seq + 1)


def records(fleet: Fleet) -> Iterator[RawMessage]:
    """The events as Kafka records of one partition each topic, received (LogAppendTime) at their own time."""
    offsets: dict[str, int] = {}
    for e in events(fleet):
        offset = offsets.get(e.topic, 0)
        offsets[e.topic] = offset + 1
        yield RawMessage(e.topic, 0, offset, e.instance_id.encode(), encode(e), e.ts_us // 1000, LOG_APPEND_TIME)


def write(store: Store, fleet: Fleet, batch_lines: int = 300_000) -> int:
    """Commit the fleet's history through ``store`` in batches of about ``batch_lines`` lines; returns lines. The
    records' made-up offsets are not stored: a materializer goes on with the database from its own."""
    held: list[RawMessage] = []
    lines = written = 0

    def commit() -> int:
        return store.commit({0: dataclasses.replace(fold(held), offsets={})}).lines_written

    for r in records(fleet):
        held.append(r)
        lines += fleet.batch if r.topic.endswith("logs") else 0
        if lines >= batch_lines:
            written += commit()
            held, lines = [], 0
    if held:
        written += commit()
    return written
