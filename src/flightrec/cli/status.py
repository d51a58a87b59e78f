"""`flightrec status`: one screen of what an operator asks first (db/health.py): the materializer's last commit and
how far its input is read, its lag in Kafka, disk free, dead letters, instances by status, the agent versions seen."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import time
from typing import TYPE_CHECKING, Any

from flightrec.cli.options import add_read_db
from flightrec.settings import Settings

if TYPE_CHECKING:
    from flightrec.db.health import Health
    from flightrec.db.location import Location

UNHEALTHY = 3  # the exit status when a problem is found (1: the status could not be read)


def register(sub: argparse._SubParsersAction) -> None:
    s = sub.add_parser("status", help="one screen: the materializer's lag, last commit, disk, dead letters, agents")
    add_read_db(s)
    s.add_argument("--group", default=None, help="the offsets' name in the database (default flightrec-materializer)")
    s.add_argument("--no-kafka", action="store_true", help="do not ask Kafka for the end offsets (no lag)")
    s.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    s.set_defaults(func=_status)


def _status(args: argparse.Namespace, settings: Settings) -> int:
    from flightrec.db.health import judge
    from flightrec.db.location import reader_location
    from flightrec.db.nopandas import keep_pandas_out

    keep_pandas_out()
    settings = settings.with_overrides(db=args.db)
    loc = reader_location(settings.db, args.data_path)
    h, serving = read_health(loc)
    why_no_lag = None
    if not args.no_kafka:
        h, why_no_lag = _with_lag(h, loc, settings, args.group)
    h = _replace(h, problems=judge(h, time.time_ns() // 1000, serving))
    if args.json:
        print(json.dumps({**h.as_dict(), "serving": serving, "lag_unknown": why_no_lag}, default=str))
    else:
        print(render(loc.describe(), h, serving, why_no_lag, time.time_ns() // 1000))
    return UNHEALTHY if h.problems else 0


def _replace(h: Health, **changes: Any) -> Health:
    from dataclasses import replace

    return replace(h, **changes)


def read_health(loc: Location) -> tuple[Health, bool | None]:
    """The database's figures, and whether a materializer serves it (None: cannot tell, a lake)."""
    from flightrec.db.health import STATUSES, VERSIONS, Health, disk, figures_sql
    from flightrec.db.markers import disk_full_since_us
    from flightrec.db.query import run_query
    from flightrec.db.snapshot import current
    from flightrec.db.views import VIEWS
    from flightrec.errors import QueryError

    if not loc.exists():
        raise QueryError(f"no database at {loc.describe()}; start `flightrec materialize --db {loc.describe()}`")
    path = getattr(loc, "path", None)
    serving = None if path is None else current(path) is not None  # a running materializer publishes for readers
    try:
        row = run_query(loc, figures_sql()).to_pylist()[0]
    except QueryError as exc:
        if "materializer_progress" not in str(exc):
            raise
        row = run_query(loc, figures_sql(has_progress=False)).to_pylist()[0]
    versions = tuple((str(r["version"]), int(r["instances"])) for r in run_query(loc, VERSIONS).to_pylist())
    try:
        statuses = tuple((str(r["status"]), int(r["n"])) for r in run_query(loc, STATUSES, prelude=VIEWS).to_pylist())
    except QueryError:  # the views do not fit an older file: the rest still tells
        statuses = ()
    free, total = disk(path) if path is not None else (None, None)
    return (
        Health(
            last_commit_us=row["last_commit_us"],
            caught_up_us=row["caught_up_us"],
            dead_letters=int(row["dead_letters"]),
            instances=int(row["instances"]),
            disk_free_bytes=free,
            disk_total_bytes=total,
            versions=versions,
            statuses=statuses,
            disk_full_since_us=None if path is None else disk_full_since_us(path),
        ),
        serving,
    )


