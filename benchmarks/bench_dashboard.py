"""Dashboard benchmark: page render times and SQL-console example times on 10,000 instances and 10M log lines, on
a file and on a lake holding the same rows.

Run with `make bench` (or `PYTHONSAFEPATH=1 .venv/bin/python benchmarks/bench_dashboard.py [--store
file|lake|snapshot]`; `snapshot`: a copy of the file held by a materializer's store in a process of its own, the
pages reading the snapshot it publishes, as they do while a materializer runs).
The database is generated with DuckDB SQL straight into the schema.sql tables and cached under
.cache/bench_dashboard/ between runs; the lake (its own PostgreSQL catalog, started and stopped here) gets the same
rows laid out in six shards as materializers write them (LakeStore.load_file). Each page is rendered with
Streamlit's AppTest: cold with the query cache cleared (and, on a lake, the process's reader dropped: the first page
a new dashboard shows), then again once the refresh period has passed (what the running page does by itself). The
baseline, measured in the same run, is a trivial one-line Streamlit script rendered the same way. Goals: every page
<= 1 s on a file (issue 5); on a lake <= 1.5 s cold and <= 0.5 s on refresh, `flightrec sql` <= 2x the file's
(issue 26).
"""

from __future__ import annotations

import argparse
import importlib.resources
import logging
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
import warnings
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import duckdb
from flightrec.db import migrate

sys.path.insert(0, str(Path(__file__).resolve().parent))
import record  # noqa: E402 - benchmarks/ on the path first

ROOT = Path(__file__).resolve().parents[1]
CACHE = ROOT / ".cache" / "bench_dashboard"
INSTANCES = 10_000
LINES = 10_000_000
DB = CACHE / f"fleet-{INSTANCES}-{LINES}.duckdb"
RUNS = 5
PAGE_GOAL_S = 1.0
LAKE_COLD_GOAL_S, LAKE_REFRESH_GOAL_S = 1.5, 0.5  # issue #26
SHARDS = 6  # the lake's shards: the topics' partitions (FLIGHTREC_PARTITIONS' default)
CONSOLE_GOAL_S = 0.2
NO_KERNEL = "CUDA error: no kernel image is available for execution on the device"

# a failure's last lines (failures.last_lines): its stage's stdout and the daemon's log, as the materializer keeps them
LAST_LINES = (
    "[{{'seq': 5, 'line_no': 1, 'source': 'stdout', 'text': 'warm-up proof 1/3'}}, "
    "{{'seq': 6, 'line_no': 1, 'source': '/var/log/prover/daemon.log', 'text': 'daemon: starting'}}, "
    "{{'seq': 6, 'line_no': 2, 'source': '/var/log/prover/daemon.log', 'text': coalesce({line}, 'daemon: ok')}}]"
)

