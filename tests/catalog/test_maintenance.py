"""Lake maintenance (flush inlined rows, merge small files, expire snapshots, delete retired files) while a
writer in another process keeps appending: no row lost or doubled, fewer files after, no stray files on disk."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

from flightrec.db import lake as lakes

WRITER = r"""
import json, sys, time
import duckdb
from flightrec.db import lake as lakes
db, data_path, commits = sys.argv[1], sys.argv[2], int(sys.argv[3])
con = lakes.connect(lakes.parse_db(db, data_path, writing=True))
retries = 0
for n in range(commits):
    size = 3 if n % 4 == 0 else 200   # small commits are inlined into the catalog, larger ones make a file each
    while True:
        try:
            con.execute("INSERT INTO events SELECT ? * 1000 + range AS id, 'line ' || range AS text FROM range(?)",
                        [n, size])
            break
        except duckdb.Error as exc:
            if "conflict" not in str(exc).lower():
                raise
            retries += 1
            time.sleep(0.05)
    print(n, flush=True, file=sys.stderr)
print(json.dumps({"commits": commits, "retries": retries}))
"""


def expected(commits: int) -> tuple[int, int]:
    ids = [n * 1000 + i for n in range(commits) for i in range(3 if n % 4 == 0 else 200)]
    return len(ids), sum(ids)


def test_maintenance_while_a_writer_appends(lake):
    db, data_path = lake
    con = lakes.connect(lakes.parse_db(db, data_path, writing=True))
    con.execute("CREATE TABLE events (id BIGINT, text VARCHAR)")
    commits = 80
    writer = subprocess.Popen(
        [sys.executable, "-c", WRITER, db, data_path, str(commits)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONSAFEPATH": "1"},
    )
    passes = []
    most_files = 0
    try:
        while writer.poll() is None:
            most_files = max(most_files, lakes.live_files(con))
            passes.append(lakes.maintain(con, keep_snapshots=timedelta(0), file_grace=timedelta(0)))
            time.sleep(0.2)
        out, err = writer.communicate(timeout=120)
    finally:
        if writer.poll() is None:
            writer.kill()
    assert writer.returncode == 0, err[-2000:]
    assert json.loads(out)["commits"] == commits
    most_files = max(most_files, lakes.live_files(con))
    final = lakes.maintain(con, keep_snapshots=timedelta(0), file_grace=timedelta(0))
    print(
        f"passes={len(passes)} conflicts={sum(p.conflicts_retried for p in passes)} writer={out.strip()} "
        f"most_files={most_files} final={final}"
    )
    assert len(passes) >= 2, "maintenance ran while the writer wrote"
    assert sum(p.files_merged for p in passes) > 0
    # every file the writer made (one per larger commit) and every flush's file was merged away at some pass
    merged = sum(p.files_merged for p in [*passes, final])
    assert merged >= commits * 3 // 4 - final.files_after, (merged, final)
    # nothing lost, nothing doubled
    n, total = expected(commits)
    assert con.execute("SELECT count(*), count(DISTINCT id), sum(id) FROM events").fetchone() == (n, n, total)
    # fewer files: all small files merged (how many were live at once depends on how the passes fell between the
    # writer's commits, so only the end is asserted); the folder holds only live files
    assert final.files_after <= 2, (final, most_files)
    on_disk = sorted(Path(data_path).rglob("*.parquet"))
    assert len(on_disk) == final.files_after, on_disk
    con.close()
    # a reader agrees
    assert lakes.connect(lakes.parse_db(db), read_only=True).execute("SELECT count(*) FROM events").fetchone() == (n,)


def test_maintenance_keeps_recent_snapshots_and_their_files(lake):
    db, data_path = lake
    con = lakes.connect(lakes.parse_db(db, data_path, writing=True))
    con.execute("CREATE TABLE t AS SELECT range AS i FROM range(500)")
    for _n in range(3):
        con.execute("INSERT INTO t SELECT range FROM range(500)")
    snapshots = con.execute("SELECT count(*) FROM ducklake_snapshots('lake')").fetchone()[0]
    result = lakes.maintain(con)  # the defaults: keep an hour of snapshots, files retired 10 minutes ago
    assert result.snapshots_expired == 0 and result.files_deleted == 0
    assert result.files_merged == 4 and result.files_after == 1
    assert con.execute("SELECT count(*) FROM ducklake_snapshots('lake')").fetchone()[0] >= snapshots
    # the merged-away files stay on disk for the grace period: a reader of an older snapshot still finds them
    assert len(list(Path(data_path).rglob("*.parquet"))) == 5
    first = con.execute("SELECT min(snapshot_id) FROM ducklake_snapshots('lake')").fetchone()[0]
    assert con.execute(f"SELECT count(*) FROM t AT (VERSION => {first + 1})").fetchone() == (500,)
    con.close()


READER = r"""
import json, sys, time
from pathlib import Path
from flightrec.db.query import run_query
db, stop = sys.argv[1], Path(sys.argv[2])
seen, errors = [], []
while not stop.exists():
    try:
        row = run_query(db, "SELECT count(*) AS n, coalesce(sum(id), 0) AS s FROM events").to_pylist()[0]
        seen.append(row["n"])
    except Exception as exc:
        errors.append(f"{type(exc).__name__}: {exc}")
    time.sleep(0.05)
