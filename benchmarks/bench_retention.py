"""Benchmark of months of history on bounded disks (docs/retention.md):

1. sizing: bytes per line in Kafka (as the agent sends, uncompressed; and a topic with compression.type=zstd), in
   the DuckDB file (log_lines and the events_seen ledger apart), in a lake's Parquet files and in the archive, with
   one line per LogBatch (a fleet at 1-10 lines/s: the agent's 0.1 s window holds about one) and 50 per batch;
2. how long a batch waits to be committed (from due to committed) while retention runs in the materializer, against
   the same stream on the same history with retention off, p50 / p99 / max;
3. compaction: 80 % of the lines deleted, interleaved with the kept ones, against a fresh rebuild of what is kept;
   and how long batches waited while the running materializer compacted its file.

Starts its own Kafka and PostgreSQL. Run:
    PYTHONSAFEPATH=1 .venv/bin/python benchmarks/bench_retention.py [--lines 200000] [--history 1500000]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import duckdb
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from flightrec.broker import LocalBroker
from flightrec.broker.local import free_port
from flightrec.broker.topics import ensure_topics
from flightrec.catalog import LocalCatalog
from flightrec.consumers import upkeep
from flightrec.consumers.archive import Archiver
from flightrec.consumers.materializer import Materializer, Options
from flightrec.db import compact
from flightrec.db import lake as lakes
from flightrec.db.filestore import FileStore
from flightrec.db.fold import fold
from flightrec.db.keep import DAY_US, Keep
from flightrec.db.lakestore import LakeStore
from flightrec.db.views import stored_views
from flightrec.schemas import LogBatch, encode

sys.path.insert(0, str(Path(__file__).parent))
import history  # noqa: E402 - benchmarks/ on the path first
import record  # noqa: E402 - benchmarks/ on the path first

from flightrec.settings import TOPIC_LOGS, TOPICS, Settings  # noqa: E402 - after history's path, as isort puts it

AGENT = dict(acks="all", enable_idempotence=True, linger_ms=5, request_timeout_ms=30000)  # producer/deliver.py
TEXT = "proof {n} done in {ms} ms, root 0x{root:08x}, gpu0 util 97% mem 21311MiB"  # ~64 bytes, as the bench's


def batch(instance: str, boot: str, seq: int, first: int, n: int) -> bytes:
    ts = time.time_ns() // 1000
    return encode(
        LogBatch(
            event_id=str(uuid.uuid4()), instance_id=instance, boot_id=boot, seq=seq, ts_us=ts, stage="supervisor",
            source="stdout", pid=4242, line_no=list(range(first, first + n)), line_ts_us=[ts] * n,
            text=[TEXT.format(n=k, ms=k * 7919 % 997, root=k * 2654435761 % 2**32) for k in range(first, first + n)],
            truncated=[False] * n, invalid_utf8=[False] * n,
        )
    )  # fmt: skip


async def produce(bootstrap: str, topic: str, lines: int, per_batch: int, instances: int = 50) -> int:
    """``lines`` lines as LogBatches of ``per_batch``, from ``instances`` agents each sending one message at a time
    (a slow agent's messages travel one per request); returns messages."""
    per_instance = lines // per_batch // instances

    async def agent(i: int) -> None:
        p = AIOKafkaProducer(bootstrap_servers=bootstrap, **AGENT)
        await p.start()
        try:
            boot = uuid.uuid4().hex[:8]
            pending = []
            for k in range(per_instance):
                fut = await p.send(
                    topic, batch(f"size-{i}", boot, k, k * per_batch, per_batch), key=f"size-{i}".encode()
                )
                pending.append(fut)
                if per_batch == 1 and len(pending) >= 1:  # one record per request, as an agent at 1-10 lines/s
                    await pending.pop()
            await p.flush()
            for fut in pending:
                await fut
        finally:
            await p.stop()

    await asyncio.gather(*(agent(i) for i in range(instances)))
    return per_instance * instances


def log_bytes(broker: LocalBroker, topic: str) -> int:
    """The topic's log segments on the broker's disk (one replica), all partitions."""
    return sum(f.stat().st_size for d in (broker.data / "logs").glob(f"{topic}-*") for f in d.glob("*.log"))


def folder_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def table_bytes(db: Path, table: str, work: Path) -> int:
    """The blocks one table of ``db`` holds: what dropping it (in a copy) frees at the next checkpoint."""
    copy = work / f"drop-{uuid.uuid4().hex[:6]}.duckdb"
    shutil.copy(db, copy)
    con = duckdb.connect(str(copy))
    try:
        _, free_before = compact.free_bytes(con)
        con.execute(f"DROP TABLE {table}")
        con.execute("CHECKPOINT")
        _, free_after = compact.free_bytes(con)
    finally:
        con.close()
        copy.unlink(missing_ok=True)
    return free_after - free_before


async def materialize_until_idle(bootstrap: str, db: Path, **opts: Any) -> Materializer:
    async with Materializer(
        {"bootstrap_servers": bootstrap}, Options(db=str(db), until_idle=2.0, serve=False, **opts)
    ) as m:
        await m.run()
        return m


def seed(db: Path, offsets: dict[tuple[str, int], int]) -> None:
    """A new database holding ``offsets`` (a materializer starts reading there)."""
    store = FileStore(db, "flightrec-materializer")
    try:
        store.commit(dataclasses.replace(fold([]), offsets=dict(offsets)))
    finally:
        store.close()


async def end_offsets(bootstrap: str) -> dict[tuple[str, int], int]:
    from aiokafka import AIOKafkaConsumer, TopicPartition

    from flightrec.cluster import partitions_now

    parts = [TopicPartition(t, p) for t, p in await partitions_now({"bootstrap_servers": bootstrap}, TOPICS)]
    c = AIOKafkaConsumer(bootstrap_servers=bootstrap)
    await c.start()
    try:
        return {(tp.topic, tp.partition): o for tp, o in (await c.end_offsets(parts)).items()}
    finally:
        await c.stop()


def kafka_sizing(broker: LocalBroker, lines: int) -> dict[str, dict[str, float]]:
    """Bytes per line on the broker's disk (one replica), as agents send them and on a zstd topic."""
    out: dict[str, dict[str, float]] = {}
    asyncio.run(_zstd_topic(broker.bootstrap))
    for per_batch in (1, 50):
        n = lines if per_batch == 50 else lines // 25
        k0, z0 = log_bytes(broker, TOPIC_LOGS), log_bytes(broker, "bench.zstd")
        t0 = time.perf_counter()
        made = asyncio.run(produce(broker.bootstrap, TOPIC_LOGS, n, per_batch)) * per_batch
        asyncio.run(produce(broker.bootstrap, "bench.zstd", n, per_batch))
        time.sleep(2)
        out[str(per_batch)] = {
            "kafka_lines": made,
            "kafka": (log_bytes(broker, TOPIC_LOGS) - k0) / made,
            "kafka_zstd": (log_bytes(broker, "bench.zstd") - z0) / made,
        }
        print(f"Kafka, {per_batch} line(s) a batch: {made:,} lines twice in {time.perf_counter() - t0:.0f} s: "
              f"{out[str(per_batch)]}")  # fmt: skip
    return out


def fleet_records(lines: int, per_batch: int, instances: int) -> Any:
    """``lines`` lines from ``instances`` instances in turn, as LogBatches of ``per_batch``, received now: chunks of
    records of about 300,000 lines."""
    from flightrec.db.fold import LOG_APPEND_TIME, RawMessage

    boots = [uuid.uuid4().hex[:8] for _ in range(instances)]
    chunk, held = [], 0
    for k in range(lines // per_batch):
        i = k % instances
        value = batch(f"inst-{i:05d}", boots[i], k // instances, (k // instances) * per_batch, per_batch)
        chunk.append(RawMessage(TOPIC_LOGS, 0, k, f"inst-{i:05d}".encode(), value, time.time_ns() // 10**6,
                                LOG_APPEND_TIME))  # fmt: skip
        held += per_batch
        if held >= 300_000:
            yield chunk
            chunk, held = [], 0
    if chunk:
        yield chunk


def storage_sizing(catalog: LocalCatalog, work: Path, lines: int, per_batch: int) -> dict[str, float]:
    """Bytes per line in the file (and its two large tables apart), a lake and the archive, for lines made by the
    real encoder, fold and store."""
    from flightrec.consumers.archive import Archive, to_table

    db, lake_data, archive = (
        work / f"size-{per_batch}.duckdb",
        work / f"lake-{per_batch}",
        work / f"archive-{per_batch}",
    )
    store = FileStore(db, "bench")
    t0 = time.perf_counter()
    made = events = 0
    try:
        for chunk in fleet_records(lines, per_batch, instances=1000):
            made += store.commit(dataclasses.replace(fold(chunk), offsets={})).lines_written
            events += len(chunk)
            Archive(str(archive)).write(TOPIC_LOGS, 0, chunk[0].offset, chunk[-1].offset, to_table(chunk))
    finally:
        store.close()
    lake_db = catalog.create_database(f"size_{per_batch}_{uuid.uuid4().hex[:6]}")
    lake = LakeStore(lakes.parse_db(lake_db, str(lake_data)), "bench", shards=range(6), views=stored_views())
    try:
        lake.load_file(str(db))
        lakes.maintain(lake.con, "lake")
    finally:
        lake.close()
    out = {
        "lines": made,
        "events": events,
        "file": compact.file_bytes(db) / made,
        "log_lines": table_bytes(db, "log_lines", work) / made,
        "events_seen": table_bytes(db, "events_seen", work) / events,
        "lake": folder_bytes(lake_data) / made,
        "archive": folder_bytes(archive) / made,
    }
    shutil.rmtree(lake_data, ignore_errors=True)
    print(f"stored, {per_batch} line(s) a batch: {made:,} lines in {time.perf_counter() - t0:.0f} s: {out}")
    return out


def sizing(broker: LocalBroker, catalog: LocalCatalog, work: Path, lines: int) -> dict[str, dict[str, float]]:
    """Bytes per line in each place, for 1 and 50 lines per LogBatch."""
    out = kafka_sizing(broker, lines)
    for per_batch in (1, 50):
        out[str(per_batch)].update(storage_sizing(catalog, work, lines if per_batch == 50 else lines // 4, per_batch))
    return out


async def _zstd_topic(bootstrap: str) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        config = {"compression.type": "zstd", "message.timestamp.type": "LogAppendTime"}
        await admin.create_topics([NewTopic("bench.zstd", 6, 1, topic_configs=config)])
    finally:
        await admin.close()


async def _archive(bootstrap: str, where: Path) -> None:
    async with Archiver({"bootstrap_servers": bootstrap}, str(where), TOPICS, until_idle=2.0) as a:
        await a.run()


class Timed(Materializer):
    """A materializer that notes how long each batch waited from due to committed (retention steps, compaction and
    checkpoints in between included), and when."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.waits: list[tuple[float, float]] = []  # (when due, seconds to committed)
        self.commits: list[float] = []  # each commit's own duration (what the writer spent on it)

    async def _commit(self, delta: Any, behind: bool = False) -> None:
        started = time.monotonic()
        await super()._commit(delta, behind)
        self.commits.append(time.monotonic() - started)

    async def _flush(self, pending: Any) -> None:
        if not pending.records:
            return
        due = time.monotonic()
        await super()._flush(pending)
        if self._inflight is not None:
            self._inflight.add_done_callback(lambda _f: self.waits.append((due, time.monotonic() - due)))


async def stream(bootstrap: str, seconds: float, rate: int = 2000, per_batch: int = 20, agents: int = 20) -> int:
    """``rate`` lines/s for ``seconds`` s, as ``agents`` agents' batches of ``per_batch`` (each its own boot, seq
    0, 1, 2 ... as an agent numbers them)."""
    p = AIOKafkaProducer(bootstrap_servers=bootstrap, **AGENT)
    await p.start()
    boots = [uuid.uuid4().hex[:8] for _ in range(agents)]
    seqs = [0] * agents
    sent = 0
    try:
        every = per_batch / rate
        t0 = time.monotonic()
        k = 0
        while time.monotonic() - t0 < seconds:
            i = k % agents
            value = batch(f"live-{i}", boots[i], seqs[i], seqs[i] * per_batch, per_batch)
            await p.send(TOPIC_LOGS, value, key=f"live-{i}".encode())
            seqs[i] += 1
            sent += per_batch
            k += 1
            await asyncio.sleep(max(0.0, t0 + k * every - time.monotonic()))
        await p.flush()
    finally:
        await p.stop()
    return sent


def phase(bootstrap: str, db: Path, keep: Keep, seconds: float, share: float = 0.0) -> dict[str, Any]:
    """The stream into a materializer on ``db`` for ``seconds``; its batches' waits and commits."""

    async def go() -> dict[str, Any]:
        opts = Options(db=str(db), keep=keep, compact_free_share=share, serve=True)
        async with Timed({"bootstrap_servers": bootstrap}, opts) as m:
            runner = asyncio.ensure_future(m.run())
            sent = await stream(bootstrap, seconds)
            await asyncio.sleep(2.0)
            m.stop()
            await runner
            return {"sent": sent, "waits": m.waits, "commits": m.commits, "figures": m._figures.figures}

    return asyncio.run(go())


def percentiles(values: list[float]) -> tuple[float, float, float, int]:
    s = sorted(values)
    return statistics.median(s), s[min(len(s) - 1, int(len(s) * 0.99))], s[-1], len(s)


def build_history(broker: LocalBroker, work: Path, lines: int, days: float = 60) -> tuple[Path, int]:
    """``days`` of a fleet's lines ending a day ago (60: three quarters older than 14 days, a materializer catching up
    with months; 15: a day of them, as after a day's downtime), then the broker's end offsets (a materializer on it
    reads only what comes next)."""
    base = work / f"history-{days:g}.duckdb"
    now = time.time_ns() // 1000
    fleet = history.Fleet(instances=200, days=days, lines_per_day=int(lines // 200 // days), end_us=now - DAY_US)
    store = FileStore(base, "flightrec-materializer")
    t0 = time.perf_counter()
    try:
        made = history.write(store, fleet)
        store.commit(dataclasses.replace(fold([]), offsets=asyncio.run(end_offsets(broker.bootstrap))))
    finally:
        store.close()
    mib = base.stat().st_size / 2**20
    print(f"history: {made:,} lines over {days:g} days in {time.perf_counter() - t0:.0f} s, {mib:.0f} MiB")
    return base, made


def latency(
    broker: LocalBroker, work: Path, history_lines: int, rounds: int, seconds: float, days: float = 60
) -> dict[str, Any]:
    """Batch waits and commits with retention off and on, in rounds on fresh copies of one history, their order
    turned each round (off, on, on, off ...: the machine's load drifts alike over both); then a round in which the
    materializer compacts its file."""
    base, made = build_history(broker, work, history_lines, days)
    got: dict[str, dict[str, list[float]]] = {k: {"waits": [], "commits": []} for k in ("idle", "retention")}
    expired = 0
    modes = [("idle", Keep(lines_days=None, samples_days=None)), ("retention", Keep(lines_days=14))]
    for r in range(rounds):
        for name, keep in modes if r % 2 == 0 else modes[::-1]:
            db = work / f"{name}-{r}.duckdb"
            shutil.copy(base, db)
            out = phase(broker.bootstrap, db, keep, seconds)
            waits = [w for _, w in out["waits"]]
            got[name]["waits"] += waits
            got[name]["commits"] += out["commits"]
            gone = out["figures"].lines_expired
            expired += gone
            print(f"  round {r} {name}: {len(waits)} batches, median wait {statistics.median(waits):.3f} s, "
                  f"{gone:,} lines expired")  # fmt: skip
            db.unlink()
    result: dict[str, Any] = {"history_lines": made, "history_bytes": base.stat().st_size, "expired": expired,
                              "days": days, "rounds": rounds, "seconds": seconds}  # fmt: skip
    for name, series in got.items():
        w50, w99, wmax, n = percentiles(series["waits"])
        c50, c99, cmax, _ = percentiles(series["commits"])
        result[name] = {"p50": w50, "p99": w99, "max": wmax, "batches": n, "commit_p50": c50, "commit_p99": c99,
                        "commit_max": cmax}  # fmt: skip
    result["compaction"] = compaction_round(broker, work, base, seconds)
    return result


def compaction_round(broker: LocalBroker, work: Path, base: Path, seconds: float) -> dict[str, Any]:
    """The history with retention done (offline), then a materializer that compacts it at its first quiet moment
    while the stream runs: how long batches waited meanwhile."""
    from flightrec.db import retention

    db = work / "compaction.duckdb"
    shutil.copy(base, db)
    con = duckdb.connect(str(db))
    try:
        while not retention.run_step(con, Keep(lines_days=14), max_events=50_000).done:
            pass
        con.execute("CHECKPOINT")
        total, free = compact.free_bytes(con)
    finally:
        con.close()
    upkeep.MIN_FREE_BYTES = 0  # the benchmark's file is small: compact it all the same
    upkeep.FIGURES_S = 2.0
    share = max(0.01, 0.5 * free / total) if total else 0.5  # whatever share the history left free: compact it
    out = phase(broker.bootstrap, db, Keep(lines_days=14), seconds, share=share)
    f = out["figures"]
    waits = [w for _, w in out["waits"]]
    around = [w for w in waits if f.compactions and w > 0.5 * f.compaction_seconds]
    w50, w99, wmax, _ = percentiles(waits)
    print(f"  compaction round: {f.compactions} compaction(s) of {f.compaction_seconds:.2f} s, {free / 2**20:.0f} of "
          f"{total / 2**20:.0f} MiB free before; batches waiting then {[round(w, 2) for w in around]} s")  # fmt: skip
    return {"compactions": f.compactions, "seconds": f.compaction_seconds, "around": around, "p50": w50, "p99": w99,
            "max": wmax, "before": total, "free": free, "after": compact.file_bytes(db)}  # fmt: skip


def compaction_ratio(work: Path, lines: int) -> dict[str, float]:
    """80 % of the lines deleted, interleaved with the kept ones, compacted; against a fresh rebuild of what is kept."""
    now = time.time_ns() // 1000
    fleet = history.Fleet(instances=100, days=1, lines_per_day=lines // 100, end_us=now, fail_every=0)
    full, fresh = work / "full.duckdb", work / "fresh.duckdb"
    for path, f in ((full, fleet), (fresh, dataclasses.replace(fleet, keep_every=5))):
        store = FileStore(path, "bench")
        try:
            history.write(store, f)
        finally:
            store.close()
    con = duckdb.connect(str(full))
    try:
        total = con.execute("SELECT count(*) FROM log_lines").fetchall()[0][0]
        deleted = con.execute("DELETE FROM log_lines WHERE line_no % 5 <> 0").fetchall()[0][0]
        con.execute("CHECKPOINT")
    finally:
        con.close()
    before = compact.file_bytes(full)
    done = compact.compact_file(full)
    return {"lines": total, "deleted": deleted, "before": before, "after": done.bytes_after,
            "fresh": compact.file_bytes(fresh), "seconds": done.seconds}  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lines", type=int, default=2_000_000, help="lines for the sizing (fewer at 1 line a batch)")
    ap.add_argument("--history", type=int, default=1_500_000, help="lines of history retention works through")
    ap.add_argument("--compact-lines", type=int, default=1_000_000)
    ap.add_argument("--rounds", type=int, default=4, help="rounds of retention off and on, in turned order")
    ap.add_argument("--seconds", type=float, default=30.0, help="of the stream in each round")
    ap.add_argument("--parts", default="compaction,sizing,latency", help="which parts to run (comma separated)")
    ap.add_argument(
        "--history-days", default="60,15", help="histories the latency rounds run on (days ending a day ago)"
    )
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-retention-"))
    pg = Path(tempfile.mkdtemp(prefix="flightrec-catalog-bench-"))
    pg.chmod(0o711)
    broker = LocalBroker(port=free_port(), data=work / "kafka", settings=Settings.from_env({}))
    catalog = LocalCatalog(port=free_port(), data=pg / "c", settings=Settings.from_env({}))
    broker.start()
    catalog.start()
    parts = set(args.parts.split(","))
    try:
        asyncio.run(ensure_topics({"bootstrap_servers": broker.bootstrap}))
        ratio = compaction_ratio(work, args.compact_lines) if "compaction" in parts else None
        sizes = sizing(broker, catalog, work, args.lines) if "sizing" in parts else None
        waits = [
            latency(broker, work, args.history, args.rounds, args.seconds, float(days))
            for days in args.history_days.split(",")
        ] if "latency" in parts else None  # fmt: skip
    finally:
        broker.stop()
        catalog.stop()
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(pg, ignore_errors=True)
    if sizes:
        report_sizes(sizes)
    for w in waits or ():
        report_waits(w)
    if ratio:
        report_ratio(ratio)
    _record(sizes, waits or [], ratio)
    return 0


def _record(
    sizes: dict[str, dict[str, float]] | None, waits: list[dict[str, Any]], ratio: dict[str, float] | None
) -> None:
    """The parts that ran, one table: bytes per line (1 / 50 lines a LogBatch), the batches' waits with retention on
    against off (the rounds of the same run), compaction."""
    figures = []
    if sizes:
        for key, what in (
            ("kafka", "bytes per line: Kafka as the agent sends, one replica"),
            ("kafka_zstd", "bytes per line: Kafka, compression.type=zstd"),
            ("file", "bytes per line: the DuckDB file"),
            ("lake", "bytes per line: a lake's Parquet files (6 shards, after maintenance)"),
            ("archive", "bytes per line: the archive (Parquet, zstd)"),
        ):
            figures.append(
                record.Figure(f"{what}; 1 / 50 lines a LogBatch", f"{sizes['1'][key]:.1f} / {sizes['50'][key]:.1f}")
            )
    if waits:
        days = " / ".join(f"{w['days']:g}" for w in waits)
        for k, what in (
            ("p50", "batch wait, due -> committed, p50"),
            ("p99", "batch wait, p99"),
            ("max", "batch wait, max"),
            ("commit_p50", "the commit alone, p50"),
            ("commit_p99", "the commit alone, p99"),
        ):
            figures.append(
                record.Figure(
                    f"{what}, histories of {days} days",
                    " / ".join(f"{w['retention'][k] * 1000:,.0f}" for w in waits) + " ms",
                    "retention off: " + " / ".join(f"{w['idle'][k] * 1000:,.0f}" for w in waits) + " ms",
                    " / ".join(f"{w['retention'][k] / w['idle'][k]:.2f}x" for w in waits)
                    + (" (goal <= 1.2x)" if k == "commit_p99" else ""),
                )
            )
        figures.append(
            record.Figure(
                "compaction by a running materializer at its first quiet moment",
                " / ".join(f"{w['compaction']['seconds']:.2f} s" for w in waits),
                note="free before: "
                + " / ".join(
                    f"{w['compaction']['free'] / 2**20:.0f} of {w['compaction']['before'] / 2**20:.0f} MiB"
                    for w in waits
                ),
            )
        )
    if ratio:
        figures.append(
            record.Figure(
                f"compaction alone: {ratio['lines']:,} lines, {ratio['deleted']:,} deleted",
                f"{ratio['before'] / 2**20:.1f} -> {ratio['after'] / 2**20:.1f} MiB in {ratio['seconds']:.1f} s",
                f"a fresh rebuild of what is kept: {ratio['fresh'] / 2**20:.1f} MiB",
                f"{ratio['after'] / ratio['fresh']:.3f}x (goal <= 1.2x)",
            )
        )
    if figures:
        record.write(
            "bench_retention",
            "Retention",
            "Bytes per line where flightrec keeps them; a stream into a copy of a history, rounds with retention off "
            "and on in turned order (the baseline: the retention-off rounds of the same run); compaction against a "
            "fresh "
            "rebuild. Own Kafka and PostgreSQL.",
            figures,
        )


def fleet_table(one: dict[str, float], keep_days: float = 14.0) -> str:
    """Disk per day for fleets, from the bytes per line at one line per LogBatch (GB = 10^9 bytes)."""
    rows = [
        "| instances | lines/s each | lines/day | Kafka/day, one replica | archive/day | file/day, all kept "
        f"| file after retention: {keep_days:g}-day window | then per day (events_seen) | lake/day, all kept |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for instances in (10, 100, 1_000, 10_000):
        for rate in (1, 10):
            per_day = instances * rate * 86_400
            gb = {k: per_day * one[k] / 1e9 for k in ("kafka", "archive", "log_lines", "events_seen", "lake")}
            rows.append(
                f"| {instances:,} | {rate} | {per_day / 1e6:,.1f}M | {gb['kafka']:,.2f} GB | {gb['archive']:,.2f} GB | "
                f"{gb['log_lines'] + gb['events_seen']:,.2f} GB | {keep_days * gb['log_lines']:,.1f} GB | "
                f"{gb['events_seen']:,.2f} GB | {gb['lake']:,.2f} GB |"
            )
    return "\n".join(rows)


def report_sizes(sizes: dict[str, dict[str, float]]) -> None:
    print("\n| bytes per line | 1 line a LogBatch | 50 lines a LogBatch |\n| --- | ---: | ---: |")
    for key, what in (
        ("kafka", "Kafka, as the agent sends (uncompressed), one replica"),
        ("kafka_zstd", "Kafka, a topic with compression.type=zstd, one replica"),
        ("file", "the DuckDB file, everything"),
        ("log_lines", "of which log_lines (the blocks dropping it frees)"),
        ("lake", "a lake's Parquet files (6 shards, after maintenance)"),
        ("archive", "the archive (Parquet, zstd)"),
    ):
        print(f"| {what} | {sizes['1'][key]:.1f} | {sizes['50'][key]:.1f} |")
    per_event = f"{sizes['1']['events_seen']:.1f} | {sizes['50']['events_seen']:.1f}"
    print(f"| events_seen, per event (one a LogBatch) | {per_event} |")
    print("\n" + fleet_table(sizes["1"]))


def report_waits(waits: dict[str, Any]) -> None:
    idle, ret = waits["idle"], waits["retention"]
    print(f"\nhistory of {waits['days']:g} days, {waits['rounds']} rounds of {waits['seconds']:g} s each way")
    print("\n| batch wait, due -> committed | retention off | retention on | ratio |\n| --- | ---: | ---: | ---: |")
    for k in ("p50", "p99", "max"):
        print(f"| {k} | {idle[k] * 1000:.0f} ms | {ret[k] * 1000:.0f} ms | {ret[k] / idle[k]:.2f}x |")
    for k in ("commit_p50", "commit_p99", "commit_max"):
        print(f"| {k}: the commit alone | {idle[k] * 1000:.0f} ms | {ret[k] * 1000:.0f} ms | {ret[k] / idle[k]:.2f}x |")
    print(f"| batches | {idle['batches']} | {ret['batches']} | |")
    c = waits["compaction"]
    m = {k: c[k] / 2**20 for k in ("free", "before", "after")}
    print(
        f"\nretention expired {waits['expired']:,} lines in the retention rounds (history {waits['history_lines']:,} "
        f"lines, {waits['history_bytes'] / 2**20:.0f} MiB); compaction round: {c['compactions']} compaction(s) of "
        f"{c['seconds']:.2f} s ({m['free']:.0f} of {m['before']:.0f} MiB free, {m['after']:.0f} MiB after); batches "
        f"waiting then {[round(w, 2) for w in c['around']]} s; that round's waits p50 {c['p50'] * 1000:.0f} ms, "
        f"p99 {c['p99'] * 1000:.0f} ms"
    )


def report_ratio(ratio: dict[str, float]) -> None:
    mib = {k: ratio[k] / 2**20 for k in ("before", "after", "fresh")}
    print(
        f"compaction of {ratio['lines']:,} lines with {ratio['deleted']:,} deleted: {mib['before']:.1f} -> "
        f"{mib['after']:.1f} MiB in {ratio['seconds']:.1f} s; a fresh rebuild {mib['fresh']:.1f} MiB: "
        f"{ratio['after'] / ratio['fresh']:.3f}x"
    )


if __name__ == "__main__":
    sys.exit(main())
