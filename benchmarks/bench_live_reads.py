"""Benchmark of the live read path (a reader asking the materializer's socket): a 100k-row and a tiny query.

No broker: a FileStore on a temp file serves queries (db/serve.py) and readers ask through
``flightrec.db.query.run_query``, as `flightrec sql` and the dashboard do. Prints the median of
several runs per query. Run:
    PYTHONSAFEPATH=1 .venv/bin/python benchmarks/bench_live_reads.py [--runs 15]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from flightrec.db.filestore import FileStore
from flightrec.db.query import run_query
from flightrec.db.serve import QueryServer

QUERIES = {
    "100k rows (3 columns)": "SELECT range AS i, 'line ' || range AS text, range * 0.5 AS x FROM range(100000)",
    "tiny (1 row)": "SELECT 42 AS answer",
}


def median_ms(db: Path, sql: str, runs: int, rows: int) -> float:
    """Median wall time of ``runs`` reads, in milliseconds (after one warm-up)."""
    assert run_query(db, sql).num_rows == rows
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        run_query(db, sql)
        times.append((time.perf_counter() - t) * 1000)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=15)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "bench.duckdb"
        store = FileStore(db, "bench")
        try:
            with QueryServer(store.con.cursor(), db):
                for name, sql in QUERIES.items():
                    rows = 100_000 if "100k" in name else 1
                    print(
                        f"live read, {name}: median {median_ms(db, sql, args.runs, rows):.1f} ms over {args.runs} runs"
                    )
        finally:
            store.close()


if __name__ == "__main__":
    main()
