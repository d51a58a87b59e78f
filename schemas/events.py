"""The event model: one frozen dataclass per Avro schema, named by its ``name``."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar, TypeVar

from flightrec.schemas.topics import TOPIC_EXITS, TOPIC_LIFECYCLE, TOPIC_LOGS, TOPIC_METRICS

STAGE_STATES = ("started", "succeeded", "failed", "skipped", "info")
PHASES = ("warmup", "measured")
VERDICTS = ("pass", "fail", "error")


CLOCK_OFFSET_ENV = "FLIGHTREC_CLOCK_OFFSET_S"  # testing/diagnostics: the instance's clock, shifted
MAX_CLOCK_OFFSET_S = 10**9  # about 31 years either way: beyond it (or not finite) the setting is no shift
_clock_offset_us: int | None = None


def clock_offset_us() -> int:
    """The shift FLIGHTREC_CLOCK_OFFSET_S gives this process's event clock, in µs (0 when unset).

    A testing and diagnostic setting: it makes the agent stamp its events as an instance whose
    clock is wrong would (negative: behind), without touching the machine's clock. Read once.
    An unreadable value, or one beyond MAX_CLOCK_OFFSET_S, is no shift: a diagnostic setting never stops the agent.
    """
    global _clock_offset_us
    if _clock_offset_us is None:
        try:
            seconds = float(os.environ.get(CLOCK_OFFSET_ENV) or 0)
        except ValueError:
            seconds = 0.0
        # NaN, infinities and shifts no clock has are no shift (an event stamped there would not even encode)
        _clock_offset_us = int(seconds * 1_000_000) if abs(seconds) <= MAX_CLOCK_OFFSET_S else 0
    return _clock_offset_us


def now_us() -> int:
    """Microseconds since the Unix epoch, UTC, on this instance's clock: the events' timestamps.

    FLIGHTREC_CLOCK_OFFSET_S (testing/diagnostics) shifts it; the materializer judges liveness by
    when Kafka received the events, never by this clock.
    """
    return time.time_ns() // 1000 + clock_offset_us()


def new_event_id() -> str:
    """A fresh UUID4 for an event's ``event_id``."""
    return str(uuid.uuid4())


@dataclass(frozen=True, kw_only=True, slots=True)
class Event:
    """Fields every event carries. ``name`` is the Avro full name, ``topic`` where it travels."""

    name: ClassVar[str] = ""
    topic: ClassVar[str] = ""

    event_id: str
    instance_id: str
    boot_id: str
    seq: int
    ts_us: int

    def __post_init__(self) -> None:
        # Sequences are stored as tuples, so an event equals its decoded copy.
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, list):
                object.__setattr__(self, f.name, tuple(value))

    def to_record(self) -> dict[str, Any]:
        """The Avro record (a shallow dict: nested records become dicts)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> Event:
        """Build the event from a decoded Avro record (extra keys are ignored)."""
        return _build(cls, record)


EventT = TypeVar("EventT", bound="Event")  # one event type, kept through a function (emit, scrub, spool)


def _build(cls: type[EventT], record: Mapping[str, Any]) -> EventT:
    return cls(**{f.name: record[f.name] for f in fields(cls) if f.name in record})


@dataclass(frozen=True, kw_only=True, slots=True)
class Lifecycle(Event):
    """A stage started, succeeded, failed, was skipped, or reports something (info)."""

    name: ClassVar[str] = "flightrec.v1.Lifecycle"
    topic: ClassVar[str] = TOPIC_LIFECYCLE

    stage: str
    state: str
    detail: str = ""
    attributes: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True, slots=True)
class InstanceFacts(Event):
    """What the machine is; sent once per boot. ``gpu_probe_error`` says why GPU facts are missing."""

    name: ClassVar[str] = "flightrec.v1.InstanceFacts"
    topic: ClassVar[str] = TOPIC_LIFECYCLE

    gpu_model: str = ""
    gpu_count: int = 0
    gpu_memory_mib: int = 0
    driver_version: str = ""
    cuda_version: str = ""
    compute_capability: str = ""
    gpu_probe_error: str | None = None
    host: str = ""
    cpu_model: str = ""
    cpu_count: int = 0
    ram_mib: int = 0
    image: str = ""
    price_per_hour: float | None = None
    attributes: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True, slots=True)
class LogBatch(Event):
    """Consecutive lines of one source; per-line fields are parallel sequences of equal length."""

    name: ClassVar[str] = "flightrec.v1.LogBatch"
    topic: ClassVar[str] = TOPIC_LOGS

    stage: str
    source: str
    pid: int = 0
    line_no: Sequence[int] = ()
    line_ts_us: Sequence[int] = ()
    text: Sequence[str] = ()
    truncated: Sequence[bool] = ()
    invalid_utf8: Sequence[bool] = ()
    late: Sequence[bool] = ()  # empty: no line is late (data written before the field existed)

    def __post_init__(self) -> None:
        Event.__post_init__(self)
        n = len(self.text)
        if not (len(self.line_no) == len(self.line_ts_us) == len(self.truncated) == len(self.invalid_utf8) == n):
            raise ValueError("LogBatch: line_no, line_ts_us, text, truncated and invalid_utf8 must have equal lengths")
        if len(self.late) not in (0, n):
            raise ValueError("LogBatch: late must be empty or as long as text")

    def __len__(self) -> int:
        return len(self.text)


@dataclass(frozen=True, slots=True)
class FileTail:
    """The last lines of one followed file; ``exists`` is False if it never appeared."""

    path: str
    lines: Sequence[str] = ()
    exists: bool = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "lines", tuple(self.lines))


@dataclass(frozen=True, kw_only=True, slots=True)
class ProcessExit(Event):
    """A stage's process ended or could not start; its tails explain it on their own."""

    name: ClassVar[str] = "flightrec.v1.ProcessExit"
    topic: ClassVar[str] = TOPIC_EXITS

    stage: str
    argv: Sequence[str]
    pid: int = 0
    exit_code: int | None = None
    signal: int | None = None
    signal_name: str | None = None
    start_error: str | None = None
    started_us: int
    ended_us: int
    duration_s: float
    timed_out: bool = False
    stdout_tail: Sequence[str] = ()
    stderr_tail: Sequence[str] = ()
    file_tails: Sequence[FileTail] = ()

    def to_record(self) -> dict[str, Any]:
        rec = Event.to_record(self)
        rec["file_tails"] = [{"path": t.path, "lines": list(t.lines), "exists": t.exists} for t in self.file_tails]
        return rec

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> ProcessExit:
        rec = dict(record)
        rec["file_tails"] = tuple(FileTail(**t) for t in record.get("file_tails", ()))
        return _build(cls, rec)


