"""The pure fold: a batch of Kafka messages becomes Arrow row batches, dead letters and next offsets.

Guarantees: no I/O; the same messages give the same Delta; every message ends
up either as rows or as exactly one dead letter with a reason; an event_id seen
twice in one batch yields rows once (the store drops ids seen in earlier batches), but
an event_id that comes again with other bytes is a dead letter saying so (``reused``);
no stored timestamp lies outside 1970-01-01..2200-01-01 and no seq beyond 2^40
(such events are dead letters), so no reader's arithmetic can overflow. An event's
``recv_us`` is when Kafka appended it (the record's LogAppendTime timestamp, the broker's
clock), stored as the record carries it so a replay agrees; NULL where the record has no
broker time (a CreateTime topic: its timestamp is the sender's clock, no better than ``ts_us``).
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import pyarrow as pa
from flightrec.db.foldlines import LOGS, LogLines
from flightrec.db.trust import Trust
from flightrec.schemas import EVENT_BY_NAME, TOPIC_LOGS, Codec, default_codec
from flightrec.schemas.arrow import ENVELOPE, event_fields, event_schema
from flightrec.schemas.limits import MAX_SEQ, TS_MAX_US, TS_MIN_US, TS_WINDOW
from flightrec.schemas.logcolumns import LogColumns
from flightrec.schemas.sendtime import sent_us_of

from flightrec.errors import CodecError

STR = pa.string()
I32 = pa.int32()
I64 = pa.int64()
F64 = pa.float64()
BOOL = pa.bool_()
STRMAP = pa.map_(pa.string(), pa.string())
STRLIST = pa.list_(pa.string())

# The Arrow schemas of the rows the fold writes. Every column that carries an event field takes
# its type from the .avsc (flightrec.schemas.arrow); only the fold's own columns are typed here
# (`kind`, and the Kafka record's coordinates in dead letters). Column order is the table's in
# db/schema.sql: tests/consumers/test_table_shapes.py compares the two.
FILE_TAILS = event_fields("ProcessExit", "file_tails")[0].type
_ENVELOPE = event_fields("Lifecycle", *ENVELOPE)
_KIND = pa.field("kind", STR)  # the fold's short name of the event type (KIND below)
_RECV = pa.field("recv_us", I64)  # when Kafka appended the record (its LogAppendTime), NULL when unknown

_KEY_ID = pa.field("key_id", STR)  # the key whose tag proved the event's writer (schemas/auth.py); NULL: untagged
_SENT = pa.field("sent_us", I64)  # when the sender sent it, by its clock (schemas/sendtime.py); NULL: not said
EVENTS = pa.schema(_ENVELOPE + [_KIND, pa.field("stage", STR), pa.field("fingerprint", I64), _RECV, _KEY_ID, _SENT])
LIFECYCLE = pa.schema(
    _ENVELOPE
    + [_KIND]
    + event_fields("Lifecycle", "stage", "state", "detail", "attributes")
    + event_fields("Sealed", "event_count")
)
FACTS = event_schema("InstanceFacts")
EXITS = event_schema("ProcessExit")
THROUGHPUT = pa.schema(
    _ENVELOPE
    + [_KIND]
    + event_fields("Throughput", "stage", "backend", "device", "phase", "proofs", "seconds", "proofs_per_hour")
    + event_fields("BenchmarkResult", "min_rate", "verdict", "detail", "params")
)
HEARTBEATS = pa.schema(list(event_schema("Heartbeat")) + [_RECV])
MANAGER = pa.schema(list(event_schema("ManagerEvent")) + [_RECV, _KEY_ID])
DEAD = pa.schema(
    [
        ("topic", STR),
        ("partition", I32),
        ("offset", I64),
        ("key", pa.binary()),
        ("value", pa.binary()),
        ("reason", STR),
        ("instance_id", STR),  # the instance the event claims (NULL: it could not be decoded)
        ("event_id", STR),  # NULL: it could not be decoded; a second Kafka record of the same bytes is a duplicate
    ]
)

# The table each schema's rows land in (heartbeats are summarised per boot by the store instead).
TABLES: dict[str, pa.Schema] = {
    "events_seen": EVENTS,
    "lifecycle_events": LIFECYCLE,
    "instance_facts": FACTS,
    "process_exits": EXITS,
    "throughput": THROUGHPUT,
    "log_lines": LOGS,
    "dead_letters": DEAD,
    "manager_events": MANAGER,
}

# Short kind names per event type, as stored in events_seen.kind.
KIND = {
    "flightrec.v1.Lifecycle": "lifecycle",
    "flightrec.v1.InstanceFacts": "facts",
    "flightrec.v1.Sealed": "sealed",
    "flightrec.v1.LogBatch": "log",
    "flightrec.v1.ProcessExit": "exit",
    "flightrec.v1.Throughput": "sample",  # throughput: the table `throughput`, the timeline's `throughput`
    "flightrec.v1.BenchmarkResult": "result",  # throughput too
    "flightrec.v1.Dropped": "dropped",
    "flightrec.v1.Heartbeat": "heartbeat",
    "flightrec.v1.ManagerEvent": "manager",  # never in events_seen: not part of any boot of the instance
}


def dropped_detail(rec: dict[str, Any]) -> str:
    """One line saying what a Dropped marker stands for, e.g. 'LogBatch of 6123 bytes dropped: ...'."""
    kind = str(rec.get("original_type", "")).rsplit(".", 1)[-1] or "event"
    return f"{kind} of {rec.get('original_bytes')} bytes dropped: {rec.get('reason', '')}"


# InstanceFacts fields whose Avro default ('' or 0) means "not known" (a failed GPU probe
# sends them so): stored as NULL, so a failed probe and no facts at all read (and group) alike.
UNKNOWN_WHEN_EMPTY = (
    "gpu_model",
    "gpu_count",
    "gpu_memory_mib",
    "driver_version",
    "cuda_version",
    "compute_capability",
    "gpu_probe_error",
    "host",
    "cpu_model",
    "cpu_count",
    "ram_mib",
    "image",
)


def missing_facts_as_null(rec: dict[str, Any]) -> dict[str, Any]:
    """The facts record with every unknown optional fact ('' or 0) as None."""
    return {**rec, **{k: None for k in UNKNOWN_WHEN_EMPTY if rec.get(k) in ("", 0)}}


# Kafka's record timestamp types (aiokafka's ConsumerRecord.timestamp_type): CreateTime is the sender's clock,
# LogAppendTime the broker's at append (a topic with message.timestamp.type=LogAppendTime).
CREATE_TIME = 0
LOG_APPEND_TIME = 1


class Message(Protocol):
    """What the fold reads from a Kafka record (aiokafka's ConsumerRecord fits)."""

    @property
    def topic(self) -> str: ...
    @property
    def partition(self) -> int: ...
    @property
    def offset(self) -> int: ...
    @property
    def key(self) -> bytes | None: ...
    @property
    def value(self) -> bytes | None: ...
    @property
    def timestamp(self) -> int | None: ...  # ms since the epoch
    @property
    def timestamp_type(self) -> int | None: ...  # CREATE_TIME / LOG_APPEND_TIME


@dataclass(frozen=True)
class RawMessage:
    """A Kafka record held in memory (tests and replays build these); no timestamp: no receive time."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    timestamp: int | None = None
    timestamp_type: int | None = None
    headers: tuple[tuple[str, bytes], ...] = ()  # the Kafka record's headers (the writer's tag among them)
    # why the record is a dead letter before anything of it is read: its batch could not be parsed by the Kafka
    # client (consumers/batches.py); None for a record as read
    unreadable: str | None = None


def received_us(msg: Message) -> int | None:
    """When the pipeline received the record: the broker's LogAppendTime in µs; None for a CreateTime record (the
    sender's clock), a record without a timestamp, or one outside the sane window. Pure: a replay reads the same."""
    ts = getattr(msg, "timestamp", None)
    if getattr(msg, "timestamp_type", None) != LOG_APPEND_TIME or ts is None:
        return None
    us = int(ts) * 1000
    return us if TS_MIN_US <= us < TS_MAX_US else None


class FoldError(ValueError):
    """A decoded record that cannot be folded (becomes a dead letter)."""


@dataclass(frozen=True)
class Delta:
    """The row changes of one batch of messages: what the store commits in one transaction."""

    events: pa.Table
    lifecycle: pa.Table
    facts: pa.Table
    exits: pa.Table
    throughput: pa.Table
    logs: pa.Table
    dead: pa.Table
    offsets: dict[tuple[str, int], int] = field(default_factory=dict)
    # event id -> the Kafka record it came in (topic, partition, offset, key, value): for the store's dead letter
    # when the id turns out to be stored already with other content (references to the fetched bytes, no copies)
    origins: dict[str, tuple[str, int, int, bytes | None, bytes | None]] = field(default_factory=dict)
    messages: int = 0
    duplicates: int = 0
    skipped: int = 0
    heartbeats: pa.Table = field(default_factory=HEARTBEATS.empty_table)
    manager: pa.Table = field(default_factory=MANAGER.empty_table)

    @property
    def lines(self) -> int:
        """Log lines in this delta."""
        return int(self.logs.num_rows)


def facts_summary(rec: dict[str, Any]) -> str:
    """A one-line summary of an InstanceFacts record (the lifecycle row's detail)."""
    parts = [
        p
        for p in (
            rec.get("gpu_model"),
            f"x{rec.get('gpu_count')}" if rec.get("gpu_count") else "",
            f"cc {rec['compute_capability']}" if rec.get("compute_capability") else "",
            f"driver {rec['driver_version']}" if rec.get("driver_version") else "",
            f"cuda {rec['cuda_version']}" if rec.get("cuda_version") else "",
            f"probe error: {rec['gpu_probe_error']}" if rec.get("gpu_probe_error") else "",
        )
        if p
    ]
    return " ".join(parts)


def _items(m: Any) -> list[tuple[str, str]]:
    return sorted((str(k), str(v)) for k, v in (m or {}).items())


class _Builder:
    """Accumulates columns for one Delta."""

    def __init__(self) -> None:
        self.cols: dict[str, dict[str, list[Any]]] = {
            name: {f.name: [] for f in schema}
            for name, schema in (
                ("events", EVENTS),
                ("lifecycle", LIFECYCLE),
                ("facts", FACTS),
                ("exits", EXITS),
                ("throughput", THROUGHPUT),
                ("dead", DEAD),
                ("heartbeats", HEARTBEATS),
                ("manager", MANAGER),
            )
        }
        self.lines = LogLines()
        self.dead_seen: set[tuple[str, bytes | None, str]] = set()  # (event id, bytes, reason) of its dead letters

    def add(self, table: str, row: dict[str, Any]) -> None:
        cols = self.cols[table]
        for k, col in cols.items():
            col.append(row.get(k))

    def add_log(self, rec: dict[str, Any]) -> None:
        n = len(rec["text"])
        if not (
            len(rec["line_no"]) == len(rec["line_ts_us"]) == len(rec["truncated"]) == len(rec["invalid_utf8"]) == n
        ):
            raise FoldError("LogBatch per-line arrays have different lengths")
        late = rec.get("late")
        if late is None or not len(late):
            late = [False] * n
        elif len(late) != n:
            raise FoldError("LogBatch late flags neither empty nor one per line")
        self.lines.add(rec, n, late)

    def table(self, name: str, schema: pa.Schema) -> pa.Table:
        return pa.Table.from_pydict(self.cols[name], schema=schema)


def _check_ts(name: str, value: Any) -> None:
    if value is not None and not TS_MIN_US <= value < TS_MAX_US:
        raise FoldError(f"{name} {value} outside the sane window {TS_WINDOW} (µs since the epoch)")


def _envelope(rec: dict[str, Any]) -> dict[str, Any]:
    if not rec.get("event_id") or not rec.get("instance_id"):
        raise FoldError("event without event_id or instance_id")
    if rec["seq"] < 0:
        raise FoldError(f"negative seq {rec['seq']}")
    if rec["seq"] > MAX_SEQ:
        raise FoldError(f"seq {rec['seq']} beyond {MAX_SEQ}")
    _check_ts("ts_us", rec["ts_us"])
    return {k: rec[k] for k in ("event_id", "instance_id", "boot_id", "seq", "ts_us")}


def _validate(kind: str, rec: dict[str, Any]) -> None:
    """The timestamps and counts inside an event, beyond its envelope."""
    if kind == "log":
        times = rec["line_ts_us"]
        if len(times):  # min/max run in C: the hot path stays cheap
            _check_ts("line_ts_us", int(times.min()) if isinstance(times, np.ndarray) else min(times))
            _check_ts("line_ts_us", int(times.max()) if isinstance(times, np.ndarray) else max(times))
    elif kind == "exit":
        _check_ts("started_us", rec.get("started_us"))
        _check_ts("ended_us", rec.get("ended_us"))
    elif kind == "sealed" and not 0 <= rec["event_count"] <= MAX_SEQ + 1:
        raise FoldError(f"event_count {rec['event_count']} beyond 0..{MAX_SEQ + 1}")


# Kinds whose repeats are not compared by content: a Dropped marker's text may differ between two resends of the
# same refused record (the limit the sender had learned), and manager events are not in events_seen (so a batch
# and the next would judge a repeat differently)
UNCOMPARED = ("dropped", "manager")


def fingerprint(value: bytes) -> int:
    """A 64-bit summary of a message's bytes (CRC-32 and length): a redelivery has the same, other content not."""
    return (zlib.crc32(value) << 31) ^ len(value)


def reused(event_id: str, stored: tuple[int, str], seq: int, kind: str) -> str:
    """The dead letter's reason for an event id that came again with other content."""
    return (
        f"conflict: event id {event_id} reused with other content: stored as seq {stored[0]} ({stored[1]}), "
        f"this one is seq {seq} ({kind}); this one is kept here and not stored"
    )


def _fold_one(
    b: _Builder,
    name: str,
    rec: dict[str, Any],
    fp: int,
    recv_us: int | None = None,
    key_id: str | None = None,
    sent_us: int | None = None,
) -> None:
    """Append one decoded record's rows; raises FoldError (nothing appended) when it cannot."""
    env = {**_envelope(rec), "recv_us": recv_us}
    kind = KIND[name]
    _validate(kind, rec)
    if kind == "manager":  # its own source's seq: kept in manager_events only, outside the instance's boots
        b.add(
            "manager",
            {
                **env,
                "source_id": rec["source_id"],
                "kind": rec["kind"],
                "detail": rec.get("detail", ""),
                "attributes": _items(rec.get("attributes")),
                "key_id": key_id,
            },
        )
        return
    if kind == "heartbeat":  # counted in the boot (events_seen); summarised per boot by the store
        stage = rec["stage"]
        b.add("heartbeats", {**env, "stage": stage, "interval_s": rec["interval_s"], "pid": rec.get("pid", 0)})
    elif kind == "log":
        b.add_log(rec)
        stage = rec["stage"]
    elif kind == "lifecycle":
        stage = rec["stage"]
        b.add(
            "lifecycle",
            {
                **env,
                "kind": kind,
                "stage": stage,
                "state": rec["state"],
                "detail": rec.get("detail", ""),
                "attributes": _items(rec.get("attributes")),
            },
        )
    elif kind == "sealed":
        stage = None
        b.add(
            "lifecycle",
            {
                **env,
                "kind": kind,
                "stage": None,
                "state": "sealed",
                "detail": rec.get("reason", ""),
                "attributes": [],
                "event_count": rec["event_count"],
            },
        )
    elif kind == "dropped":
        stage = rec.get("stage") or None
        b.add(
            "lifecycle",
            {
                **env,
                "kind": kind,
                "stage": stage,
                "state": "dropped",
                "detail": dropped_detail(rec),
                "attributes": _items(
                    {k: rec[k] for k in ("original_event_id", "original_type", "original_topic", "original_bytes")}
                ),
            },
        )
    elif kind == "facts":
        stage = None
        b.add("facts", {**missing_facts_as_null(rec), "attributes": _items(rec.get("attributes"))})
        b.add(
            "lifecycle",
            {**env, "kind": kind, "stage": None, "state": "info", "detail": facts_summary(rec), "attributes": []},
        )
    elif kind == "exit":
        stage = rec["stage"]
        tails = [
            {"path": t["path"], "lines": list(t["lines"]), "exists": t["exists"]} for t in rec.get("file_tails", ())
        ]
        b.add("exits", {**rec, "file_tails": tails})
    else:  # throughput: sample / result
        stage = rec["stage"]
        b.add(
            "throughput",
            {
                **rec,
                "kind": kind,
                "phase": rec.get("phase") if kind == "sample" else None,
                "params": _items(rec.get("params")),
                "seconds": rec.get("seconds"),
                "min_rate": rec.get("min_rate"),
                "verdict": rec.get("verdict"),
                "detail": rec.get("detail"),
            },
        )
    b.add("events", {**env, "kind": kind, "stage": stage, "fingerprint": fp, "key_id": key_id, "sent_us": sent_us})


_columns: LogColumns | None = None


def _log_columns() -> LogColumns:
    global _columns
    if _columns is None:
        _columns = LogColumns()
    return _columns


def in_received_order(messages: Iterable[Message]) -> list[Message]:
    """The messages in the order Kafka received them (their LogAppendTime; those without one last, as they came):
    the judge of tags learns a ``destroyed`` before the events Kafka received after it and counts every event it
    received before it, whatever partitions a batch drew them from. Stable: one partition's records keep their
    order."""
    return sorted(messages, key=_received_key)


def _received_key(msg: Message) -> tuple[int, int]:
    r = received_us(msg)
    return (1, 0) if r is None else (0, r)


def fold(
    messages: Iterable[Message],
    codec: Codec | None = None,
    keep: Callable[[str, int | None], bool] | None = None,
    trust: Trust | None = None,
) -> Delta:
    """Fold messages (in consumption order) into one Delta.

    ``keep(instance_id, ts_us)`` filters events (replay --instance/--since);
    dead letters are asked with ts_us None and their key as instance id.
    Filtered messages still advance the offsets. Bad messages become dead letters, and so do events ``trust``
    refuses (a tag missing, forged or revoked: db/trust.py), with the reason and the claimed instance.
    """
    codec = codec or default_codec()
    messages = in_received_order(messages) if trust is not None and trust.verifying else messages
    logs_as_columns = _log_columns()
    b = _Builder()
    offsets: dict[tuple[str, int], int] = {}
    seen: dict[str, tuple[int, int, str]] = {}  # event id -> (fingerprint, seq, kind) of its first message
    origins: dict[str, tuple[str, int, int, bytes | None, bytes | None]] = {}
    n = dups = skipped = 0
    for msg in messages:
        n += 1
        rec: dict[str, Any] = {}
        tp = (msg.topic, msg.partition)
        offsets[tp] = max(offsets.get(tp, 0), msg.offset + 1)
        if type(msg) is RawMessage and msg.unreadable is not None:
            dups += _dead(b, msg, msg.unreadable, keep, _claims(codec, msg.value))
            continue
        try:
            columns = logs_as_columns(msg.value) if msg.topic == TOPIC_LOGS and msg.value else None
            name, rec = (logs_as_columns.name, columns) if columns is not None else codec.decode_record(msg.value)
            expected = EVENT_BY_NAME[name].topic
            if expected != msg.topic:
                raise FoldError(f"a {name} event arrived on {msg.topic}; it belongs on {expected}")
            if keep is not None and not keep(rec.get("instance_id", ""), rec.get("ts_us", 0)):
                skipped += 1
                continue
            key_id, refusal = _judged(trust, name, rec, msg)
            if refusal is not None:
                dups += _dead(b, msg, refusal, keep, rec)
                continue
            fp = fingerprint(msg.value or b"")
            first = seen.get(rec.get("event_id"))  # type: ignore[arg-type]  # a decoded record always has its event_id (a str)
            if first is not None:
                if first[0] == fp or KIND.get(name) in UNCOMPARED:
                    dups += 1
                else:
                    dups += _dead(
                        b, msg, reused(rec["event_id"], first[1:], rec.get("seq", -1), KIND.get(name, name)), keep, rec
                    )
                continue
            _fold_one(b, name, rec, fp, received_us(msg), key_id, sent_us_of(getattr(msg, "headers", ())))
            if trust is not None and KIND.get(name) == "manager":
                trust.folded_manager_event(rec, received_us(msg))
            seen[rec["event_id"]] = (fp, rec["seq"], KIND[name])
            origins[rec["event_id"]] = (msg.topic, msg.partition, msg.offset, msg.key, msg.value)
        except CodecError as exc:
            _dead(b, msg, f"decode: {exc.reason}", keep)
        except (FoldError, KeyError, TypeError, ValueError) as exc:
            dups += _dead(b, msg, f"fold: {type(exc).__name__}: {exc}", keep, rec)
    return Delta(
        events=b.table("events", EVENTS),
        lifecycle=b.table("lifecycle", LIFECYCLE),
        facts=b.table("facts", FACTS),
        exits=b.table("exits", EXITS),
        throughput=b.table("throughput", THROUGHPUT),
        logs=b.lines.table(),
        dead=b.table("dead", DEAD),
        offsets=offsets,
        origins=origins,
        messages=n,
        duplicates=dups,
        skipped=skipped,
        heartbeats=b.table("heartbeats", HEARTBEATS),
        manager=b.table("manager", MANAGER),
    )


def _judged(trust: Trust | None, name: str, rec: dict[str, Any], msg: Message) -> tuple[str | None, str | None]:
    """What ``trust`` says of a decoded record: (the key id that wrote it, None) or (None, why it is refused)."""
    if trust is None or not trust.verifying:
        return None, None
    return trust.judge(
        KIND.get(name, name),
        rec,
        msg.topic,
        msg.partition,
        msg.key,
        msg.value or b"",
        getattr(msg, "headers", ()),
        received_us(msg),
    )


def _claims(codec: Codec, value: bytes | None) -> dict[str, Any] | None:
    """What an unreadable record's value says of itself (its instance and event id), when it decodes; else None."""
    try:
        return codec.decode_record(value)[1] if value else None
    except Exception:  # noqa: BLE001 - any bytes: nothing decoded is nothing claimed
        return None


def _dead(
    b: _Builder,
    msg: Message,
    reason: str,
    keep: Callable[[str, int | None], bool] | None,
    rec: dict[str, Any] | None = None,
) -> int:
    """Add a dead letter for ``msg`` (``rec``: what decoded of it); returns 1 when it is a copy of one this batch holds
    already (the same event id, bytes and reason: Kafka holds the record twice), which is then a duplicate, not
    added."""
    if keep is not None:
        key = msg.key.decode("utf-8", "replace") if msg.key else ""
        if not keep(key, None):
            return 0
    event_id = rec.get("event_id") if rec else None
    event_id = event_id if isinstance(event_id, str) else None
    if event_id is not None:
        if (event_id, msg.value, reason) in b.dead_seen:
            return 1
        b.dead_seen.add((event_id, msg.value, reason))
    b.add(
        "dead",
        {
            "topic": msg.topic,
            "partition": msg.partition,
            "offset": msg.offset,
            "key": msg.key,
            "value": msg.value if msg.value is not None else None,
            "reason": reason,
            "instance_id": rec.get("instance_id") if rec else None,
            "event_id": event_id,
        },
    )
    return 0
