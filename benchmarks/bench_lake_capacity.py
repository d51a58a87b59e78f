"""Capacity model of a lake's catalog: N members' commit pattern against one PostgreSQL, no Kafka.

Each member is a process with a LakeStore of its own (as `flightrec materialize` members are) that claims one shard
and commits Deltas folded beforehand from generated events: a log-only commit of ``--lines`` lines from
``--instances`` instances, and every ``--derive-every``-th commit a lifecycle event per instance (so `instances` and
`failures` are recomputed, as a stage starting or ending does). Open loop by default: each member commits once every
``--window`` s (the materializer's batch window, as a member fed a steady trickle does), so N members offer N/window
commits/s; where the catalog and the cores stop keeping up, commits fall behind their due time and the commit time
(due -> done) grows. ``--window 0``: closed loop, each member back to back (the most it can do).

Per N it prints: commits/s offered and done, lines/s (all members), commit time p50/p99, conflicts retried, the
CPU-seconds per commit of a member and of the catalog, and the catalog's transactions per commit (PostgreSQL's
processes, read from /proc; `pg_stat_database`). docs/lake.md turns these into instances per catalog. Run:
    PYTHONSAFEPATH=1 .venv/bin/python benchmarks/bench_lake_capacity.py \\
        [--members 1,2,4,6] [--seconds 20] [--window 0.5]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench_materialize's helpers (PYTHONSAFEPATH=1)
import record  # noqa: E402 - benchmarks/ on the path first
from bench_materialize import batch, pct
from flightrec.catalog import LocalCatalog
from flightrec.db import lake as lakes
from flightrec.db.fold import LOG_APPEND_TIME, RawMessage, fold
from flightrec.schemas import Lifecycle, encode

from flightrec.localservice import free_port
from flightrec.settings import Settings

CLK_TCK = os.sysconf("SC_CLK_TCK")


def deltas(shard: int, commits: int, lines: int, instances: int, derive_every: int) -> list:
    """The member's commits, folded beforehand (the fold's CPU is not the catalog's): one Delta per commit."""
    out = []
    offset = 0
    per = max(1, lines // instances)
    boots = {i: f"boot-{uuid.uuid4().hex[:8]}" for i in range(instances)}
    seqs = dict.fromkeys(range(instances), 0)
    first = dict.fromkeys(range(instances), 1)
    for c in range(commits):
        msgs = []
        now_ms = time.time_ns() // 1_000_000
        for i in range(instances):
            inst = f"cap-{shard}-{i}"
            if derive_every and c % derive_every == 0:
                ev = Lifecycle(
                    event_id=str(uuid.uuid4()),
                    instance_id=inst,
                    boot_id=boots[i],
                    seq=seqs[i],
                    ts_us=time.time_ns() // 1000,
                    stage=f"stage-{c}",
                    state="started",
                )
                seqs[i] += 1
                msgs.append(RawMessage(ev.topic, shard, offset, inst.encode(), encode(ev), now_ms, LOG_APPEND_TIME, ()))
                offset += 1
            ev = batch(inst, boots[i], seqs[i], per, first[i])
            seqs[i] += 1
            first[i] += per
            msgs.append(RawMessage(ev.topic, shard, offset, inst.encode(), encode(ev), now_ms, LOG_APPEND_TIME, ()))
            offset += 1
        out.append(fold(msgs))
    return out


def member(args: argparse.Namespace) -> int:
    """One member: open the lake, claim its shard, fold its commits, wait for the start, commit until the end."""
    from flightrec.db.lakestore import LakeStore

    loc = lakes.parse_db(args.db, args.data)
    store = LakeStore(loc, "capacity", shards=[args.shard], owner=f"member-{args.shard}")
    store.claim([args.shard])
    todo = deltas(args.shard, args.max_commits, args.lines, args.instances, args.derive_every)
    Path(args.out).with_suffix(".ready").touch()
    start_file = Path(args.start_file)
    while not start_file.exists() or not start_file.read_text():  # written once every member is ready
        time.sleep(0.01)
    start = float(start_file.read_text())
    while time.time() < start:
        time.sleep(0.005)
    times, lines, conflicts = [], 0, 0
    cpu0 = _cpu_s()
    for k, delta in enumerate(todo):
        due = start + k * args.window  # open loop: a commit every window (closed loop when the window is 0)
        if due >= start + args.seconds or time.time() >= start + args.seconds:
            break
        while time.time() < due:
            time.sleep(min(0.005, due - time.time()) if due > time.time() else 0)
        t = time.perf_counter()
        late = max(0.0, time.time() - due) if args.window else 0.0  # how long the commit waited for the one before
        stats = store.commit({args.shard: delta})
        times.append(late + time.perf_counter() - t)
        lines += stats.lines_written
        conflicts += stats.conflicts_retried
    cpu = _cpu_s() - cpu0
    store.close()
    Path(args.out).write_text(json.dumps({"times": times, "lines": lines, "conflicts": conflicts, "cpu": cpu}))
    return 0


def _cpu_s() -> float:
    """This process's CPU-seconds so far (its threads too: DuckDB's)."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def catalog_cpu_s(postmaster: int) -> float:
    """CPU-seconds (user + system) of the PostgreSQL server, its live backends and those that exited, so far."""
    total = 0
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        pid, ppid = int(d.name), int(fields[1])
        if pid == postmaster:  # its own time and that of the backends it reaped (exited ones)
            total += int(fields[11]) + int(fields[12]) + int(fields[13]) + int(fields[14])
        elif ppid == postmaster:
            total += int(fields[11]) + int(fields[12])
    return total / CLK_TCK


def xacts(catalog: LocalCatalog, name: str) -> int:
    out = catalog.psql(f"SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = '{name}'")
    return int(out.strip().splitlines()[-1].strip())


def run(catalog: LocalCatalog, work: Path, n: int, args: argparse.Namespace) -> dict:
    name = f"cap_{n}_{uuid.uuid4().hex[:6]}"
    db = catalog.create_database(name)
    data = work / name
    # the lake's tables made once, before the members start (as the first member of a group makes them)
    from flightrec.db.lakestore import ALIAS, LakeStore

    setup = LakeStore(lakes.parse_db(db, str(data)), "capacity", shards=range(n))
    if args.inlining is not None:  # inserts of fewer rows go into the catalog, not Parquet files: set per table
        # (persisted in the catalog); DuckLake's set_option for a schema or the whole lake crashed DuckDB 1.5.5 on a
        # lake with views (docs/lake.md), and the DuckDB setting applies only to lakes attached after it
        tables = setup.con.execute(
            f"SELECT schema_name, table_name FROM duckdb_tables() WHERE database_name = '{ALIAS}'"
        ).fetchall()
        for schema, table in tables:
            setup.con.execute(
                f"CALL {ALIAS}.set_option('data_inlining_row_limit', {int(args.inlining)}, "
                f"schema => '{schema}', table_name => '{table}')"
            )
    setup.close()
    outs = [work / f"{name}-{s}.json" for s in range(n)]
    start_file = work / f"{name}.start"
    procs = []
    for s in range(n):
        cmd = [sys.executable, __file__, "--member", "--db", db, "--data", str(data), "--shard", str(s)]
        cmd += ["--out", str(outs[s]), "--start-file", str(start_file), "--seconds", str(args.seconds)]
        cmd += ["--lines", str(args.lines), "--instances", str(args.instances)]
        cmd += ["--derive-every", str(args.derive_every), "--max-commits", str(args.max_commits)]
        cmd += ["--window", str(args.window)]
        procs.append(subprocess.Popen(cmd, env={**os.environ, "FLIGHTREC_LOG_LEVEL": "WARNING"}))
    deadline = time.monotonic() + 600
    while not all(o.with_suffix(".ready").exists() for o in outs):
        if any(p.poll() not in (None, 0) for p in procs) or time.monotonic() > deadline:
            raise SystemExit(f"a member of {n} failed to start")
        time.sleep(0.1)
    start = time.time() + 1.0
    tmp = start_file.with_suffix(".tmp")
    tmp.write_text(str(start))
    tmp.rename(start_file)  # whole, at once
    pm = catalog.running_pid() or 0
    while time.time() < start:
        time.sleep(0.005)
    cpu0, x0 = catalog_cpu_s(pm), xacts(catalog, name)
    time.sleep(args.seconds)
    cpu1, x1 = catalog_cpu_s(pm), xacts(catalog, name)
    for p in procs:
        if p.wait(timeout=600) != 0:
            raise SystemExit(f"a member of {n} failed")
    results = [json.loads(o.read_text()) for o in outs]
    times = [t for r in results for t in r["times"]]
    commits = len(times)
    files = sum(1 for _ in data.rglob("*.parquet"))
    catalog.drop_database(name)
    shutil.rmtree(data, ignore_errors=True)
    return {
        "members": n,
        "commits_s": commits / args.seconds,
        "lines_s": sum(r["lines"] for r in results) / args.seconds,
        "p50": pct(times, 0.5),
        "p99": pct(times, 0.99),
        "conflicts": sum(r["conflicts"] for r in results),
        "cpu_per_commit_ms": (cpu1 - cpu0) / max(commits, 1) * 1000,
        "member_cpu_per_commit_ms": sum(r["cpu"] for r in results) / max(commits, 1) * 1000,
        "offered": n / args.window if args.window else None,
        "catalog_cores": (cpu1 - cpu0) / args.seconds,
        "xacts_per_commit": (x1 - x0) / max(commits, 1),
        "files_per_commit": files / max(commits, 1),
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--members", default="1,2,4,6", help="member counts to measure, comma-separated")
    ap.add_argument("--seconds", type=float, default=20.0, help="the measured window per member count")
    ap.add_argument(
        "--window",
        type=float,
        default=0.5,
        help="each member commits every WINDOW s (the materializer's batch window); 0: closed loop, back to back",
    )
    ap.add_argument("--lines", type=int, default=500, help="log lines per commit")
    ap.add_argument("--instances", type=int, default=10, help="instances per member (one LogBatch each per commit)")
    ap.add_argument("--derive-every", type=int, default=10, help="every Nth commit has a lifecycle event per instance")
    ap.add_argument(
        "--inlining", type=int, help="DuckLake's data_inlining_row_limit for the lake (default: DuckLake's, 10 rows)"
    )
    ap.add_argument("--max-commits", type=int, default=600, help="commits folded beforehand per member")
    ap.add_argument("--member", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--db", help=argparse.SUPPRESS)
    ap.add_argument("--data", help=argparse.SUPPRESS)
    ap.add_argument("--shard", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    ap.add_argument("--start-file", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.member:
        return member(args)
    work = Path(tempfile.mkdtemp(prefix="bench-lake-capacity-"))
    pg = Path(tempfile.mkdtemp(prefix="flightrec-catalog-bench-"))
    pg.chmod(0o711)  # PostgreSQL runs as `postgres` under root: it must reach its folder
    catalog = LocalCatalog(port=free_port(), data=pg / "c", settings=Settings.from_env({}))
    catalog.start()
    try:
        rows = [run(catalog, work, int(n), args) for n in args.members.split(",")]
        print(f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at the end")
        loop = f"a commit every {args.window:g} s per member" if args.window else "closed loop (back to back)"
        print(
            f"commit pattern: {args.lines} lines from {args.instances} instances a commit, a lifecycle event per "
            f"instance every {args.derive_every}th commit; {loop}; {args.seconds:g} s per member count; "
            f"inlining limit {'DuckLake default' if args.inlining is None else args.inlining}"
        )
        print(
            "members  offered/s  commits/s  lines/s   commit p50    p99  conflicts  CPU/commit: member  catalog  "
            "catalog cores  xacts/commit  Parquet files/commit"
        )
        for r in rows:
            offered = f"{r['offered']:>9.1f}" if r["offered"] else f"{'max':>9}"
            print(
                f"{r['members']:>7}  {offered}  {r['commits_s']:>9.1f}  {r['lines_s']:>7,.0f}  "
                f"{r['p50'] * 1000:>7.0f} ms {r['p99'] * 1000:>6.0f} ms  {r['conflicts']:>9}  "
                f"{r['member_cpu_per_commit_ms']:>15.0f} ms {r['cpu_per_commit_ms']:>5.1f} ms  "
                f"{r['catalog_cores']:>13.2f}  {r['xacts_per_commit']:>12.1f}  {r['files_per_commit']:>20.1f}"
            )
        print(
            "commit time: from when the commit was due (open loop: a commit waits for the member's one before it) "
            "to its end; catalog: PostgreSQL's processes (/proc), its transactions from pg_stat_database"
        )
        _record(rows, loop, args)
        return 0
    finally:
        catalog.stop()
        shutil.rmtree(pg, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)


def _record(rows: list[dict], loop: str, args: argparse.Namespace) -> None:
    def row(r: dict) -> str:
        offered = f"{r['offered']:.1f}" if r["offered"] else "max"
        return (
            f"{offered} / {r['commits_s']:.1f}; {r['p50'] * 1000:,.0f} / {r['p99'] * 1000:,.0f} ms; "
            f"{r['member_cpu_per_commit_ms']:.0f} / {r['cpu_per_commit_ms']:.1f} ms"
        )

    first = rows[0]
    record.write(
        "bench_lake_capacity",
        "Capacity of one catalog",
        f"Own PostgreSQL, no Kafka; each member a process with its own LakeStore and shard, committing Deltas folded "
        f"beforehand ({args.lines} lines from {args.instances} instances, {loop}); {args.seconds:g} s per member "
        "count; commit time from due to done. Each row: commits/s offered / done; commit p50 / p99; CPU per commit, "
        f"member / catalog. The baseline: {first['members']} member(s) in the same run. The model: docs/lake.md.",
        [
            record.Figure(
                f"{r['members']} member(s)",
                row(r),
                "(the baseline)" if r is first else f"{first['members']}: {row(first)}",
                f"catalog {r['catalog_cores']:.2f} cores, {r['xacts_per_commit']:.1f} transactions a commit, "
                f"{r['conflicts']} conflicts",
            )
            for r in rows
        ],
    )


if __name__ == "__main__":
    sys.exit(main())