GENERATE = f"""
CREATE TEMP TABLE models AS SELECT * FROM (VALUES
    (0, 'NVIDIA H100 80GB HBM3', '9.0', 2.49, 1500.0),
    (1, 'NVIDIA A100-SXM4-80GB', '8.0', 1.29, 900.0),
    (2, 'NVIDIA GeForce RTX 4090', '8.9', 0.59, 800.0),
    (3, 'NVIDIA GeForce RTX 5090', '12.0', 0.89, 1100.0),
    (4, 'NVIDIA L40S', '8.9', 0.99, 700.0),
    (5, 'NVIDIA RTX A6000', '8.6', 0.69, 500.0)) m(m, gpu_model, cc, price, base_rate);
CREATE TEMP TABLE classes AS SELECT * FROM (VALUES
    (0, 'gpu_arch_unsupported', '{NO_KERNEL}'),
    (1, 'cuda_out_of_memory', 'CUDA error: out of memory'),
    (2, 'below_min_rate', NULL),
    (3, 'daemon_crashed', 'Segmentation fault (core dumped)'),
    (4, 'params_download_failed', 'curl: (28) Operation timed out')) c(cls, failure_class, line);
CREATE TEMP TABLE inst AS
SELECT i, 'inst-' || lpad(CAST(i AS VARCHAR), 5, '0') AS instance_id, m.*,
       1748779200000000 + i * 30000000 AS t0,
       (hash(i) % 100) < 15 AS failed, hash(i * 7) % 5 AS c,
       m.base_rate * (0.6 + (hash(i * 13) % 1000) / 1000.0 * 0.8) AS rate
FROM range({INSTANCES}) r(i) JOIN models m ON m.m = i % 6;

INSERT INTO instances BY NAME
SELECT instance_id, 'boot-' || i AS boot_id,
       CASE WHEN failed THEN 'benchmark' ELSE 'supervisor' END AS stage,
       CASE WHEN failed THEN 'failed' ELSE 'started' END AS state,
       gpu_model, 1 AS gpu_count, 81920 AS gpu_memory_mib, '570.86' AS driver_version, '12.8' AS cuda_version,
       cc AS compute_capability, 'host-' || i AS host, price AS price_per_hour,
       t0 AS first_event_us, t0 + 1000 * 1000000 AS last_event_us,
       CASE WHEN failed AND c = 2 THEN 0.5 * rate WHEN failed THEN NULL ELSE rate END AS proofs_per_hour,
       500.0 AS min_rate,
       CASE WHEN failed AND c = 2 THEN 'fail' WHEN failed THEN 'error' ELSE 'pass' END AS verdict,
       CASE WHEN failed THEN 1 ELSE 0 END AS failures, 1010 AS events, failed AS sealed, failed AS complete,
       CASE WHEN failed THEN NULL ELSE 'not sealed' END AS incomplete_reason
FROM inst;

INSERT INTO lifecycle_events BY NAME
SELECT instance_id || '-lc-' || s.n AS event_id, instance_id, 'boot-' || i AS boot_id, s.n AS seq,
       t0 + s.n * 100000000 AS ts_us, 'lifecycle' AS kind, s.stage,
       CASE WHEN failed AND s.stage = 'benchmark' AND s.state = 'succeeded' THEN 'failed' ELSE s.state END AS state,
       '' AS detail
FROM inst, (SELECT (row_number() OVER () - 1) AS n, stage, state FROM (
    SELECT unnest(['tunnel','tunnel','register','register','fetch_params','fetch_params','benchmark','benchmark',
                   'supervisor']) AS stage,
           unnest(['started','succeeded','started','succeeded','started','succeeded','started','succeeded',
                   'started']) AS state)) s
WHERE NOT (failed AND s.stage = 'supervisor');

INSERT INTO log_lines BY NAME
SELECT instance_id, 'boot-' || i AS boot_id, instance_id || '-log-' || (line_no // 100) AS event_id,
       100 + line_no // 100 AS seq,
       CASE WHEN line_no < 50 THEN 'tunnel' WHEN line_no < 100 THEN 'register' WHEN line_no < 300 THEN 'fetch_params'
            WHEN line_no < 600 THEN 'benchmark' ELSE 'supervisor' END AS stage,
       CASE WHEN line_no BETWEEN 300 AND 599 AND line_no % 3 = 0 THEN '/var/log/prover/daemon.log'
            WHEN line_no % 7 = 0 THEN 'stderr' ELSE 'stdout' END AS source,
       4242 AS pid, line_no, t0 + line_no * 1000000 AS ts_us,
       CASE WHEN failed AND c = 0 AND line_no = 597 THEN '{NO_KERNEL}'
            ELSE 'proof ' || line_no || ' done in ' || (hash(n) % 997) || ' ms, root '
                 || lpad(CAST(hash(n) % 65536 AS VARCHAR), 5, '0')
       END AS text,
       false AS truncated, false AS invalid_utf8
FROM (SELECT n, n % {INSTANCES} AS i, n // {INSTANCES} AS line_no FROM range({LINES}) r(n)) g
JOIN inst USING (i);

INSERT INTO process_exits BY NAME
SELECT instance_id || '-exit' AS event_id, instance_id, 'boot-' || i AS boot_id, 1000 AS seq,
       t0 + 600 * 1000000 AS ts_us, 'benchmark' AS stage, ['bench.sh', '--min-rate', '500'] AS argv, 4242 AS pid,
       CASE WHEN failed AND c <> 2 THEN 1 ELSE 0 END AS exit_code, t0 + 300 * 1000000 AS started_us,
       t0 + 600 * 1000000 AS ended_us, 300.0 AS duration_s, false AS timed_out,
       ['benchmark exited with error'] AS stderr_tail, ['warm-up proof 1/3', 'warm-up proof 2/3'] AS stdout_tail,
       [{{'path': '/var/log/prover/daemon.log', 'lines': ['daemon: starting', coalesce(cl.line, 'daemon: ok')],
          'exists': true}}] AS file_tails
FROM inst LEFT JOIN classes cl ON cl.cls = inst.c;

INSERT INTO throughput BY NAME
SELECT instance_id || '-tp-' || k AS event_id, instance_id, 'boot-' || i AS boot_id, 900 + k AS seq,
       t0 + (400 + k * 40) * 1000000 AS ts_us, 'sample' AS kind, 'benchmark' AS stage, 'cuda' AS backend,
       gpu_model AS device, CASE WHEN k = 0 THEN 'warmup' ELSE 'measured' END AS phase, 1 AS proofs,
       3600.0 / rate AS seconds, rate * (0.95 + k * 0.02) AS proofs_per_hour
FROM inst, range(5) r(k) WHERE NOT failed OR c = 2;

INSERT INTO failures BY NAME
SELECT instance_id || '-exit' AS failure_id, instance_id, 'boot-' || i AS boot_id, 'benchmark' AS stage,
       t0 + 600 * 1000000 AS ts_us, CASE WHEN c = 2 THEN 0 ELSE 1 END AS exit_code,
       CASE WHEN c = 3 THEN 11 END AS signal, CASE WHEN c = 3 THEN 'SIGSEGV' END AS signal_name,
       'benchmark exited with error' AS detail, ['benchmark exited with error'] AS stderr_tail,
       ['warm-up proof 1/3'] AS stdout_tail,
       [{{'path': '/var/log/prover/daemon.log', 'lines': ['daemon: starting', coalesce(cl.line, 'daemon: ok')],
          'exists': true}}] AS file_tails,
       ['fetch_params succeeded', 'benchmark started', 'benchmark failed'] AS preceding_events,
       gpu_model, cc AS compute_capability, '570.86' AS driver_version, '12.8' AS cuda_version,
       CASE WHEN c = 2 THEN 0.5 * rate END AS proofs_per_hour, 500.0 AS min_rate, cl.failure_class,
       'hint for ' || cl.failure_class AS hint, cl.line AS matched_line,
       {LAST_LINES.format(line="cl.line")} AS last_lines, cl.line AS decisive_line,
       '/var/log/prover/daemon.log' AS decisive_source, 1 AS decisive_line_no, cl.failure_class AS rule_id,
       'bench' AS rules_version
FROM inst JOIN classes cl ON cl.cls = inst.c WHERE failed;
"""


