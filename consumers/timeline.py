"""One instance's life as text: lifecycle events, exits, throughput and log lines interleaved in time.

Two sources give the same entries: the database (through ``flightrec.db.query``, so
it works while a materializer runs) and the topics themselves (when the
database is gone). Events from the topics go through the materializer's own
``fold()`` into an in-memory store, so both sources read the same tables, built
by the same dispatch, failure builder and rule table.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import duckdb
from flightrec.db.classify import RuleTable, load_rules, signal_name
from flightrec.db.failures import exit_failed, is_failure_signal
from flightrec.db.filestore import FileStore
from flightrec.db.fold import KIND, Message, RawMessage, fold
from flightrec.db.liveness import Gap, ago, heartbeat_gaps
from flightrec.db.location import Location
from flightrec.db.query import run_query
from flightrec.schemas import EVENT_BY_NAME, Codec, default_codec

from flightrec.errors import CodecError, FlightrecError, MaterializeError, QueryError

Row = Mapping[str, Any]


@dataclass(frozen=True, order=True)
class Entry:
    """One line of the timeline; entries sort by time, then seq, then line number."""

    ts_us: int
    seq: int
    line_no: int
    kind: str  # event / exit / throughput / log / FAILURE / manager / GAP
    stage: str
    text: str
    highlight: bool = False
    source: str = ""  # log lines: stdout, stderr or the followed file's full path (render shortens it)


def _lifecycle_text(r: Row) -> str:
    if r.get("kind") == "sealed":
        return f"sealed: {r.get('event_count')} events" + (f" ({r['detail']})" if r.get("detail") else "")
    if r.get("kind") == "facts":
        return f"facts: {r.get('detail') or ''}".rstrip()
    if r.get("kind") == "dropped":
        return f"DROPPED {r.get('detail') or ''}".rstrip()
    return " ".join(p for p in (r.get("state") or "", r.get("detail") or "") if p)


def _exit_text(r: Row) -> str:
    if r.get("start_error"):
        what = f"could not start: {r['start_error']}"
    elif r.get("signal") is not None:
        what = f"killed by {signal_name(r.get('signal'), r.get('signal_name'))}"
    else:
        what = f"exit code {r.get('exit_code')}"
    extra = " (timed out)" if r.get("timed_out") else ""
    return f"{what}{extra} after {float(r.get('duration_s') or 0):.1f}s: {' '.join(r.get('argv') or [])}"


def _throughput_text(r: Row) -> str:
    if r.get("kind") == "result":
        return (
            f"benchmark {r.get('verdict')}: {float(r.get('proofs_per_hour') or 0):.1f} proofs/h "
            f"(min {float(r.get('min_rate') or 0):.1f}) {r.get('detail') or ''}"
        ).rstrip()
    return (
        f"{r.get('phase')} {r.get('proofs')} proofs in {float(r.get('seconds') or 0):.2f}s = "
        f"{float(r.get('proofs_per_hour') or 0):.1f} proofs/h on {r.get('backend')}"
    )


def _failure_text(r: Row) -> str:
    line = r.get("decisive_line") or r.get("matched_line")  # a file not yet migrated has only the old name
    why = f" [{line}]" if line else ""
    killed = f" (killed by {r['killed_by']})" if r.get("killed_by") else ""
    return f"{r.get('failure_class')}{killed}: {r.get('hint')}{why}"


def _manager_text(r: Row) -> str:
    what = {
        "destroyed": "destroyed by",
        "rented": "rented by",
        "released": "released by",
        "rebooted": "rebooted by",
    }.get(str(r.get("kind")), "note from")
    attrs = dict(r.get("attributes") or {})
    extra = f" [{', '.join(f'{k}={v}' for k, v in sorted(attrs.items()))}]" if attrs else ""
    return (
        f"{what} {r.get('source_id')} at {_when(r['ts_us'])[:19]}"
        + (f": {r['detail']}" if r.get("detail") else "")
        + extra
    )


def _gap_text(g: Gap, now: int | None) -> str:
    since = _when(g.since_us)[:19]
    if g.until_us is None:
        lost = (
            f"; lost contact {ago((now - (g.since_us if g.heard_us is None else g.heard_us)) / 1e6)} ago" if now else ""
        )
        return f"no heartbeat since {since} (interval {g.interval_s:g}s){lost}"
    return f"no heartbeat since {since} for {ago((g.length_us or 0) / 1e6)} (interval {g.interval_s:g}s)"


def liveness_entries(manager: Iterable[Row], gaps: Iterable[Gap], now: int | None = None) -> list[Entry]:
    """Entries for manager events (shown in place) and heartbeat gaps (marked at the last heartbeat)."""
    out = [
        Entry(r["ts_us"], 1 << 61, 0, "manager", "-", _manager_text(r), r.get("kind") == "destroyed") for r in manager
    ]
    out += [Entry(g.since_us, 1 << 60, 0, "GAP", g.stage, _gap_text(g, now), True) for g in gaps]
    return out


def entries_from_rows(
    lifecycle: Iterable[Row],
    exits: Iterable[Row],
    throughput: Iterable[Row],
    logs: Iterable[Row],
    failures: Iterable[Row],
) -> list[Entry]:
    """Entries from rows shaped like the tables (lifecycle_events, process_exits, throughput, log_lines, failures).

    An exit or a benchmark result is highlighted exactly when the failures table counts it
    (:func:`flightrec.db.failures.is_failure_signal`); a failed lifecycle event always is.
    """
    out = [
        Entry(
            _n(r["ts_us"]),
            _n(r["seq"]),
            -1,
            "event",
            r.get("stage") or "-",
            _lifecycle_text(r),
            r.get("state") == "failed",
        )
        for r in lifecycle
    ]
    out += [
        Entry(_n(r["ts_us"]), _n(r["seq"]), -1, "exit", r.get("stage") or "-", _exit_text(r), exit_failed(r))
        for r in exits
    ]
    out += [
        Entry(
            _n(r["ts_us"]),
            _n(r["seq"]),
            -1,
            "throughput",
            r.get("stage") or "-",
            _throughput_text(r),
            is_failure_signal(str(r.get("kind")), r),
        )
        for r in throughput
    ]
    out += [
        Entry(
            _n(r["ts_us"]),
            _n(r["seq"]),
            _n(r["line_no"], -1),
            "log",
            r.get("stage") or "-",
            f"{'(late) ' if r.get('late') else ''}{r['text']}",
            source=r["source"],
        )
        for r in logs
    ]
    out += [
        Entry(_n(r["ts_us"]), 1 << 62, 0, "FAILURE", r.get("stage") or "-", _failure_text(r), True) for r in failures
    ]
    return sorted(out)


Query = Callable[..., list[dict[str, Any]]]  # (sql, *params) -> rows


def _entries(q: Query, instance: str, max_lines: int) -> tuple[list[Entry], int]:
    """Entries of one instance from the tables, read with ``q``; returns (entries, log lines left out)."""
    life = q("SELECT * FROM lifecycle_events WHERE instance_id = ?", instance)
    exits = q("SELECT * FROM process_exits WHERE instance_id = ?", instance)
    throughput = q("SELECT * FROM throughput WHERE instance_id = ?", instance)
    fails = q("SELECT * FROM failures WHERE instance_id = ?", instance)
    total = q("SELECT count(*) AS n FROM log_lines WHERE instance_id = ?", instance)[0]["n"]
    limit = total if max_lines <= 0 else max_lines
    logs = q(
        """SELECT * FROM log_lines WHERE instance_id = ? ORDER BY ts_us DESC, seq DESC, line_no DESC
                LIMIT ?""",
        instance,
        limit,
    )
    manager = q("SELECT * FROM manager_events WHERE instance_id = ?", instance)
    beats = q("SELECT * FROM events_seen WHERE instance_id = ? AND kind = 'heartbeat'", instance)  # recv_us if any
    intervals = {r["boot_id"]: r["interval_s"] for r in q("SELECT * FROM heartbeats WHERE instance_id = ?", instance)}
    boots = q("SELECT * FROM boots WHERE instance_id = ?", instance)  # last_recv_us: absent in an older file
    sealed = [r["boot_id"] for r in boots if r["sealed_count"] is not None]
    now = _heard_until(q)  # the receiver's clock up to what was read, as the `lost` status
    gaps = heartbeat_gaps(
        beats,
        intervals,
        now,
        sealed,
        {r["boot_id"]: r["last_event_us"] for r in boots},
        {r["boot_id"]: r.get("last_recv_us") for r in boots},
    )
    extra = liveness_entries(manager, gaps, now) + unverified_entries(_unverified(q, instance))
    return sorted(entries_from_rows(life, exits, throughput, logs, fails) + extra), total - len(logs)


def _heard_until(q: Query) -> int:
    """Now, or the moment the materializer's input was last read to the end when that is earlier (db/status.py:
    a silence is counted up to what was read)."""
    now = time.time_ns() // 1000
    try:
        rows = q("SELECT max(caught_up_us) AS c FROM materializer_progress")
    except FlightrecError:  # a file made before the table: up to now, as the status view there
        return now
    caught = rows[0]["c"] if rows else None
    return now if caught is None else min(now, int(caught))


UNVERIFIED = "UNVERIFIED (delivered after the destroy)"


def _unverified(q: Query, instance: str) -> list[dict[str, Any]]:
    """The instance's events kept as unverified (db/trust.py: delivered after its destroy); none from a database
    made before dead letters named their instance."""
    try:
        return q(
            "SELECT value FROM dead_letters WHERE instance_id = ? AND starts_with(reason, 'unverified:') "
            'ORDER BY "offset"',
            instance,
        )
    except (QueryError, duckdb.Error):
        return []


def unverified_entries(rows: Iterable[Row]) -> list[Entry]:
    """Entries for events kept unverified: shown in place, flagged, never highlighted as a failure (they count as
    no evidence: db/trust.py)."""
    codec = default_codec()
    out: list[Entry] = []
    for r in rows:
        try:
            name, rec = codec.decode_record(r.get("value"))
        except CodecError:
            continue
        kind = KIND.get(name, "")
        if kind == "heartbeat":
            continue
        ts, seq, stage = _n(rec.get("ts_us")), _n(rec.get("seq")), str(rec.get("stage") or "-")
        if kind == "log":
            lines = zip(rec.get("line_no", ()), rec.get("text", ()), strict=False)
            out += [Entry(ts, seq, int(n), "unverified", stage, f"{UNVERIFIED} {rec['source']}: {t}") for n, t in lines]
            continue
        text = {"exit": _exit_text, "sample": _throughput_text, "result": _throughput_text}.get(kind, _lifecycle_text)
        out.append(Entry(ts, seq, -1, "unverified", stage, f"{UNVERIFIED} {kind}: {text({**rec, 'kind': kind})}"))
    return out


def from_db(db: str | Path | Location, instance: str, max_lines: int = 2000) -> tuple[list[Entry], int]:
    """Entries from the database; returns (entries, log lines left out beyond ``max_lines``)."""
    return _entries(lambda sql, *p: run_query(db, sql, list(p)).to_pylist(), instance, max_lines)


def entries_from_messages(
    messages: Iterable[Message],
    instance: str,
    rules: RuleTable | None = None,
    max_lines: int = 2000,
    memory_limit: str = "1GB",
) -> tuple[list[Entry], int]:
    """Entries of ``instance`` from Kafka records, folded by the materializer's ``fold()`` into an in-memory store.

    Whatever the materializer would dead-letter is left out here too, so the timeline from the
    topics shows exactly what a database built from them would.
    """
    store = FileStore(
        ":memory:", group="timeline", rules=rules or load_rules(), memory_limit=memory_limit, publish=False
    )
    try:
        store.commit(fold(messages, keep=lambda who, _ts: who == instance))
        return _entries(
            lambda sql, *p: store.con.execute(sql, list(p)).to_arrow_table().to_pylist(), instance, max_lines
        )
    finally:
        store.close()


def entries_from_records(
    records: Iterable[tuple[str, dict[str, Any]]], rules: RuleTable | None = None, max_lines: int = 2000
) -> tuple[list[Entry], int]:
    """Entries from decoded events of one instance (name, record), through :func:`entries_from_messages`."""
    codec = default_codec()
    messages = [
        RawMessage(
            EVENT_BY_NAME[name].topic, 0, offset, str(rec["instance_id"]).encode(), codec.encode_record(name, rec)
        )
        for offset, (name, rec) in enumerate(records)
    ]
    if not messages:
        return [], 0
    instance = (messages[0].key or b"").decode()
    return entries_from_messages(messages, instance, rules, max_lines)


async def read_instance_messages(
    kafka_kwargs: dict[str, Any], instance: str, topics: Sequence[str], timeout: float = 120.0
) -> list[RawMessage]:
    """Every decodable event of ``instance`` now in the topics (key = instance id), read to the end offsets, as
    records with their Kafka timestamps (the receive time the fold reads from a LogAppendTime topic)."""
    from aiokafka import AIOKafkaConsumer, TopicPartition
    from flightrec.consumers.batches import BatchReader

    from flightrec.cluster import partitions_now

    codec = default_codec()
    key = instance.encode()
    from aiokafka.errors import KafkaError

    from flightrec.cluster import connection_cause

    c = AIOKafkaConsumer(**kafka_kwargs, group_id=None, enable_auto_commit=False, auto_offset_reset="earliest")
    try:
        await c.start()
    except (KafkaError, OSError) as exc:
        await c.stop()
        cause = await connection_cause(kafka_kwargs)
        raise MaterializeError(
            f"cannot read the topics: {cause}"
            if cause
            else f"cannot read the topics at {kafka_kwargs.get('bootstrap_servers')}: {exc}; start Kafka "
            "(`flightrec broker start`) or set FLIGHTREC_BOOTSTRAP"
        ) from exc
    try:
        parts = [TopicPartition(t, p) for t, p in await partitions_now(kafka_kwargs, topics)]
        out: list[RawMessage] = []
        if not parts:
            return out
        c.assign(parts)
        await c.seek_to_beginning(*parts)
        end = await c.end_offsets(parts)
        reader = BatchReader(c, kafka_kwargs)  # a batch the client cannot parse is skipped, not fatal
        nxt: dict[TopicPartition, int | None] = dict.fromkeys(parts)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        try:
            while any([(await c.position(tp)) < end[tp] for tp in parts]):
                if loop.time() > deadline:
                    raise TimeoutError(f"could not read the topics to their end within {timeout:.0f}s")
                batch = await reader.getmany(nxt, timeout_ms=500, max_records=10000)
                for tp, records in batch.items():
                    if records:
                        nxt[tp] = records[-1].offset + 1
                    out.extend(_of_instance(records, key, instance, codec))
        finally:
            await reader.close()
        return out
    finally:
        await c.stop()


def _of_instance(records: Iterable[Any], key: bytes, instance: str, codec: Codec) -> Iterator[RawMessage]:
    """The decodable events of ``instance`` among records (a dead letter of an unreadable batch is none)."""
    for r in records:
        if r.key != key or getattr(r, "unreadable", None) is not None:
            continue
        try:
            _name, rec = codec.decode_record(r.value)
        except CodecError:
            continue
        if rec.get("instance_id") == instance:
            headers = tuple(r.headers or ())  # the send time among them (schemas/sendtime.py)
            yield RawMessage(r.topic, r.partition, r.offset, r.key, r.value, r.timestamp, r.timestamp_type, headers)


def _when(ts_us: int) -> str:
    """The time as UTC text; a value no calendar can show (a database from before the fold
    checked timestamps) is printed as the raw number instead of stopping the timeline."""
    try:
        return datetime.fromtimestamp(ts_us / 1e6, tz=UTC).strftime("%Y-%m-%d %H:%M:%S.%f")
    except (OverflowError, ValueError, OSError, TypeError):
        return f"ts_us={ts_us}".ljust(26)


def _n(value: Any, default: int = 0) -> int:
    """An integer sort key from a stored value that may be NULL."""
    return default if value is None else int(value)


def short_sources(sources: Iterable[str]) -> dict[str, str]:
    """A short name per log source: stdout/stderr as they are, a file by its name (parent folders added until
    unique)."""
    files = sorted({s for s in sources if s and s not in ("stdout", "stderr")})
    out = {"stdout": "stdout", "stderr": "stderr"}
    depth = 1
    names: dict[str, str] = {}
    while files:
        names = {f: "/".join(Path(f).parts[-depth:]) for f in files}
        clash = {n for n in names.values() if list(names.values()).count(n) > 1}
        out.update({f: n for f, n in names.items() if n not in clash})
        files = [f for f, n in names.items() if n in clash]
        depth += 1
        if depth > 64:
            out.update({f: f for f in files})
            break
    return out


def render(entries: Sequence[Entry], left_out: int = 0, color: bool = False) -> str:
    """The timeline as text; failures are marked '!!' (and red when ``color``); each log file's full path
    is shown once, in a legend at the top, and its lines carry the short name."""
    lines = []
    short = short_sources(e.source for e in entries if e.kind == "log")
    files = sorted((n, f) for f, n in short.items() if f not in ("stdout", "stderr"))
    if files:
        lines.append("log files:")
        width = max(len(n) for n, _ in files)
        lines += [f"  {n:<{width}}  {f}" for n, f in files]
    if left_out:
        lines.append(f"... {left_out} earlier log lines left out (use --max-lines 0 for all)")
    width = max((len(e.stage) for e in entries), default=5)
    for e in entries:
        mark = "!!" if e.highlight else "  "
        text = f"{short.get(e.source, e.source)}: {e.text}" if e.kind == "log" else e.text
        line = f"{mark} {_when(e.ts_us)}  {e.stage:<{width}}  {e.kind:<10} {text}"
        if e.highlight and color:
            line = f"\x1b[1;31m{line}\x1b[0m"
        lines.append(line)
    return "\n".join(lines)
