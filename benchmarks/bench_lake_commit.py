"""Where one lake commit's time goes: commits of three patterns timed whole and statement by statement, no Kafka.

Starts its own PostgreSQL; first times a member's start (open with its views and six shards, then the claim of them)
on ``--starts`` new lakes, and again on the measured lake once it holds data, and a member's kept derived rows of a
lake of ``--kept-instances`` instances (claim time, memory); then one LakeStore owning six shards
commits Deltas folded beforehand from generated events (as `flightrec materialize` folds a batch): ``--warm`` commits
first (the lake's tables hold data, as in production),
then ``--commits`` of each pattern: log lines only (10 LogBatches of 500 lines from 2 instances), the same with a
failing stage (facts, started, a line, the exit, failed), and one large commit of every shard (``--large`` lines). The
store's connection is wrapped so each statement is timed (a few microseconds each on top). Run:
    PYTHONSAFEPATH=1 .venv/bin/python benchmarks/bench_lake_commit.py [--warm 40] [--commits 20] [--top 12]
"""

from __future__ import annotations

import argparse
import collections
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
import zlib
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench_materialize's helpers (PYTHONSAFEPATH=1)
import record  # noqa: E402 - benchmarks/ on the path first
from bench_materialize import BATCH, batch, failing_instance
from flightrec.catalog import LocalCatalog
from flightrec.db import lake as lakes
from flightrec.db.fold import LOG_APPEND_TIME, RawMessage, fold
from flightrec.schemas import encode

from flightrec.localservice import free_port
from flightrec.settings import Settings

SHARDS = 6


class Timed:
    """A DuckDB connection whose execute() and sql() are timed per statement text (the rest passes through)."""

    def __init__(self, con: Any) -> None:
        self._con = con
        self.times: dict[str, list[float]] = collections.defaultdict(list)

    def _key(self, sql: object) -> str:
        return " ".join(str(sql).split())[:110]

    def execute(self, sql: object, *args: Any, **kwargs: Any) -> Any:
        t = time.perf_counter()
        out = self._con.execute(sql, *args, **kwargs)
        self.times[self._key(sql)].append(time.perf_counter() - t)
        return out

    def sql(self, sql: object, *args: Any, **kwargs: Any) -> Any:
        t = time.perf_counter()
        out = self._con.sql(sql, *args, **kwargs).to_arrow_table()  # run it here, so its time is its own
        self.times[self._key(sql)].append(time.perf_counter() - t)
        return self._con.from_arrow(out)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._con, name)


class Events:
    """Kafka-like messages of a small fleet, each instance's in the partition of its key."""

    def __init__(self) -> None:
        self.offsets: collections.Counter[int] = collections.Counter()
        self.seqs: collections.Counter[str] = collections.Counter()

    def message(self, ev: Any) -> RawMessage:
        p = zlib.crc32(ev.instance_id.encode()) % SHARDS
        self.offsets[p] += 1
        now = time.time_ns() // 1_000_000
        return RawMessage(ev.topic, p, self.offsets[p], ev.instance_id.encode(), encode(ev), now, LOG_APPEND_TIME, ())

    def commit(self, instances: list[str], batches: int, fail: bool) -> dict[int, Any]:
        msgs = []
        for inst in instances:
            for _ in range(batches):
                s = self.seqs[inst]
                msgs.append(self.message(batch(inst, "b", s, BATCH, s * BATCH + 1)))
                self.seqs[inst] += 1
        if fail:
            msgs += [self.message(ev) for ev in failing_instance(f"fail-{uuid.uuid4().hex[:8]}")]
        by_shard: dict[int, list[RawMessage]] = collections.defaultdict(list)
        for m in msgs:
            by_shard[m.partition].append(m)
        return {s: fold(v) for s, v in by_shard.items()}


def start(store_class: Any, loc: Any, owner: str) -> tuple[float, float]:
    """A member's start: (seconds to open the store with its views and six shards, seconds to claim them)."""
    from flightrec.db.views import stored_views

    t = time.perf_counter()
    store = store_class(loc, "bench", shards=range(SHARDS), owner=owner, views=stored_views())
    opened = time.perf_counter() - t
    t = time.perf_counter()
    store.claim(range(SHARDS))
    claimed = time.perf_counter() - t
    store.close()
    return opened, claimed