def build_db() -> Path:
    """Generate the benchmark database once (cached under .cache/bench_dashboard/); a cached one gains the tables and
    columns of migrations newer than it (their values as GENERATE gives them)."""
    if DB.exists():
        con = duckdb.connect(str(DB))
        try:
            con.execute(importlib.resources.files("flightrec.db").joinpath("schema.sql").read_text())  # new tables
            con.execute(migrate.columns_sql())
            con.execute(
                f"UPDATE failures SET last_lines = {LAST_LINES.format(line='matched_line')} WHERE last_lines IS NULL"
            )
            con.execute(
                "UPDATE failures SET decisive_line = matched_line, decisive_source = '/var/log/prover/daemon.log', "
                "decisive_line_no = 1, rule_id = failure_class, rules_version = 'bench' WHERE decisive_line IS NULL"
            )
        finally:
            con.close()
        return DB
    CACHE.mkdir(parents=True, exist_ok=True)
    tmp = DB.with_suffix(".tmp")
    tmp.unlink(missing_ok=True)
    schema = importlib.resources.files("flightrec.db").joinpath("schema.sql").read_text()
    started = time.perf_counter()
    con = duckdb.connect(str(tmp))
    try:
        con.execute("SET threads = 2")
        con.execute(schema)
        con.execute(migrate.columns_sql())
        for stmt in duckdb.extract_statements(GENERATE):
            con.execute(stmt)
        con.execute("CHECKPOINT")
    finally:
        con.close()
    tmp.rename(DB)
    print(f"generated {DB} in {time.perf_counter() - started:.0f} s")
    return DB