print(json.dumps({"seen": seen, "errors": errors[:5]}))
"""


def test_a_reader_process_reads_throughout_writes_and_maintenance(lake, tmp_path):
    """Writer, maintenance and a reader process at once: the reader never fails and never sees rows vanish."""
    db, data_path = lake
    con = lakes.connect(lakes.parse_db(db, data_path, writing=True))
    con.execute("CREATE TABLE events (id BIGINT, text VARCHAR)")
    env = {**os.environ, "PYTHONSAFEPATH": "1"}
    stop = tmp_path / "stop"
    reader_db = db.replace("user=flightrec", "user=flightrec_reader")
    reader = subprocess.Popen(
        [sys.executable, "-c", READER, reader_db, str(stop)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    commits = 60
    writer = subprocess.Popen(
        [sys.executable, "-c", WRITER, db, data_path, str(commits)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        while writer.poll() is None:
            lakes.maintain(con, keep_snapshots=timedelta(0), file_grace=timedelta(seconds=60))
            time.sleep(0.2)
        assert writer.wait(timeout=120) == 0, writer.communicate()[1][-2000:]
        lakes.maintain(con, keep_snapshots=timedelta(0), file_grace=timedelta(seconds=60))
        time.sleep(1.0)  # the reader reads the final state a few times
        stop.write_text("")
        out, err = reader.communicate(timeout=120)
    finally:
        for p in (writer, reader):
            if p.poll() is None:
                p.kill()
    assert reader.returncode == 0, err[-2000:]
    result = json.loads(out)
    assert result["errors"] == []
    seen = result["seen"]
    n, _ = expected(commits)
    assert len(seen) >= 5 and seen == sorted(seen), seen  # counts only grow: no snapshot lost rows
    assert seen[-1] == n
    con.close()


def test_orphaned_files_are_deleted_once_old(lake):
    """A Parquet file no snapshot names (a transaction that never committed) goes once older than the orphan
    grace; a young one stays (it may be another writer's uncommitted transaction)."""
    db, data_path = lake
    con = lakes.connect(lakes.parse_db(db, data_path, writing=True))
    con.execute("CREATE TABLE t AS SELECT range AS i FROM range(1000)")
    live = sorted(Path(data_path).rglob("*.parquet"))
    assert len(live) == 1
    old, young = live[0].with_name("ducklake-orphan-old.parquet"), live[0].with_name("ducklake-orphan-young.parquet")
    old.write_bytes(live[0].read_bytes())
    young.write_bytes(live[0].read_bytes())
    hours_ago = time.time() - 2 * 3600
    os.utime(old, (hours_ago, hours_ago))
    assert lakes.maintain(con).orphans_deleted == 0  # off by default: a data path may be shared by two lakes
    assert len(list(Path(data_path).rglob("*.parquet"))) == 3
    result = lakes.maintain(con, orphans=True)  # the default orphan grace: an hour
    assert result.orphans_deleted == 1
    assert sorted(Path(data_path).rglob("*.parquet")) == sorted([live[0], young])
    assert con.execute("SELECT count(*), sum(i) FROM t").fetchone() == (1000, 499500)
    con.close()
