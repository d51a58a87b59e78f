"""Benchmark of the lake writer: lines/s into a DuckLake with 1 and 2 group members vs a file on the same topics,
what each costs in CPU (the members, the catalog, the broker), the same with each member pinned to a core of its own
(broker and catalog niced), and Kafka-ack -> visible latency for a lake reader.

Starts its own Kafka and PostgreSQL (free ports, temp folders) and stops them. Run:
    PYTHONSAFEPATH=1 .venv/bin/python benchmarks/bench_lake.py [--lines 200000] [--runs 3] [--no-pinned]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
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
import contextlib

import record  # noqa: E402 - benchmarks/ on the path first
from bench_lake_capacity import CLK_TCK, catalog_cpu_s
from bench_materialize import BATCH, FAIL_EVERY, env_for, flightrec_cmd, pct, probe_latency, produce_backlog
from flightrec.broker import LocalBroker
from flightrec.catalog import LocalCatalog
from flightrec.db import lake as lakes

from flightrec.localservice import free_port
from flightrec.settings import Settings


def file_run(bootstrap: str, work: Path, n: int) -> tuple[float, float, float]:
    """(lines/s, CPU-seconds per million lines, peak RSS MiB) of `flightrec materialize` into a new file (its own run
    time: open -> last commit; its CPU from start to exit)."""
    db = work / f"file-{n}.duckdb"
    proc = subprocess.Popen(
        flightrec_cmd("materialize", "--db", str(db), "--until-idle", "2", "--no-serve"),
        env=env_for(bootstrap),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    _, status, usage = os.wait4(proc.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"flightrec materialize into {db} failed ({status})")
    con = duckdb.connect(str(db), read_only=True)
    try:
        lines, run_s = con.execute("""SELECT (SELECT count(*) FROM log_lines),
            (SELECT (max(last_commit_us) - min(started_us)) / 1e6 FROM materializer_runs)""").fetchone()
    finally:
        con.close()
    return lines / run_s, (usage.ru_utime + usage.ru_stime) / lines * 1e6, usage.ru_maxrss / 1024


@dataclasses.dataclass
class LakeRun:
    """One run of ``members`` processes of one group into a new lake: rate, wall, and what it cost in CPU."""

    rate: float  # lines/s over the members' own run time: the first member's open to the last member's last commit
    wall: float  # seconds, start and group join included
    conflicts: int
    lines: int
    commits: int
    member_cpu: float  # CPU-seconds of all members (user + system, their DuckDB threads included)
    catalog_cpu: float  # CPU-seconds of PostgreSQL meanwhile
    broker_cpu: float  # CPU-seconds of the Kafka broker meanwhile
    peak_rss_mib: float  # the largest member's peak resident memory


def proc_cpu_s(pid: int | None) -> float:
    """CPU-seconds (user + system) of one running process and its threads so far; 0 when it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, TypeError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def renice_all_threads(pid: int | None, niceness: int) -> None:
    """Set the niceness of every thread of ``pid`` (Linux nices threads, and the JVM's work runs in its own)."""
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, int(task.name), niceness)


def _pinned(cores: set[int] | None):  # noqa: ANN202 - a preexec_fn
    return None if cores is None else (lambda: os.sched_setaffinity(0, cores))


def lake_run(
    bootstrap: str,
    catalog: LocalCatalog,
    broker: LocalBroker,
    work: Path,
    members: int,
    n: int,
    pins: list[set[int]] | None = None,
) -> LakeRun:
    """``members`` processes of one group into a new lake (``pins``: the cores of each member)."""
    name = f"bench_{members}_{n}_{uuid.uuid4().hex[:6]}"
    db = catalog.create_database(name)
    data = work / name
    group = f"bench-{name}"
    pm, bpid = catalog.running_pid() or 0, broker.running_pid()
    cat0, broker0 = catalog_cpu_s(pm), proc_cpu_s(bpid)
    t0 = time.perf_counter()
    procs = []
    with contextlib.ExitStack() as stack:  # the members' stderr, read once each has exited
        for k in range(members):
            err = stack.enter_context(tempfile.TemporaryFile(dir=work))
            procs.append(
                (
                    subprocess.Popen(
                        flightrec_cmd(
                            "materialize", "--db", db, "--data-path", str(data), "--group", group, "--until-idle", "3"
                        ),
                        env=env_for(bootstrap),
                        stdout=subprocess.DEVNULL,
                        stderr=err,
                        preexec_fn=_pinned(pins[k] if pins else None),
                    ),
                    err,
                )
            )
        conflicts, member_cpu, rss = 0, 0.0, 0.0
        for p, err in procs:
            _, status, usage = os.wait4(p.pid, 0)  # its own CPU: rusage of this child
            p.returncode = os.waitstatus_to_exitcode(status)
            member_cpu += usage.ru_utime + usage.ru_stime
            rss = max(rss, usage.ru_maxrss / 1024)
            err.seek(0)
            text = err.read().decode(errors="replace")
            err.close()
            if p.returncode != 0:
                raise SystemExit(f"a lake member failed:\n{text[-3000:]}")
            conflicts += int(text.rsplit("conflicts_retried=", 1)[1].split()[0]) if "conflicts_retried=" in text else 0
    wall = time.perf_counter() - t0
    catalog_cpu, broker_cpu = catalog_cpu_s(pm) - cat0, proc_cpu_s(bpid) - broker0
    con = lakes.connect(lakes.parse_db(db, str(data)))
    try:
        lines, run_s, commits = con.execute("""SELECT (SELECT count(*) FROM log_lines),
            (SELECT (max(last_commit_us) - min(started_us)) / 1e6 FROM materializer_runs WHERE commits > 0),
            (SELECT sum(commits) FROM materializer_runs)""").fetchone()
    finally:
        con.close()
    catalog.drop_database(name)
    shutil.rmtree(data, ignore_errors=True)
    return LakeRun(lines / run_s, wall, conflicts, lines, int(commits), member_cpu, catalog_cpu, broker_cpu, rss)