@dataclass(frozen=True, kw_only=True, slots=True)
class Throughput(Event):
    """A throughput sample: proofs timed by the proving benchmark (a warm-up or a measured run); kind ``sample``."""

    name: ClassVar[str] = "flightrec.v1.Throughput"
    topic: ClassVar[str] = TOPIC_METRICS

    stage: str
    backend: str
    device: str = ""
    proofs: int
    seconds: float
    proofs_per_hour: float
    phase: str = "measured"
    params: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True, slots=True)
class BenchmarkResult(Event):
    """A throughput result, the benchmark's verdict: pass or fail against ``min_rate``, or error when it
    could not run; kind ``result``."""

    name: ClassVar[str] = "flightrec.v1.BenchmarkResult"
    topic: ClassVar[str] = TOPIC_METRICS

    stage: str
    backend: str
    device: str = ""
    proofs: int = 0
    proofs_per_hour: float
    min_rate: float
    verdict: str
    detail: str = ""
    params: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True, slots=True)
class Sealed(Event):
    """The last event of a boot: ``event_count`` events (this one included) carry seq 0..event_count-1."""

    name: ClassVar[str] = "flightrec.v1.Sealed"
    topic: ClassVar[str] = TOPIC_LIFECYCLE

    event_count: int
    reason: str = ""


@dataclass(frozen=True, kw_only=True, slots=True)
class Dropped(Event):
    """Stands in for an event Kafka refused for good; keeps its seq and says what was lost and why."""

    name: ClassVar[str] = "flightrec.v1.Dropped"
    topic: ClassVar[str] = TOPIC_LIFECYCLE

    original_event_id: str
    original_type: str
    original_topic: str
    original_bytes: int
    stage: str = ""
    reason: str


@dataclass(frozen=True, kw_only=True, slots=True)
class Heartbeat(Event):
    """The agent is alive and ``stage`` runs; sent every ``interval_s`` s while a stage runs (counted in seq)."""

    name: ClassVar[str] = "flightrec.v1.Heartbeat"
    topic: ClassVar[str] = TOPIC_LIFECYCLE

    stage: str
    interval_s: float
    pid: int = 0


LOST_AFTER_INTERVALS = 3  # an unsealed instance silent for this many heartbeat intervals is `lost`
# The operator's decisions on failure kinds (`flightrec kinds mute|merge|split`, db/kinds.py): manager events too.
KIND_DECISIONS = ("kind_muted", "kind_merged", "kind_split", "kind_unmuted", "kind_unmerged")
MANAGER_KINDS = ("rented", "destroyed", "note", "rebooted", "released", "forgotten", *KIND_DECISIONS)


@dataclass(frozen=True, kw_only=True, slots=True)
class ManagerEvent(Event):
    """A decision about an instance from the controller's side: its own source, boot and seq, never the instance's."""

    name: ClassVar[str] = "flightrec.v1.ManagerEvent"
    topic: ClassVar[str] = TOPIC_LIFECYCLE

    source_id: str
    kind: str
    detail: str = ""
    attributes: Mapping[str, str] = field(default_factory=dict)


EVENT_TYPES: tuple[type[Event], ...] = (
    Lifecycle,
    InstanceFacts,
    LogBatch,
    ProcessExit,
    Throughput,
    BenchmarkResult,
    Sealed,
    Dropped,
    Heartbeat,
    ManagerEvent,
)
EVENT_BY_NAME: dict[str, type[Event]] = {cls.name: cls for cls in EVENT_TYPES}