def _with_lag(h: Health, loc: Location, settings: Settings, group: str | None) -> tuple[Health, str | None]:
    """The figures with the lag (Kafka's end offsets against the offsets the database holds), or why not."""
    from flightrec.consumers.options import DEFAULT_GROUP
    from flightrec.db.health import OFFSETS, lag
    from flightrec.db.query import run_query

    group = group or DEFAULT_GROUP
    committed = {
        (r["topic"], int(r["partition"])): int(r["next_offset"])
        for r in run_query(loc, OFFSETS).to_pylist()
        if r["consumer_group"] == group or loc.shared  # a lake's offsets are its group's, per shard
    }
    quiet = logging.getLogger("aiokafka")
    level, quiet.level = quiet.level, logging.CRITICAL  # the cause is said below, once
    try:
        ends = asyncio.run(asyncio.wait_for(_end_offsets(settings.kafka_kwargs()), 15.0))
    except Exception as exc:  # noqa: BLE001 - the status goes on without the lag, saying why
        return h, f"unknown: {_why(exc, settings)}"
    finally:
        quiet.level = level
    return _replace(h, lag_messages=lag(ends, committed)), None


def _why(exc: BaseException, settings: Settings) -> str:
    """Why Kafka's end offsets could not be had, in one line."""
    from flightrec.access import refusal_line, refusal_of
    from flightrec.cluster import connection_cause

    refusal = refusal_of(exc)
    if refusal is not None:
        return refusal_line(refusal, settings.kafka_kwargs(), "read")
    try:
        cause = asyncio.run(connection_cause(settings.kafka_kwargs(), timeout=5.0))
    except Exception:  # noqa: BLE001 - the probe is advice only
        cause = None
    return cause or f"Kafka at {settings.bootstrap}: {type(exc).__name__}: {exc}"


async def _end_offsets(kafka_kwargs: dict[str, Any]) -> dict[tuple[str, int], int]:
    from aiokafka import AIOKafkaConsumer, TopicPartition

    from flightrec.cluster import partitions_now
    from flightrec.settings import TOPICS

    parts = [TopicPartition(t, p) for t, p in await partitions_now(kafka_kwargs, TOPICS)]
    c = AIOKafkaConsumer(**kafka_kwargs, group_id=None, enable_auto_commit=False, request_timeout_ms=10000)
    await c.start()
    try:
        return {(tp.topic, tp.partition): end for tp, end in (await c.end_offsets(parts)).items()}
    finally:
        await c.stop()


def _gib(n: int | None) -> str:
    return "?" if n is None else f"{n / (1 << 30):.1f} GiB"


def render(where: str, h: Health, serving: bool | None, why_no_lag: str | None, now_us: int) -> str:
    """The one screen (pure)."""
    from flightrec.db.health import ago, disk_full_line

    def when(us: int | None) -> str:
        if us is None:
            return "never"
        return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(us / 1e6)) + f" ({ago(us, now_us)})"

    running = {True: "a materializer serves it live", False: "NO materializer is running on it", None: "a lake"}
    lines = [
        f"flightrec status: {where} ({running[serving]})",
        *(
            [f"  materializer    {disk_full_line(h.disk_full_since_us, now_us, serving)}"]
            if h.disk_full_since_us is not None
            else []
        ),
        f"  last commit     {when(h.last_commit_us)}",
        f"  input read to   {when(h.caught_up_us)}  (silences are judged up to there)",
        "  lag             "
        + (f"{h.lag_messages} messages in Kafka not yet in the database" if why_no_lag is None else why_no_lag),
        f"  disk            {_gib(h.disk_free_bytes)} free of {_gib(h.disk_total_bytes)}",
        f"  dead letters    {h.dead_letters}",
        f"  instances       {h.instances}: " + (", ".join(f"{n} {s}" for s, n in h.statuses) or "-"),
        "  agent versions  " + (", ".join(f"{v} ({n} instances)" for v, n in h.versions) or "none seen yet"),
    ]
    if h.problems:
        lines.append("problems:")
        lines += [f"  - {p}" for p in h.problems]
        if serving is False:
            lines.append(f"  start one: flightrec materialize --db {where}  (docs/operations.md)")
    else:
        lines.append("healthy")
    return "\n".join(lines)