PINNED_NICE = 10  # the broker's and the catalog's niceness while members run pinned: the members' cores are theirs


def nice_services(broker: LocalBroker, catalog: LocalCatalog, niceness: int) -> None:
    """Set the niceness of the broker's threads and of PostgreSQL's processes (the server and its backends)."""
    renice_all_threads(broker.running_pid(), niceness)
    pm = catalog.running_pid()
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            if int(d.name) == pm or ppid == pm:
                renice_all_threads(int(d.name), niceness)


def cpu_summary(runs: list[LakeRun]) -> str:
    """What a configuration's runs cost in CPU (medians): the members per million lines, the catalog per commit."""
    per_m = statistics.median(r.member_cpu / r.lines * 1e6 for r in runs)
    cores = statistics.median(r.member_cpu / r.wall for r in runs)
    catalog = statistics.median(r.catalog_cpu / max(r.commits, 1) * 1000 for r in runs)
    broker = statistics.median(r.broker_cpu / r.lines * 1e6 for r in runs)
    commits = statistics.median(r.commits for r in runs)
    return (
        f"CPU: members {per_m:.2f} s per million lines ({cores:.2f} cores busy over the wall), catalog "
        f"{catalog:.1f} ms per commit ({commits:.0f} commits), broker {broker:.2f} s per million lines; "
        f"a member's peak RSS {max(r.peak_rss_mib for r in runs):.0f} MiB"
    )


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
    ap.add_argument(
        "--no-pinned",
        dest="pinned",
        action="store_false",
        help="skip the runs with each member pinned to a core of its own (broker and catalog niced)",
    )
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
        kinds = ["lake1", "lake2"] + (["pinned1", "pinned2"] if args.pinned else [])
        files: list[float] = []
        file_cpu: list[float] = []
        file_rss: list[float] = []
        runs: dict[str, list[LakeRun]] = {k: [] for k in kinds}
        for n in range(args.runs):  # interleaved, so a slow spell of the machine hits all of them alike
            rate, cpu, rss = file_run(broker.bootstrap, work, n)
            files.append(rate)
            file_cpu.append(cpu)
            file_rss.append(rss)
            for members in (1, 2):
                runs[f"lake{members}"].append(lake_run(broker.bootstrap, catalog, broker, work, members, n))
            if args.pinned:
                nice_services(broker, catalog, PINNED_NICE)
                try:
                    for members in (1, 2):
                        pins = [{k % (os.cpu_count() or 1)} for k in range(members)]
                        runs[f"pinned{members}"].append(
                            lake_run(broker.bootstrap, catalog, broker, work, members, n, pins)
                        )
                finally:
                    nice_services(broker, catalog, 0)
        med = {k: statistics.median(r.rate for r in v) for k, v in runs.items()}
        med["file"] = statistics.median(files)
        print(f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at the end")
        print(
            f"backlog: {sent:,} lines (+ ~{int(20 * 0.1 * BATCH * 2 * 10):,} latency-phase lines) in "
            f"{BATCH}-line batches of 20 instances; medians of {args.runs} runs"
        )
        print(f"file (embedded, 1 process): {med['file']:,.0f} lines/s  runs {[round(r) for r in files]}")
        print(
            f"    CPU: {statistics.median(file_cpu):.2f} s per million lines; peak RSS {max(file_rss):.0f} MiB "
            f"(batches of {16 << 20 >> 20} MiB)"
        )
        for k in kinds:
            m = int(k[-1])
            what = (
                f"lake, {m} member{'s' if m > 1 else ''}"
                if k.startswith("lake")
                else f"lake, {m} member{'s' if m > 1 else ''} pinned to {'a core each' if m > 1 else 'one core'}, "
                f"broker and catalog at nice {PINNED_NICE}"
            )
            print(
                f"{what}: {med[k]:,.0f} lines/s (run: first open -> last commit), wall incl. start and group join "
                f"{statistics.median(r.wall for r in runs[k]):.1f}s  runs {[round(r.rate) for r in runs[k]]}"
            )
            print("    " + cpu_summary(runs[k]))
        ratios = (
            f"ratios: lake 1 member / file {med['lake1'] / med['file']:.2f}; lake 2 members / 1 member "
            f"{med['lake2'] / med['lake1']:.2f}"
        )
        if args.pinned:
            ratios += f"; pinned, 2 members on two cores / 1 member on one {med['pinned2'] / med['pinned1']:.2f}"
        conflicts = sum(r.conflicts for v in runs.values() for r in v)
        print(f"{ratios}; conflicts retried in all lake runs: {conflicts}")
        print(
            f"Kafka ack -> visible to a lake reader, {len(lat)} probes under ~10k lines/s: p50 {pct(lat, 0.5):.2f}s "
            f"p99 {pct(lat, 0.99):.2f}s max {max(lat):.2f}s (goal p99 <= 1.5 s)"
        )
        print(
            f"exit of a failing stage -> its failures row visible to a lake reader, {len(fail_lat)} probes, a failing "
            f"stage every {FAIL_EVERY / 10:g} s: p50 {pct(fail_lat, 0.5):.2f}s p99 {pct(fail_lat, 0.99):.2f}s "
            f"max {max(fail_lat):.2f}s; the lines meanwhile: p50 {pct(lat_f, 0.5):.2f}s p99 {pct(lat_f, 0.99):.2f}s"
        )
        file = FileRuns(med["file"], statistics.median(file_cpu), max(file_rss))
        _record(sent, args.runs, file, med, runs, (lat, lat_f, fail_lat))
        return 0
    finally:
        catalog.stop()
        broker.stop()
        shutil.rmtree(pg, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)


@dataclasses.dataclass(frozen=True)
class FileRuns:
    """The file's runs of the same backlog (the baseline): median rate, CPU s per million lines, peak RSS."""

    rate: float
    cpu: float
    rss: float


def _record(
    sent: int,
    n: int,
    file: FileRuns,
    med: dict[str, float],
    runs: dict[str, list[LakeRun]],
    latencies: tuple[list[float], list[float], list[float]],
) -> None:
    lat, lat_f, fail_lat = latencies
    one = runs["lake1"]
    figures = [
        record.Figure(
            "lines/s, a lake, 1 member",
            f"{med['lake1']:,.0f}",
            f"the file: {file.rate:,.0f}",
            f"{med['lake1'] / file.rate:.2f} (#26 goal 0.6)",
        ),
        record.Figure(
            "lines/s, 2 members of one group",
            f"{med['lake2']:,.0f}",
            f"1 member: {med['lake1']:,.0f}",
            f"{med['lake2'] / med['lake1']:.2f}",
        ),
    ]
    if "pinned1" in med:
        figures.append(
            record.Figure(
                "lines/s, 2 members pinned to a core each",
                f"{med['pinned2']:,.0f}",
                f"1 member pinned: {med['pinned1']:,.0f}",
                f"{med['pinned2'] / med['pinned1']:.2f} (#26: above 1)",
            )
        )
    figures += [
        record.Figure(
            "CPU of a member, s per million lines (start included)",
            f"{statistics.median(r.member_cpu / r.lines * 1e6 for r in one):.2f}",
            f"the file's process: {file.cpu:.2f}",
        ),
        record.Figure(
            "CPU of the catalog per commit",
            f"{statistics.median(r.catalog_cpu / max(r.commits, 1) * 1000 for r in one):.0f} ms",
            note=f"{statistics.median(r.commits for r in one):.0f} commits",
        ),
        record.Figure(
            "peak RSS of a member",
            f"{max(r.peak_rss_mib for r in one):.0f} MiB",
            f"the file's process: {file.rss:.0f} MiB",
        ),
        record.Figure("transaction conflicts retried", str(sum(r.conflicts for v in runs.values() for r in v))),
        record.Figure(
            f"Kafka ack -> visible to a lake reader, lines only, {len(lat)} probes",
            f"p50 {pct(lat, 0.5):.2f} s, p99 {pct(lat, 0.99):.2f} s",
            note="#26 goal p99 <= 1.5 s",
        ),
        record.Figure(
            "with a failing stage every 0.5 s: lines p99; exit -> `failures` row p99",
            f"{pct(lat_f, 0.99):.2f} s; {pct(fail_lat, 0.99):.2f} s",
        ),
    ]
    record.write(
        "bench_lake",
        "The lake",
        f"Own Kafka and PostgreSQL; a backlog of {sent:,} lines in LogBatches of {BATCH} lines (20 instances, 6 "
        "partitions) read into a new file / a new lake per run, interleaved, medians of "
        f"{n}; two latency phases (~10k lines/s; the second adds a failing stage every 0.5 s). The baseline: the file, "
        "or one member, in the same run.",
        figures,
    )


if __name__ == "__main__":
    sys.exit(main())
