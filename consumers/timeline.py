"""One instance's life as text: lifecycle events, exits, metrics and log lines interleaved in time.

Two sources give the same entries: the database (through ``flightrec.query``, so
it works while a materializer runs) and the topics themselves (when the
database is gone), where failures are rebuilt with the same pure builder and
rule table the materializer uses.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from flightrec.consumers.classify import RuleTable, load_rules, signal_name
from flightrec.consumers.failures import TAIL_LINES, build_failure
from flightrec.consumers.fold import KIND, dropped_detail, facts_summary
from flightrec.consumers.liveness import Gap, ago, heartbeat_gaps
from flightrec.query import run_query
from flightrec.schemas import default_codec, now_us
from flightrec.errors import CodecError

Row = Mapping[str, Any]


@dataclass(frozen=True, order=True)
class Entry:
    """One line of the timeline; entries sort by time, then seq, then line number."""

    ts_us: int
    seq: int
    line_no: int
    kind: str        # event / exit / metric / log / FAILURE
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


def _metric_text(r: Row) -> str:
    if r.get("kind") == "result":
        return (f"benchmark {r.get('verdict')}: {float(r.get('proofs_per_hour') or 0):.1f} proofs/h "
                f"(min {float(r.get('min_rate') or 0):.1f}) {r.get('detail') or ''}").rstrip()
    return f"{r.get('phase')} {r.get('proofs')} proofs in {float(r.get('seconds') or 0):.2f}s = " \
           f"{float(r.get('proofs_per_hour') or 0):.1f} proofs/h on {r.get('backend')}"


def _failure_text(r: Row) -> str:
    why = f" [{r['matched_line']}]" if r.get("matched_line") else ""
    return f"{r.get('failure_class')}: {r.get('hint')}{why}"


def _manager_text(r: Row) -> str:
    what = {"destroyed": "destroyed by", "rented": "rented by", "released": "released by",
            "rebooted": "rebooted by"}.get(str(r.get("kind")), "note from")
    attrs = dict(r.get("attributes") or {})
    extra = f" [{', '.join(f'{k}={v}' for k, v in sorted(attrs.items()))}]" if attrs else ""
    return f"{what} {r.get('source_id')} at {_when(r['ts_us'])[:19]}" + (f": {r['detail']}" if r.get("detail") else "") + extra


def _gap_text(g: Gap, now: int | None) -> str:
    since = _when(g.since_us)[:19]
    if g.until_us is None:
        lost = f"; lost contact {ago((now - g.since_us) / 1e6)} ago" if now else ""
        return f"no heartbeat since {since} (interval {g.interval_s:g}s){lost}"
    return f"no heartbeat since {since} for {ago((g.until_us - g.since_us) / 1e6)} (interval {g.interval_s:g}s)"


def liveness_entries(manager: Iterable[Row], gaps: Iterable[Gap], now: int | None = None) -> list[Entry]:
    """Entries for manager events (shown in place) and heartbeat gaps (marked at the last heartbeat)."""
    out = [Entry(r["ts_us"], 1 << 61, 0, "manager", "-", _manager_text(r), r.get("kind") == "destroyed")
           for r in manager]
    out += [Entry(g.since_us, 1 << 60, 0, "GAP", g.stage, _gap_text(g, now), True) for g in gaps]
    return out


def entries_from_rows(lifecycle: Iterable[Row], exits: Iterable[Row], metrics: Iterable[Row],
                      logs: Iterable[Row], failures: Iterable[Row]) -> list[Entry]:
    """Entries from rows shaped like the tables (lifecycle_events, process_exits, throughput, log_lines, failures)."""
    out = [Entry(_n(r["ts_us"]), _n(r["seq"]), -1, "event", r.get("stage") or "-", _lifecycle_text(r),
                 r.get("state") == "failed") for r in lifecycle]
    out += [Entry(_n(r["ts_us"]), _n(r["seq"]), -1, "exit", r.get("stage") or "-", _exit_text(r),
                  bool(r.get("exit_code") or r.get("signal") is not None or r.get("start_error"))) for r in exits]
    out += [Entry(_n(r["ts_us"]), _n(r["seq"]), -1, "metric", r.get("stage") or "-", _metric_text(r),
                  r.get("verdict") in ("fail", "error")) for r in metrics]
    out += [Entry(_n(r["ts_us"]), _n(r["seq"]), _n(r["line_no"], -1), "log", r.get("stage") or "-",
                  f"{'(late) ' if r.get('late') else ''}{r['text']}", source=r["source"]) for r in logs]
    out += [Entry(_n(r["ts_us"]), 1 << 62, 0, "FAILURE", r.get("stage") or "-", _failure_text(r), True)
            for r in failures]
    return sorted(out)


def from_db(db: str | Path, instance: str, max_lines: int = 2000) -> tuple[list[Entry], int]:
    """Entries from the database; returns (entries, log lines left out beyond ``max_lines``)."""
    q = lambda sql, *p: run_query(db, sql, list(p)).to_pylist()  # noqa: E731
    life = q("SELECT * FROM lifecycle_events WHERE instance_id = ?", instance)
    exits = q("SELECT * FROM process_exits WHERE instance_id = ?", instance)
    metrics = q("SELECT * FROM throughput WHERE instance_id = ?", instance)
    fails = q("SELECT * FROM failures WHERE instance_id = ?", instance)
    total = q("SELECT count(*) AS n FROM log_lines WHERE instance_id = ?", instance)[0]["n"]
    limit = total if max_lines <= 0 else max_lines
    logs = q("""SELECT * FROM log_lines WHERE instance_id = ? ORDER BY ts_us DESC, seq DESC, line_no DESC
                LIMIT ?""", instance, limit)
    manager = q("SELECT * FROM manager_events WHERE instance_id = ?", instance)
    beats = q("SELECT boot_id, seq, ts_us, stage FROM events_seen WHERE instance_id = ? AND kind = 'heartbeat'", instance)
    intervals = {r["boot_id"]: r["interval_s"] for r in q("SELECT * FROM heartbeats WHERE instance_id = ?", instance)}
    boots = q("SELECT boot_id, sealed_count, last_event_us FROM boots WHERE instance_id = ?", instance)
    sealed = [r["boot_id"] for r in boots if r["sealed_count"] is not None]
    now = now_us()
    gaps = heartbeat_gaps(beats, intervals, now, sealed, {r["boot_id"]: r["last_event_us"] for r in boots})
    extra = liveness_entries(manager, gaps, now)
    return sorted(entries_from_rows(life, exits, metrics, logs, fails) + extra), total - len(logs)


def entries_from_records(records: Iterable[tuple[str, dict[str, Any]]], rules: RuleTable | None = None,
                         max_lines: int = 2000) -> tuple[list[Entry], int]:
    """Entries from decoded events of one instance (name, record); failures are rebuilt from them."""
    rules = rules or load_rules()
    seen: set[str] = set()
    life: list[dict[str, Any]] = []
    exits: list[dict[str, Any]] = []
    metrics: list[dict[str, Any]] = []
    logs: list[dict[str, Any]] = []
    facts: dict[str, dict[str, Any]] = {}
    manager: list[dict[str, Any]] = []
    beats: list[dict[str, Any]] = []
    for name, rec in records:
        if rec["event_id"] in seen:
            continue
        seen.add(rec["event_id"])
        kind = KIND[name]
        if kind == "manager":
            manager.append(rec)
        elif kind == "heartbeat":
            beats.append(rec)
        elif kind == "lifecycle":
            life.append({**rec, "kind": kind})
        elif kind == "sealed":
            life.append({**rec, "kind": kind, "state": "sealed", "stage": None, "detail": rec.get("reason")})
        elif kind == "facts":
            facts[rec["boot_id"]] = rec
            life.append({**rec, "kind": kind, "state": "info", "stage": None,
                         "detail": facts_summary(rec)})
        elif kind == "dropped":  # an event Kafka refused for good: its marker, in its place
            life.append({**rec, "kind": kind, "state": "dropped", "stage": rec.get("stage") or None,
                         "detail": dropped_detail(rec)})
        elif kind == "exit":
            exits.append(rec)
        elif kind in ("sample", "result"):
            metrics.append({**rec, "kind": kind})
        else:
            for i, text in enumerate(rec["text"]):
                logs.append({"ts_us": rec["line_ts_us"][i], "seq": rec["seq"], "line_no": rec["line_no"][i],
                             "stage": rec["stage"], "source": rec["source"], "text": text,
                             "boot_id": rec["boot_id"], "late": bool(rec.get("late") and rec["late"][i])})
    failures = []
    # as in the database: a boot without facts of its own shows the instance's latest ones
    latest_facts = max(facts.values(), key=lambda f: (f["ts_us"], f["seq"]), default=None)
    stages = {(r["boot_id"], r["stage"]) for r in life + exits + metrics if r.get("stage")}
    for boot, stage in sorted(stages):
        tails: dict[str, list[str]] = defaultdict(list)
        late: dict[str, list[str]] = defaultdict(list)
        for line in sorted((x for x in logs if x["boot_id"] == boot and x["stage"] == stage),
                           key=lambda x: (x["seq"], x["line_no"])):
            tails[line["source"]].append(line["text"])
            if line["late"]:
                late[line["source"]].append(line["text"])
        row = build_failure(
            life[0]["instance_id"] if life else "", boot, stage,
            lifecycle=[r for r in life if r["boot_id"] == boot and r["kind"] == "lifecycle"],
            exits=[r for r in exits if r["boot_id"] == boot and r["stage"] == stage],
            results=[r for r in metrics if r["boot_id"] == boot and r["stage"] == stage and r["kind"] == "result"],
            facts=facts.get(boot) or latest_facts, log_tails={k: v[-TAIL_LINES:] for k, v in tails.items()}, rules=rules,
            late_tails={k: v[-TAIL_LINES:] for k, v in late.items()})
        if row is not None:
            failures.append(row)
    logs.sort(key=lambda x: (x["ts_us"], x["seq"], x["line_no"]))
    left_out = max(0, len(logs) - max_lines) if max_lines > 0 else 0
    intervals = {b["boot_id"]: b["interval_s"] for b in sorted(beats, key=lambda b: b["seq"])}
    sealed = [r["boot_id"] for r in life if r["kind"] == "sealed"]
    last: dict[str, int] = {}
    for r in [*life, *exits, *metrics, *logs, *beats]:
        last[r["boot_id"]] = max(last.get(r["boot_id"], 0), r["ts_us"])
    now = now_us()
    extra = liveness_entries(manager, heartbeat_gaps(beats, intervals, now, sealed, last), now)
    return sorted(entries_from_rows(life, exits, metrics, logs[left_out:], failures) + extra), left_out


async def read_instance_records(kafka_kwargs: dict[str, Any], instance: str, topics: Sequence[str],
                                timeout: float = 120.0) -> list[tuple[str, dict[str, Any]]]:
    """Every decodable event of ``instance`` now in the topics (key = instance id), read to the end offsets."""
    from aiokafka import AIOKafkaConsumer, TopicPartition

    from flightrec.cluster import partitions_now

    codec = default_codec()
    key = instance.encode()
    c = AIOKafkaConsumer(**kafka_kwargs, group_id=None, enable_auto_commit=False, auto_offset_reset="earliest")
    await c.start()
    try:
        parts = [TopicPartition(t, p) for t, p in await partitions_now(kafka_kwargs, topics)]
        out: list[tuple[str, dict[str, Any]]] = []
        if not parts:
            return out
        c.assign(parts)
        await c.seek_to_beginning(*parts)
        end = await c.end_offsets(parts)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while any([(await c.position(tp)) < end[tp] for tp in parts]):
            if loop.time() > deadline:
                raise TimeoutError(f"could not read the topics to their end within {timeout:.0f}s")
            batch = await c.getmany(timeout_ms=500, max_records=10000)
            for records in batch.values():
                for r in records:
                    if r.key != key:
                        continue
                    try:
                        name, rec = codec.decode_record(r.value)
                    except CodecError:
                        continue
                    if rec.get("instance_id") == instance:
                        out.append((name, rec))
        return out
    finally:
        await c.stop()


def _when(ts_us: int) -> str:
    """The time as UTC text; a value no calendar can show (a database from before the fold
    checked timestamps) is printed as the raw number instead of stopping the timeline."""
    try:
        return datetime.fromtimestamp(ts_us / 1e6, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f")
    except (OverflowError, ValueError, OSError, TypeError):
        return f"ts_us={ts_us}".ljust(26)


def _n(value: Any, default: int = 0) -> int:
    """An integer sort key from a stored value that may be NULL."""
    return default if value is None else int(value)


def short_sources(sources: Iterable[str]) -> dict[str, str]:
    """A short name per log source: stdout/stderr as they are, a file by its name (parent folders added until unique)."""
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
        line = f"{mark} {_when(e.ts_us)}  {e.stage:<{width}}  {e.kind:<7} {text}"
        if e.highlight and color:
            line = f"\x1b[1;31m{line}\x1b[0m"
        lines.append(line)
    return "\n".join(lines)