def held_copy(src: Path, db: Path) -> None:
    """A copy of the generated file a materializer's store can open: its lines accounted for as a run's (a store
    takes lines no run wrote for a cut commit's leftovers, and deletes them)."""
    import shutil

    shutil.copyfile(src, db)
    con = duckdb.connect(str(db))
    try:
        con.execute(
            "INSERT INTO materializer_runs (run_id, mode, lines, commits) "
            "SELECT 'synthetic', 'benchmark', count(*), 0 FROM log_lines"
        )
        con.execute("CHECKPOINT")
    finally:
        con.close()


# A materializer's store holding a file in a process of its own: readers read the snapshot it publishes.
HOLDER = """
import sys, time
from flightrec.db.filestore import FileStore
store = FileStore(sys.argv[1], "bench")
print("holding", flush=True)
sys.stdin.read()
store.close()
"""


def hold(db: Path) -> subprocess.Popen:
    """Start a store holding ``db`` (stdin closed: it lets go); returns once its first snapshot is published."""
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(db)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "holding"
    return proc


def build_lake(file_db: Path, catalog: Any, data: Path, shards: int) -> str:
    """The same data in a new lake on ``catalog``, laid out as materializers write it (LakeStore.load_file);
    returns its --db string."""
    from flightrec.db import lake as lakes
    from flightrec.db.lakestore import LakeStore
    from flightrec.db.views import stored_views

    started = time.perf_counter()
    db = catalog.create_database(f"dash_{uuid.uuid4().hex[:8]}")
    store = LakeStore(lakes.parse_db(db, str(data)), "bench", shards=range(shards), views=stored_views())
    try:
        store.load_file(str(file_db))
    finally:
        store.close()
    print(f"copied {file_db.name} into a lake ({shards} shards) in {time.perf_counter() - started:.0f} s")
    return db


def timed(fn: Callable[[], object], runs: int = RUNS) -> list[float]:
    out = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return out


README_SQL = "SELECT instance_id, stage, failure_class, exit_code, decisive_line, hint FROM failures ORDER BY ts_us"


def measure_pages(db: str, runs: int, failed: tuple[str, str]) -> dict[str, tuple[list[float], list[float]]]:
    """Each page's (cold, refresh) seconds on ``db``: cold is a render with the query cache cleared and, on a lake, the
    process's reader dropped (the first page a new dashboard shows); refresh is the same page rendered again once its
    cached results are older than the refresh period (REFRESH_S), as the running page does by itself."""
    import streamlit as st
    from flightrec.analytics import ENTRY_SCRIPT
    from flightrec.analytics.ui import REFRESH_S
    from flightrec.db import lake as lakes
    from streamlit.testing.v1 import AppTest

    os.environ["FLIGHTREC_DB"] = db

    def render(page: str | None, **params: str) -> tuple[float, float]:
        at = AppTest.from_file(str(ENTRY_SCRIPT), default_timeout=120)
        if page is not None:
            at.run()  # the default page first (untimed): AppTest switches pages after a run
            for k, v in params.items():
                at.query_params[k] = v
            at.switch_page(page)
        st.cache_data.clear()  # cold: every query of the page runs
        if db.startswith(lakes.PREFIX):
            lakes.forget_reader(lakes.parse_db(db, None))
        t = time.perf_counter()
        at.run()
        cold = time.perf_counter() - t
        assert not at.exception, at.exception
        time.sleep(REFRESH_S + 0.1)
        t = time.perf_counter()
        at.run()
        refresh = time.perf_counter() - t
        assert not at.exception, at.exception
        return cold, refresh

    pages: dict[str, Callable[[], tuple[float, float]]] = {
        "Fleet": lambda: render(None),
        "Instance (a failed one)": lambda: render("page_instance.py", instance=failed[0]),
        "Failures (drill-down)": lambda: render("page_failures.py", failure=failed[1]),
        "Throughput": lambda: render("page_throughput.py"),
        "Cost": lambda: render("page_cost.py"),
        "SQL (first example)": lambda: render("page_sql.py"),
    }
    pages["Fleet"]()  # warm the page modules' imports (altair, pandas)
    out = {}
    for name, fn in pages.items():
        both = [fn() for _ in range(runs)]
        out[name] = ([c for c, _ in both], [r for _, r in both])
    return out


