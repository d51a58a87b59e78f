"""Benchmark of the lake writer: lines/s into a DuckLake with 1 and 2 group members vs a file on the same topics,
and Kafka-ack -> visible latency for a lake reader.

Starts its own Kafka and PostgreSQL (free ports, temp folders) and stops them. Run:
    PYTHONSAFEPATH=1 .venv/bin/python benchmarks/bench_lake.py [--lines 200000] [--runs 3]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import duckdb

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench_materialize's helpers (PYTHONSAFEPATH=1)

from bench_materialize import BATCH, FAIL_EVERY, env_for, flightrec_cmd, pct, probe_latency, produce_backlog

from flightrec.db import lake as lakes
from flightrec.broker import LocalBroker
from flightrec.catalog import LocalCatalog
from flightrec.localservice import free_port
from flightrec.settings import Settings


def file_run(bootstrap: str, work: Path, n: int) -> float:
    """lines/s of `flightrec materialize` into a new file (its own run time: open -> last commit)."""
    db = work / f"file-{n}.duckdb"
    subprocess.run(
        flightrec_cmd("materialize", "--db", str(db), "--until-idle", "2", "--no-serve"),
        env=env_for(bootstrap),
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    con = duckdb.connect(str(db), read_only=True)
    try:
        lines, run_s = con.execute("""SELECT (SELECT count(*) FROM log_lines),
            (SELECT (max(last_commit_us) - min(started_us)) / 1e6 FROM materializer_runs)""").fetchone()
    finally:
        con.close()
    return lines / run_s


def lake_run(bootstrap: str, catalog: LocalCatalog, work: Path, members: int, n: int) -> tuple[float, float, int]:
    """(lines/s, wall s incl. start, conflicts retried) of ``members`` processes of one group into a new lake.

    The rate is over the members' own run time: the first member's open to the last member's last commit."""
    name = f"bench_{members}_{n}_{uuid.uuid4().hex[:6]}"
    db = catalog.create_database(name)
    data = work / name
    group = f"bench-{name}"
    t0 = time.perf_counter()
    procs = [
        subprocess.Popen(
            flightrec_cmd("materialize", "--db", db, "--data-path", str(data), "--group", group, "--until-idle", "3"),
            env=env_for(bootstrap),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(members)
    ]
    conflicts = 0
    for p in procs:
        _, err = p.communicate(timeout=900)
        if p.returncode != 0:
            raise SystemExit(f"a lake member failed:\n{err[-3000:]}")
        conflicts += int(err.rsplit("conflicts_retried=", 1)[1].split()[0]) if "conflicts_retried=" in err else 0
    wall = time.perf_counter() - t0
    con = lakes.connect(lakes.parse_db(db, str(data)))
    try:
        lines, run_s = con.execute("""SELECT (SELECT count(*) FROM log_lines),
            (SELECT (max(last_commit_us) - min(started_us)) / 1e6 FROM materializer_runs WHERE commits > 0)""").fetchone()
    finally:
        con.close()
    catalog.drop_database(name)
    shutil.rmtree(data, ignore_errors=True)
    return lines / run_s, wall, conflicts


def latency(
    bootstrap: str, catalog: LocalCatalog, work: Path, seconds: float = 20.0, fail_every: int = 0
) -> tuple[list[float], list[float]]:
    """Seconds from a probe line's ack by Kafka to its visibility to a lake reader, under ~10k lines/s of load, and
    from a failing stage's exit to its failures row (bench_materialize.probe_latency), into a new lake."""
    db = catalog.create_database(f"latency_{uuid.uuid4().hex[:6]}")
    data = work / f"latency-{uuid.uuid4().hex[:6]}"
    proc = subprocess.Popen(
        flightrec_cmd(
            "materialize", "--db", db, "--data-path", str(data), "--group", f"latency-{uuid.uuid4().hex[:6]}"
        ),
        env=env_for(bootstrap),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    return probe_latency(bootstrap, db, proc, seconds, start_wait=8.0, poll_s=0.05, fail_every=fail_every)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lines", type=int, default=200_000)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-lake-"))
    pg = Path(tempfile.mkdtemp(prefix="flightrec-catalog-bench-"))
    pg.chmod(0o711)  # PostgreSQL runs as `postgres` under root: it must reach its folder
    broker = LocalBroker(port=free_port(), data=work / "kafka", settings=Settings.from_env({}))
    catalog = LocalCatalog(port=free_port(), data=pg / "c", settings=Settings.from_env({}))
    broker.start()
    catalog.start()
    try:
        lat, _ = latency(broker.bootstrap, catalog, work)
        lat_f, fail_lat = latency(broker.bootstrap, catalog, work, fail_every=FAIL_EVERY)
        sent, _ = asyncio.run(produce_backlog(broker.bootstrap, args.lines))
        rates: dict[str, list[float]] = {"file": [], "lake1": [], "lake2": []}
        walls: dict[str, list[float]] = {"lake1": [], "lake2": []}
        conflicts = 0
        for n in range(args.runs):  # interleaved, so a slow spell of the machine hits all three alike
            rates["file"].append(file_run(broker.bootstrap, work, n))
            for members in (1, 2):
                rate, wall, c = lake_run(broker.bootstrap, catalog, work, members, n)
                rates[f"lake{members}"].append(rate)
                walls[f"lake{members}"].append(wall)
                conflicts += c
        med = {k: statistics.median(v) for k, v in rates.items()}
        print(f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at the end")
        print(
            f"backlog: {sent:,} lines (+ ~{int(20 * 0.1 * BATCH * 2 * 10):,} latency-phase lines) in "
            f"{BATCH}-line batches of 20 instances; medians of {args.runs} runs"
        )
        print(f"file (embedded, 1 process): {med['file']:,.0f} lines/s  runs {[round(r) for r in rates['file']]}")
        for m in (1, 2):
            k = f"lake{m}"
            print(
                f"lake, {m} member{'s' if m > 1 else ''}: {med[k]:,.0f} lines/s (run: first open -> last commit), "
                f"wall incl. start and group join {statistics.median(walls[k]):.1f}s  runs {[round(r) for r in rates[k]]}"
            )
        print(
            f"ratios: lake 1 member / file {med['lake1'] / med['file']:.2f}; lake 2 members / 1 member "
            f"{med['lake2'] / med['lake1']:.2f}; conflicts retried in all lake runs: {conflicts}"
        )
        print(
            f"Kafka ack -> visible to a lake reader, {len(lat)} probes under ~10k lines/s: p50 {pct(lat, 0.5):.2f}s "
            f"p99 {pct(lat, 0.99):.2f}s max {max(lat):.2f}s (goal p99 <= 1.5 s)"
        )
        print(
            f"exit of a failing stage -> its failures row visible to a lake reader, {len(fail_lat)} probes, a failing "
            f"stage every {FAIL_EVERY / 10:g} s: p50 {pct(fail_lat, 0.5):.2f}s p99 {pct(fail_lat, 0.99):.2f}s "
            f"max {max(fail_lat):.2f}s; the lines meanwhile: p50 {pct(lat_f, 0.5):.2f}s p99 {pct(lat_f, 0.99):.2f}s"
        )
        return 0
    finally:
        catalog.stop()
        broker.stop()
        shutil.rmtree(pg, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
