"""Boots whose events happen at chosen times over days, committed with the broker's receive times, for the
retention, compaction and purge tests (a database made by the real fold and store, never by INSERT)."""

from __future__ import annotations

import dataclasses
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flightrec.db.filestore import FileStore
from flightrec.db.fold import CREATE_TIME, LOG_APPEND_TIME, RawMessage, fold
from flightrec.schemas import (
    Event,
    Lifecycle,
    LogBatch,
    ProcessExit,
    Sealed,
    Throughput,
    encode,
)

DAY = 86_400_000_000
HOUR = 3_600_000_000
MINUTE = 60_000_000
NOW = 1_767_225_600_000_000  # 2026-01-01: "now" for every retention step in these tests


@dataclass
class Timed:
    """One boot of one instance; each event at the time given (``at``), received by Kafka then (``recv``: the
    broker's clock, which retention judges by; None: a CreateTime topic, no receive time)."""

    instance: str = field(default_factory=lambda: f"i-{uuid.uuid4().hex[:10]}")
    boot: str = field(default_factory=lambda: f"b-{uuid.uuid4().hex[:8]}")
    events: list[tuple[Event, int | None]] = field(default_factory=list)
    lines_written: int = 0

    def add(self, cls: type, at: int, recv: int | None = -1, **fields: Any) -> Event:
        ev = cls(
            event_id=str(uuid.uuid4()),
            instance_id=self.instance,
            boot_id=self.boot,
            seq=len(self.events),
            ts_us=at,
            **fields,
        )
        self.events.append((ev, at if recv == -1 else recv))
        return ev

    def lines(self, stage: str, at: int, texts: list[str], recv: int | None = -1, source: str = "stdout") -> Event:
        n = len(texts)
        first = self.lines_written
        self.lines_written += n
        return self.add(
            LogBatch,
            at,
            recv,
            stage=stage,
            source=source,
            pid=100,
            line_no=list(range(first, first + n)),
            line_ts_us=[at - n + i for i in range(n)],
            text=texts,
            truncated=[False] * n,
            invalid_utf8=[False] * n,
        )

    def started(self, stage: str, at: int, recv: int | None = -1) -> Event:
        return self.add(Lifecycle, at, recv, stage=stage, state="started")

    def ended(self, stage: str, at: int, code: int = 0) -> None:
        self.add(ProcessExit, at, stage=stage, argv=[stage], pid=100, exit_code=code, started_us=at - 1,
                 ended_us=at, duration_s=0.0)  # fmt: skip
        self.add(Lifecycle, at + 1, stage=stage, state="succeeded" if code == 0 else "failed")

    def sample(self, at: int, proofs: int = 2, seconds: float = 10.0) -> Event:
        return self.add(
            Throughput, at, stage="supervisor", backend="cuda", proofs=proofs, seconds=seconds,
            proofs_per_hour=proofs * 3600 / seconds,
        )  # fmt: skip

    def seal(self, at: int) -> Event:
        return self.add(Sealed, at, event_count=len(self.events) + 1, reason="done")


def records(boots: list[Timed], first_offset: int = 0) -> list[RawMessage]:
    """Every boot's events as Kafka records, in time order, on partition 0 of their topics."""
    timed = sorted((e for b in boots for e in b.events), key=lambda pair: pair[0].ts_us)
    out, offsets = [], {}
    for ev, recv in timed:
        offset = offsets.get(ev.topic, first_offset)
        offsets[ev.topic] = offset + 1
        stamp = (recv // 1000, LOG_APPEND_TIME) if recv is not None else (ev.ts_us // 1000, CREATE_TIME)
        out.append(RawMessage(ev.topic, 0, offset, ev.instance_id.encode(), encode(ev), *stamp))
    return out


def write(db: Path, boots: list[Timed], batch: int = 0, offsets: bool = True) -> None:
    """The boots committed by a FileStore (``batch`` records a commit; 0: one commit); ``offsets=False``: their
    made-up offsets are not stored (a database a materializer goes on with)."""
    recs = records(boots)
    store = FileStore(db, group="t" if offsets else "flightrec-materializer")
    try:
        step = batch or len(recs) or 1
        for i in range(0, len(recs), step):
            delta = fold(recs[i : i + step])
            store.commit(delta if offsets else dataclasses.replace(delta, offsets={}))
    finally:
        store.close()