def kept_rows(store_class: Any, loc: Any, instances: int) -> tuple[float, float]:
    """A lake of ``instances`` instances (a boot each, 15% failed) written straight into its shard tables; a member's
    claim of every shard: (seconds, MiB of in-memory tables its kept derived rows take)."""
    filler = store_class(loc, "bench", shards=range(SHARDS), owner="filler")
    con = filler.con
    ids = "'i-' || lpad(i::VARCHAR, 9, '0') AS instance_id, 'b-' || i AS boot_id"
    con.execute("BEGIN TRANSACTION")
    for p in range(SHARDS):
        rows = f"FROM range({p}, {instances}, {SHARDS}) t(i)"
        con.execute(
            f"INSERT INTO part_{p}.instances BY NAME SELECT {ids}, 'succeeded' AS state, 'benchmark' AS stage, "
            "'NVIDIA H100 80GB HBM3' AS gpu_model, 'host-' || (i % 997) AS host, 2.49 AS price_per_hour, "
            f"1500.0 AS proofs_per_hour, 'pass' AS verdict, 1.7e15::BIGINT + i AS first_event_us, "
            f"1.7e15::BIGINT + 7 * i AS last_event_us {rows}"
        )
        con.execute(
            f"INSERT INTO part_{p}.boots BY NAME SELECT {ids}, 120 AS events, 119 AS max_seq, 120 AS sealed_count, "
            f"1.7e15::BIGINT + i AS first_event_us, 1.7e15::BIGINT + 7 * i AS last_event_us, true AS complete {rows}"
        )
        con.execute(
            f"INSERT INTO part_{p}.failures BY NAME SELECT 'f-' || i AS failure_id, {ids}, 'benchmark' AS stage, "
            f"'cuda_out_of_memory' AS failure_class {rows} WHERE i % 20 < 3"
        )
    con.execute("COMMIT")
    filler.close()
    member = store_class(loc, "bench", shards=range(SHARDS), owner="member")
    memory = "SELECT coalesce(sum(memory_usage_bytes), 0) FROM duckdb_memory() WHERE tag = 'IN_MEMORY_TABLE'"
    before = member.con.execute(memory).fetchone()[0]
    t = time.perf_counter()
    member.claim(range(SHARDS))
    took = time.perf_counter() - t
    after = member.con.execute(memory).fetchone()[0]
    member.close()
    return took, (after - before) / 2**20


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--warm", type=int, default=40, help="commits before the measured ones")
    ap.add_argument("--commits", type=int, default=20, help="measured commits per pattern")
    ap.add_argument("--large", type=int, default=200_000, help="lines of the large commit (all shards)")
    ap.add_argument("--large-commits", type=int, default=5, help="measured commits of the large pattern")
    ap.add_argument("--top", type=int, default=12, help="statements listed per pattern")
    ap.add_argument("--starts", type=int, default=3, help="member starts timed on a new lake and on the used one")
    ap.add_argument(
        "--kept-instances",
        type=int,
        default=100_000,
        help="instances of the lake whose kept rows are measured (0: none)",
    )
    args = ap.parse_args()
    from flightrec.db.lakestore import LakeStore

    pg = Path(tempfile.mkdtemp(prefix="flightrec-catalog-bench-"))
    pg.chmod(0o711)  # PostgreSQL runs as `postgres` under root: it must reach its folder
    data = Path(tempfile.mkdtemp(prefix="bench-lake-commit-"))
    catalog = LocalCatalog(port=free_port(), data=pg / "c", settings=Settings.from_env({}))
    catalog.start()
    try:
        print(f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}")
        new_lakes = [catalog.create_database(f"start_{uuid.uuid4().hex[:6]}") for _ in range(args.starts)]
        starts = [start(LakeStore, lakes.parse_db(d, str(data / d[-12:])), f"new-{i}") for i, d in enumerate(new_lakes)]
        db = catalog.create_database(f"commit_{uuid.uuid4().hex[:6]}")
        store = LakeStore(lakes.parse_db(db, str(data / "lake")), "bench", shards=range(SHARDS), owner="bench")
        store.claim(range(SHARDS))
        events = Events()
        trickle = ["load-0", "load-1"]
        for k in range(args.warm):
            store.commit(events.commit(trickle, 5, fail=k % 5 == 0))
        fleet = [f"big-{i}" for i in range(20)]  # as bench_lake's backlog: 20 instances over the six shards
        patterns = {
            "log lines only (5,000 lines, 2 instances)": (args.commits, lambda: events.commit(trickle, 5, fail=False)),
            "a failing stage among 5,000 lines": (args.commits, lambda: events.commit(trickle, 5, fail=True)),
            f"{args.large:,} lines of 20 instances, every shard": (
                args.large_commits,
                lambda: events.commit(fleet, max(1, args.large // BATCH // len(fleet)), fail=False),
            ),
        }
        again = [start(LakeStore, lakes.parse_db(db, str(data / "lake")), f"again-{i}") for i in range(args.starts)]
        store.claim(range(SHARDS))  # back to the measured member
        figures: list[record.Figure] = []
        for what, runs in (("a new lake", starts), (f"the lake after {args.warm} commits", again)):
            opens, claims = zip(*runs, strict=True)
            print(
                f"start of a member on {what}, median of {len(runs)}: open {statistics.median(opens) * 1000:.0f} ms, "
                f"claim of {SHARDS} shards {statistics.median(claims) * 1000:.0f} ms "
                f"(open {', '.join(f'{o * 1000:.0f}' for o in opens)}; "
                f"claim {', '.join(f'{c * 1000:.0f}' for c in claims)})"
            )
            figures.append(
                record.Figure(
                    f"a member's start, {SHARDS} shards, {what}: open / claim, median of {len(runs)}",
                    f"{statistics.median(opens) * 1000:.0f} / {statistics.median(claims) * 1000:.0f} ms",
                )
            )
        if args.kept_instances:
            kept = catalog.create_database(f"kept_{uuid.uuid4().hex[:6]}")
            took, mib = kept_rows(LakeStore, lakes.parse_db(kept, str(data / "kept")), args.kept_instances)
            print(
                f"kept derived rows of a member owning {SHARDS} shards of {args.kept_instances:,} instances (as many "
                f"boots, {args.kept_instances * 3 // 20:,} failures): read at its claim in {took:.2f} s, "
                f"{mib:.1f} MiB of DuckDB's memory"
            )
            figures.append(
                record.Figure(
                    f"kept derived rows of {SHARDS} shards ({args.kept_instances:,} instances) read at the claim",
                    f"{took:.2f} s, {mib:.1f} MiB",
                )
            )
        print(f"\none member owning {SHARDS} shards, after {args.warm} commits; medians of each pattern's commits")
        for name, (n, make) in patterns.items():
            deltas = [make() for _ in range(n)]
            timed = store.con = Timed(store.con)
            walls = []
            for d in deltas:
                t = time.perf_counter()
                store.commit(d)
                walls.append(time.perf_counter() - t)
            store.con = timed._con
            total = sum(sum(v) for v in timed.times.values()) / n
            print(
                f"\n{name}, {n} commits: commit median {statistics.median(walls) * 1000:.0f} ms, "
                f"statements {total * 1000:.0f} ms a commit"
            )
            rows = sorted(timed.times.items(), key=lambda kv: -sum(kv[1]))[: args.top]
            for sql, v in rows:
                print(f"  {sum(v) / n * 1000:6.1f} ms/commit  {len(v) / n:4.1f}x  {sql}")
            figures.append(
                record.Figure(
                    f"{name}: commit median (of it, statements)",
                    f"{statistics.median(walls) * 1000:.0f} ms ({total * 1000:.0f} ms)",
                )
            )
        store.close()
        record.write(
            "bench_lake_commit",
            "A lake commit, statement by statement",
            f"Own PostgreSQL, no Kafka; one member owning {SHARDS} shards after {args.warm} commits; each commit's "
            "statements timed by wrapping the store's connection. No baseline runs in it: compare with an earlier "
            "run of the code before a change.",
            figures,
        )
        return 0
    finally:
        catalog.stop()
        shutil.rmtree(pg, ignore_errors=True)
        shutil.rmtree(data, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
