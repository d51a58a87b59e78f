"""Fit events into Kafka's message limit: before spooling (cut argv, share the tails' byte budget) and when
Kafka refuses one (split a LogBatch, stand a Dropped marker in for a record)."""

from __future__ import annotations

import dataclasses
import uuid
from dataclasses import dataclass
from typing import Any, TypeVar

from flightrec.producer.lines import cut_text, fit_tails
from flightrec.producer.segment import Record
from flightrec.schemas import Dropped, FileTail, LogBatch, ProcessExit, default_codec

ExitT = TypeVar("ExitT", bound=ProcessExit)

from flightrec.errors import CodecError

ARG_BYTES = 4096  # one argv element, at most
ARGV_BYTES = 64 * 1024  # all of argv, at most; the elements after that are counted in a last element
MARGIN = 4096  # room for the envelope, field tags and length prefixes


def fit_argv(argv: list[str]) -> list[str]:
    """``argv`` with each element cut to ARG_BYTES bytes and ARGV_BYTES in all (the cut is said). Pure."""
    out: list[str] = []
    total = 0
    for i, a in enumerate(argv):
        a = cut_text(a, ARG_BYTES)
        total += len(a.encode("utf-8", "surrogatepass"))
        if total > ARGV_BYTES:
            out.append(f"[cut: {len(argv) - i} more arguments]")
            break
        out.append(a)
    return out


def fit_exit(fields: dict[str, Any], limit: int) -> dict[str, Any]:
    """ProcessExit fields whose argv and tails together stay under ``limit`` bytes once encoded. Pure.

    The tails (stdout, stderr, each followed file) share what is left after the other fields; each
    keeps its newest lines, and one that lost lines says so in its first line.
    """
    out = dict(fields)
    argv = fit_argv([str(a) for a in out.get("argv", ())])
    out["argv"] = argv
    files = [f if isinstance(f, FileTail) else FileTail(**f) for f in out.get("file_tails", ())]
    other = sum(len(a.encode("utf-8", "surrogatepass")) + 4 for a in argv)
    other += sum(len(f.path.encode("utf-8", "surrogatepass")) + 8 for f in files)
    other += sum(len(str(out.get(k) or "").encode("utf-8", "surrogatepass")) for k in ("stage", "start_error"))
    budget = max(0, limit - other - MARGIN)
    tails = [list(out.get("stdout_tail", ())), list(out.get("stderr_tail", ()))] + [list(f.lines) for f in files]
    fitted = fit_tails(tails, budget)
    out["stdout_tail"], out["stderr_tail"] = fitted[0], fitted[1]
    out["file_tails"] = [
        FileTail(path=f.path, lines=lines, exists=f.exists) for f, lines in zip(files, fitted[2:], strict=True)
    ]
    return out


def fit_exit_event(ev: ExitT, limit: int) -> ExitT:
    """``ev`` with argv and tails cut as :func:`fit_exit` does (applied after masking, so no secret is cut). Pure."""
    out = fit_exit(
        {
            "argv": list(ev.argv),
            "stage": ev.stage,
            "start_error": ev.start_error,
            "stdout_tail": list(ev.stdout_tail),
            "stderr_tail": list(ev.stderr_tail),
            "file_tails": list(ev.file_tails),
        },
        limit,
    )
    return dataclasses.replace(
        ev,
        argv=out["argv"],
        stdout_tail=out["stdout_tail"],
        stderr_tail=out["stderr_tail"],
        file_tails=out["file_tails"],
    )


MIN_LIMIT = 1024
# errors after which sending the same record again can never succeed
PERMANENT = (
    "MessageSizeTooLargeError",
    "RecordListTooLargeError",
    "InvalidRecordError",
    "CorruptRecordException",
    "TopicAuthorizationFailedError",
    "InvalidTopicError",
    "UnsupportedForMessageFormatError",
    "InvalidRequiredAcksError",
    "RecordTooLargeError",
    "PolicyViolationError",
)
TOO_LARGE = ("MessageSizeTooLargeError", "RecordListTooLargeError", "RecordTooLargeError")


def message_size(key: bytes | None, value: bytes) -> int:
    """Bytes of a one-record batch as the broker measures it against max.message.bytes."""
    from aiokafka.record.default_records import DefaultRecordBatchBuilder

    return int(DefaultRecordBatchBuilder.estimate_size_in_bytes(key, value, []))


def is_permanent(exc: BaseException) -> bool:
    """True for an error Kafka gives for the record itself (too large, invalid, not authorized on its topic)."""
    return type(exc).__name__ in PERMANENT


@dataclass(frozen=True)
class Outgoing:
    """One Kafka message to send for a spooled record (the record itself, a part of it, or its marker)."""

    topic: str
    key: bytes
    value: bytes


PART = "/part-"  # a split LogBatch's part: event id = original event id + PART + its line range


def split_log_batch(value: bytes, key: bytes, limit: int) -> list[bytes] | None:
    """A LogBatch message cut into consecutive parts that each fit ``limit`` (same seq, derived event ids).

    A part's event id is the original's, then PART and its line range, so that consumers can count the
    parts as the one event of their seq (the completeness proof) while each part is stored once.

    None when it is not a LogBatch or one line alone does not fit. Pure and deterministic: a resend after a
    crash makes the same parts with the same event ids, so consumers drop the repeats.
    """
    codec = default_codec()
    try:
        ev = codec.decode(value)
    except CodecError:
        return None
    if not isinstance(ev, LogBatch) or len(ev) < 2:
        return None
    out: list[bytes] = []

    def part(lo: int, hi: int) -> bool:
        sub = LogBatch(
            event_id=f"{ev.event_id}{PART}{lo}-{hi}",
            instance_id=ev.instance_id,
            boot_id=ev.boot_id,
            seq=ev.seq,
            ts_us=ev.ts_us,
            stage=ev.stage,
            source=ev.source,
            pid=ev.pid,
            line_no=ev.line_no[lo:hi],
            line_ts_us=ev.line_ts_us[lo:hi],
            text=ev.text[lo:hi],
            truncated=ev.truncated[lo:hi],
            invalid_utf8=ev.invalid_utf8[lo:hi],
            late=ev.late[lo:hi] if ev.late else (),
        )
        data = codec.encode(sub)
        if message_size(key, data) <= limit:
            out.append(data)
            return True
        if hi - lo < 2:
            return False
        mid = (lo + hi) // 2
        return part(lo, mid) and part(mid, hi)

    return out if part(0, len(ev)) else None


def marker_for(rec: Record, reason: str) -> bytes:
    """The Dropped event standing in for a refused record: same instance, boot and seq; a derived event id."""
    codec = default_codec()
    try:
        name, fields = codec.decode_record(rec.value)
    except CodecError as exc:
        name, fields = "unknown", {"event_id": "", "boot_id": "", "ts_us": 0}
        reason = f"{reason}; the message does not decode either: {exc.reason}"
    original_id = str(fields.get("event_id", ""))
    ev = Dropped(
        event_id=str(uuid.uuid5(uuid.NAMESPACE_URL, f"dropped/{original_id or rec.seq}/{rec.end}")),
        instance_id=rec.key.decode("utf-8", "replace"),
        boot_id=str(fields.get("boot_id", "")),
        seq=rec.seq,
        ts_us=int(fields.get("ts_us") or 0),
        original_event_id=original_id,
        original_type=name,
        original_topic=rec.topic,
        original_bytes=len(rec.value),
        stage=str(fields.get("stage") or ""),
        reason=reason[:1000],
    )
    return codec.encode(ev)