def sql_cli(db: str, sql: str, runs: int) -> list[float]:
    """Seconds of whole `flightrec sql` processes (start-up included)."""
    argv = [str(Path(sys.executable).parent / "flightrec"), "sql", "--db", db, sql]
    out = []
    for _ in range(runs):
        t = time.perf_counter()
        subprocess.run(argv, check=True, stdout=subprocess.DEVNULL)
        out.append(time.perf_counter() - t)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=RUNS, help=f"renders per page and store (default {RUNS})")
    ap.add_argument(
        "--store",
        choices=("file", "lake", "snapshot", "both", "all"),
        default="all",
        help="which stores (both: file and lake; all: and the snapshot; default all)",
    )
    args = ap.parse_args()
    logging.disable(logging.WARNING)
    warnings.simplefilter("ignore")
    file_db = build_db()
    import streamlit as st  # noqa: F401 (before AppTest: Streamlit's own start-up is not a page's)
    from flightrec.analytics import queries
    from flightrec.broker.local import free_port
    from flightrec.catalog import LocalCatalog
    from flightrec.db.query import run_query
    from streamlit.testing.v1 import AppTest

    from flightrec.settings import Settings

    con = duckdb.connect(str(file_db), read_only=True)
    failed = con.execute(
        "SELECT instance_id, failure_id FROM failures WHERE failure_class = 'gpu_arch_unsupported' "
        "ORDER BY failure_id LIMIT 1"
    ).fetchone()
    counts = con.execute("SELECT (SELECT count(*) FROM instances), (SELECT count(*) FROM log_lines)").fetchone()
    con.close()

    with tempfile.TemporaryDirectory(prefix="flightrec-bench-dash-") as tmp:
        stores = {"file": str(file_db)} if args.store in ("file", "both", "all") else {}
        catalog = None
        holder = None
        if args.store in ("snapshot", "all"):
            held = Path(tmp) / "held.duckdb"
            held_copy(file_db, held)
            holder = hold(held)
            stores["snapshot"] = str(held)
        if args.store in ("lake", "both", "all"):
            pg = Path(tmp) / "pg"
            pg.mkdir()
            Path(tmp).chmod(0o711)  # PostgreSQL runs as `postgres` under root: it must reach its folder
            catalog = LocalCatalog(port=free_port(), data=pg / "c", settings=Settings.from_env({}))
            catalog.start()
            stores["lake"] = build_lake(file_db, catalog, Path(tmp) / "lake", SHARDS)
        try:
            trivial = Path(tmp) / "trivial.py"
            trivial.write_text("import streamlit as st\nst.title('baseline')\n")

            def render_trivial() -> None:
                AppTest.from_file(str(trivial), default_timeout=120).run()

            render_trivial()  # warm imports
            base = statistics.median(timed(render_trivial))
            print(
                f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
                f"load {os.getloadavg()[0]:.1f}; data: {counts[0]:,} instances, {counts[1]:,} log lines (file "
                f"{file_db.stat().st_size / 2**20:.0f} MiB; lake: the same rows, {SHARDS} shards)"
            )
            print(f"baseline: trivial Streamlit script via AppTest, median {base * 1000:.0f} ms")
            results = {name: measure_pages(db, args.runs, failed) for name, db in stores.items()}
            names = list(stores)
            head = " | ".join(f"{n} cold | {n} refresh" for n in names)
            print(f"\n| page, median of {args.runs} (max) | {head} |")
            print("| --- |" + " ---: |" * (2 * len(names)))
            for page in results[names[0]]:
                cells = []
                for n in names:
                    cold, refresh = results[n][page]
                    cells.append(f"{statistics.median(cold) * 1000:.0f} ms ({max(cold) * 1000:.0f})")
                    cells.append(f"{statistics.median(refresh) * 1000:.0f} ms ({max(refresh) * 1000:.0f})")
                print(f"| {page} | " + " | ".join(cells) + " |")
            print(
                f"goals: file cold <= {PAGE_GOAL_S:.1f} s; lake cold <= {LAKE_COLD_GOAL_S} s, "
                f"refresh <= {LAKE_REFRESH_GOAL_S} s"
            )

            print(f"\n| console example (`run_query` + views), median of {RUNS} | " + " | ".join(names) + " |")
            print("| --- |" + " ---: |" * len(names))
            for name, sql in queries.EXAMPLES.items():
                cells = [
                    f"{statistics.median(timed(partial(queries.console, db, sql))) * 1000:.1f} ms"
                    for db in stores.values()
                ]
                print(f"| {name} | " + " | ".join(cells) + " |")
            one = [
                f"{statistics.median(timed(partial(run_query, db, 'SELECT 1'))) * 1000:.1f} ms"
                for db in stores.values()
            ]
            print("| baseline: `run_query('SELECT 1')` | " + " | ".join(one) + " |")

            cli = {n: statistics.median(sql_cli(db, README_SQL, RUNS)) for n, db in stores.items()}
            line = ", ".join(f"{n} {t:.2f} s" for n, t in cli.items())
            ratio = (
                f"; lake/file {cli['lake'] / cli['file']:.2f}x (goal <= 2x)" if {"lake", "file"} <= cli.keys() else ""
            )
            print(f"\n`flightrec sql` (README's query, whole process), median of {RUNS}: {line}{ratio}")
            _record(results, cli, base, args.runs, counts)
        finally:
            if catalog is not None:
                catalog.stop()
            if holder is not None:
                holder.communicate("", timeout=120)
    return 0


