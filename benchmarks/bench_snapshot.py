"""Benchmark of readers apart from the writer: what publishing the readers' snapshot costs the writer, and what a
read costs a reader, on the dashboard benchmark's 10M-line file (266 MiB; built and cached by bench_dashboard.py).

No broker. A FileStore opens a copy of the file (as a materializer does: its first publish copies the whole file
into the first snapshot copy), then commits batches as a materializer does at today's rates (5,000 log lines of 20
instances each, a commit every 0.5 s of ~10,000 lines/s) and publishes after every other one, as the
materializer does (the changed blocks and the write-ahead log copied, after a CHECKPOINT when the log passed
SNAPSHOT_WAL_BYTES): the commits and the publishes timed apart, and the bytes copied counted. Then reads: a tiny
one, one of 100,000 rows and a failure's evidence, on the snapshot in the reader's
own process (its kept connection), in a bounded process of its own (made by a fork server: this process has DuckDB
databases open; `flightrec sql` forks itself, see bench_dashboard.py), and on the file itself with no materializer. Run:
    PYTHONSAFEPATH=1 .venv/bin/python benchmarks/bench_snapshot.py [--commits 40]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from flightrec.db.filestore import SNAPSHOT_WAL_BYTES, FileStore
from flightrec.db.fold import RawMessage, fold
from flightrec.db.query import run_query
from flightrec.db.sandbox import ReadLimits
from flightrec.schemas import LogBatch, encode
from flightrec.schemas.topics import TOPIC_LOGS

sys.path.insert(0, str(Path(__file__).parent))
import record  # noqa: E402 - benchmarks/ on the path first
from bench_dashboard import build_db, held_copy  # noqa: E402 - its folder: the cached 10M-line file

QUERIES = {
    "tiny (1 row)": "SELECT 42 AS answer",
    "100k rows (3 columns)": "SELECT range AS i, 'line ' || range AS text, range * 0.5 AS x FROM range(100000)",
    "one failure's evidence": "SELECT failure_class, [l.text FOR l IN last_lines] AS lines FROM failures "
    "WHERE failure_class = 'gpu_arch_unsupported' LIMIT 1",
}


def deltas(n: int, lines: int = 5000, instances: int = 20) -> list:
    """``n`` batches as a materializer folds them: ``lines`` log lines from ``instances`` instances each."""
    out = []
    boots = {f"snap-bench-{i}": f"b-{uuid.uuid4().hex[:8]}" for i in range(instances)}
    offset = 0
    for k in range(n):
        msgs = []
        per = lines // instances
        for i, (inst, boot) in enumerate(boots.items()):
            ts = time.time_ns() // 1000
            ev = LogBatch(
                event_id=str(uuid.uuid4()),
                instance_id=inst,
                boot_id=boot,
                seq=k,
                ts_us=ts,
                stage="supervisor",
                source="stdout",
                pid=1,
                line_no=list(range(k * per + 1, (k + 1) * per + 1)),
                line_ts_us=[ts] * per,
                text=[f"proof {k * per + j} done in 41.7s gpu0 util 97% mem 21311MiB" for j in range(per)],
                truncated=[False] * per,
                invalid_utf8=[False] * per,
            )
            msgs.append(RawMessage(TOPIC_LOGS, i % 6, offset, inst.encode(), encode(ev)))
            offset += 1
        out.append(fold(msgs))
    return out


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(round(q * (len(s) - 1))))]


def ms(values: list[float]) -> str:
    return f"median {statistics.median(values) * 1000:.1f} ms, p95 {pct(values, 0.95) * 1000:.1f} ms"


def writer_side(src: Path, work: Path, commits: int) -> list[record.Figure]:
    db = work / "fleet.duckdb"
    held_copy(src, db)
    t = time.perf_counter()
    store = FileStore(db, "bench")
    opened = time.perf_counter() - t
    first = store.publisher.copied_bytes if store.publisher else 0
    print(
        f"open + first publish (a whole copy of the {db.stat().st_size / 2**20:.0f} MiB file): {opened:.2f} s, "
        f"{first / 2**20:.0f} MiB copied"
    )
    batches = deltas(2 * commits)
    times: dict[str, list[float]] = {"commit": [], "commit (not published)": [], "publish": []}
    copied: list[int] = []
    checkpoints = 0
    try:
        for k, delta in enumerate(batches):
            t0 = time.perf_counter()
            store.commit(delta)
            t1 = time.perf_counter()
            if k % 2:  # alternately: the machine drifts
                times["commit (not published)"].append(t1 - t0)
                continue
            times["commit"].append(t1 - t0)
            wal = db.with_name(db.name + ".wal")
            checkpoints += wal.exists() and wal.stat().st_size > SNAPSHOT_WAL_BYTES
            before = store.publisher.copied_bytes
            assert store.publish()
            times["publish"].append(time.perf_counter() - t1)
            copied.append(store.publisher.copied_bytes - before)
    finally:
        store.close()
    size = db.stat().st_size
    print(f"{2 * commits} commits of 5,000 lines into the {size / 2**20:.0f} MiB file, every other one published:")
    for name, values in times.items():
        print(f"  {name}: {ms(values)}")
    print(
        f"  {checkpoints} of {commits} publishes checkpointed first (the log past {SNAPSHOT_WAL_BYTES >> 20} MiB); "
        f"copied per publish: median {statistics.median(copied) / 2**20:.1f} MiB, max {max(copied) / 2**20:.1f} "
        f"MiB; publishing at most every 0.5 s takes {statistics.median(times['publish']) / 0.5:.0%} of the writer "
        "thread's time (median)"
    )
    return [
        record.Figure("open + first publish of a run (the whole file copied)", f"{opened:.2f} s"),
        record.Figure(
            "commit of 5,000 lines, published after", ms(times["commit"]), ms(times["commit (not published)"])
        ),
        record.Figure(
            "publish (changed blocks and the write-ahead log copied)",
            ms(times["publish"]),
            note=f"{checkpoints} of {commits} checkpointed first",
        ),
        record.Figure("bytes copied per publish", f"median {statistics.median(copied) / 2**20:.1f} MiB"),
    ]


def reads(src: Path, work: Path, runs: int) -> list[record.Figure]:
    db = work / "reads.duckdb"
    held_copy(src, db)
    ways = {}
    store = FileStore(db, "bench")
    try:
        for name, sql in QUERIES.items():
            ways[(name, "snapshot, in the reader's process")] = timed(lambda s=sql: run_query(db, s), runs)
        stop = threading.Event()
        other = threading.Thread(target=stop.wait)  # a second thread: forking is unsafe, the fork server is used
        other.start()
        try:
            for name, sql in QUERIES.items():
                run_query(db, sql, limits=ReadLimits())  # the fork server starts
                ways[(name, "snapshot, a bounded process (fork server)")] = timed(
                    lambda s=sql: run_query(db, s, limits=ReadLimits()), runs
                )
        finally:
            stop.set()
            other.join()
    finally:
        store.close()
    for name, sql in QUERIES.items():
        ways[(name, "the file, no materializer (before: every read with none running)")] = timed(
            lambda s=sql: run_query(db, s), runs
        )
    print(f"\nreads, {runs} each after one warm-up:")
    for (name, way), values in ways.items():
        print(f"  {name}, {way}: {ms(values)}")
    ways_ = ("snapshot, in the reader's process", "snapshot, a bounded process (fork server)")
    file = "the file, no materializer (before: every read with none running)"
    return [
        record.Figure(
            f"read of {name}: {way}", ms(ways[(name, way)]), f"on the file, no materializer: {ms(ways[(name, file)])}"
        )
        for name in QUERIES
        for way in ways_
    ]


def timed(fn: Callable[[], object], runs: int) -> list[float]:
    fn()
    out = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--commits", type=int, default=40, help="published commits (as many unpublished, alternately)")
    ap.add_argument("--runs", type=int, default=21, help="reads of each kind")
    args = ap.parse_args()
    src = build_db()
    print(f"machine: {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}")
    with tempfile.TemporaryDirectory(prefix="flightrec-bench-snapshot-") as tmp:
        figures = writer_side(src, Path(tmp), args.commits) + reads(src, Path(tmp), args.runs)
    record.write(
        "bench_snapshot",
        "Readers apart",
        f"The dashboard benchmark's 10M-line file; {2 * args.commits} commits of 5,000 lines, every other one "
        "published "
        f'for readers (docs/materializer.md, "Reads, apart from the writer"); reads {args.runs} each after a warm-up; '
        "the baseline: the same reads on the file with no materializer, in the same run.",
        figures,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