def _record(results: dict, cli: dict[str, float], base: float, runs: int, counts: tuple) -> None:
    """A row per page: each store's cold / refresh medians; the baseline, a one-line Streamlit script."""

    def cells(page: str) -> str:
        out = []
        for name, pages in results.items():
            cold, refresh = pages[page]
            out.append(f"{name} {statistics.median(cold) * 1000:,.0f} / {statistics.median(refresh) * 1000:,.0f} ms")
        return "; ".join(out)

    first = next(iter(results.values()))
    figures = [
        record.Figure(
            page, cells(page), f"a one-line script: {base * 1000:.0f} ms", f"goal: file cold <= {PAGE_GOAL_S:g} s"
        )
        for page in first
    ]
    figures.append(
        record.Figure(
            "`flightrec sql` of the README's query, whole process",
            "; ".join(f"{n} {t:.2f} s" for n, t in cli.items()),
            note=f"lake / file {cli['lake'] / cli['file']:.2f}x (goal <= 2x)" if {"lake", "file"} <= cli.keys() else "",
        )
    )
    record.write(
        "bench_dashboard",
        "Dashboard",
        f"Pages of the Streamlit app (one `AppTest.run()` each) over {counts[0]:,} instances and {counts[1]:,} log "
        f"lines, per store ({', '.join(results)}; snapshot: read while a store holds the file): cold (query cache "
        f"cleared) / refresh, medians of {runs}. The baseline: a one-line Streamlit script rendered the same way.",
        figures,
    )


if __name__ == "__main__":
    sys.exit(main())
