"""Retention, purge and a full data path on a lake: rows go through the lake's own maintenance (files with deleted
rows written anew, old snapshots expired, their files cleaned up), so the Parquet files really lose them."""

from __future__ import annotations

import logging
import subprocess
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import duckdb
import pytest
from flightrec.db import lake as lakes
from flightrec.db.fold import fold
from flightrec.db.keep import Keep
from flightrec.db.lakestore import ALIAS, LakeStore
from flightrec.db.views import stored_views
from lake_helpers import lake_con, run_lake, seed_lake_at_mark
from materializer_helpers import Boot, publish
from retention_helpers import DAY, HOUR, MINUTE, Timed, records

NOW_US = time.time_ns() // 1000
MARK = "old-chatter-4f1c9e"  # text only the expired lines carry
SECRET = "AKIA-LEAKED-7QX2"


def history() -> list[Timed]:
    old = NOW_US - 20 * DAY
    healthy = Timed(instance="healthy")
    healthy.started("supervisor", old)
    healthy.lines("supervisor", old + MINUTE, [f"{MARK} {k}" for k in range(300)])
    healthy.lines("supervisor", NOW_US - HOUR, ["recent chatter", f"token={SECRET} in a line"])
    healthy.seal(NOW_US - HOUR + 1)
    failed = Timed(instance="failed")
    failed.started("benchmark", old)
    failed.lines("benchmark", old + MINUTE, ["CUDA error: no kernel image", f"key {SECRET}"] * 100)
    failed.ended("benchmark", old + 2 * MINUTE, code=1)
    failed.seal(old + 3 * MINUTE)
    return [healthy, failed]


def lake_store(db: str, data_path: str) -> LakeStore:
    store = LakeStore(lakes.parse_db(db, data_path), "t", views=stored_views(), shards=[0], owner="t")
    store.claim([0])
    return store


def parquet_texts(data_path: str) -> list[str]:
    """Every string of every Parquet file under the data path (what is on the disk, whatever the catalog says)."""
    files = [str(p) for p in Path(data_path).rglob("*.parquet")]
    con = duckdb.connect()
    out: list[str] = []
    try:
        for f in files:
            rel = con.sql(f"SELECT * FROM read_parquet('{f}')")
            for name, kind in zip(rel.columns, rel.types, strict=True):
                if "VARCHAR" in str(kind):
                    out += [str(v) for (v,) in con.sql(f'SELECT CAST("{name}" AS VARCHAR) FROM rel').fetchall() if v]
    finally:
        con.close()
    return out


def committed(db: str, data_path: str) -> LakeStore:
    store = lake_store(db, data_path)
    store.commit({0: fold(records(history()))})
    now = timedelta(0)
    lakes.maintain(store.con, ALIAS, keep_snapshots=now, file_grace=now)  # everything out in Parquet files
    return store


@pytest.mark.slow  # a lake written, expired and maintained (~20 s with its catalog)
def test_lake_retention_leaves_the_files_at_its_maintenance(lake) -> None:
    db, data_path = lake
    store = committed(db, data_path)
    try:
        assert any(MARK in t for t in parquet_texts(data_path))
        result = store.retain(Keep(lines_days=14))
        assert result.lines_deleted == 300
        now = timedelta(0)  # what a maintenance an hour later does (KEEP_SNAPSHOTS, FILE_GRACE)
        done = lakes.maintain(store.con, ALIAS, keep_snapshots=now, file_grace=now)
        assert done.files_rewritten >= 1 and done.files_deleted >= 1
    finally:
        store.close()
    con = lake_con(db)
    try:
        left = dict(con.execute("SELECT instance_id, count(*) FROM log_lines GROUP BY ALL").fetchall())
    finally:
        con.close()
    assert left == {"healthy": 2, "failed": 200}  # the failure's context stays
    assert not any(MARK in t for t in parquet_texts(data_path))  # and the expired lines are in no file


@pytest.mark.slow  # `flightrec purge` on a lake (~30 s with its catalog)
def test_a_purged_secret_is_in_no_file_of_the_lake(lake, kafka) -> None:
    db, data_path = lake
    committed(db, data_path).close()
    assert any(SECRET in t for t in parquet_texts(data_path))
    env = kafka.env(FLIGHTREC_LOG_LEVEL="WARNING")
    proc = subprocess.run(
        [str(Path(__file__).parents[2] / ".venv/bin/flightrec"), "purge", "--db", db, "--data-path", data_path,
         "--text-from", "-", "--no-archive"],
        input=SECRET + "\n", capture_output=True, text=True, env={**env, "PYTHONSAFEPATH": "1"}, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "main.log_lines: 101 rows masked" in proc.stdout and "Kafka still holds" in proc.stdout
    assert not any(SECRET in t for t in parquet_texts(data_path))
    con = lake_con(db)
    try:
        masked = con.execute("SELECT count(*) FROM log_lines WHERE contains(text, '****************')").fetchall()
    finally:
        con.close()
    assert masked == [(101,)]


@pytest.fixture
def small_data_path(tmp_path: Path) -> Iterator[Path]:
    where = tmp_path / "lake-disk"
    where.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "flightrec-test", str(where)],
                          capture_output=True, text=True)  # fmt: skip
    if made.returncode != 0:
        pytest.fail(f"cannot mount a small tmpfs for the full-disk test (root is needed, as CI has): {made.stderr}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


@pytest.mark.slow  # a lake member on a full data path (~20 s)
def test_a_lake_member_waits_out_a_full_data_path_and_loses_nothing(
    kafka, lake, small_data_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    db, _ = lake
    data_path = str(small_data_path / "data")
    group = "full-disk"
    seed_lake_at_mark(kafka, db, data_path, group)
    filler = small_data_path / "filler"
    with open(filler, "wb") as f:
        f.write(b"\0" * (16 << 20))  # no room at all

    class RoomOnceSaid(logging.Handler):
        """Gives the room back 2 s after the member said its disk is full (60 s at the latest: the test fails)."""

        def emit(self, record: logging.LogRecord) -> None:
            if "is full" in record.getMessage():
                threading.Timer(
                    2.0,
                    filler.unlink,
                ).start()

    said_full = RoomOnceSaid()
    logging.getLogger("flightrec.consumers.diskfull").addHandler(said_full)
    safety = threading.Timer(60.0, lambda: filler.unlink(missing_ok=True))
    safety.start()
    events = []
    for i in range(3):
        b = Boot(instance=f"lake-full-{i}")
        b.lines("supervisor", "stdout", [f"line {k} " + "z" * 60 for k in range(2000)])
        events += b.events
    publish(kafka.bootstrap, events)
    try:
        with caplog.at_level(logging.WARNING, logger="flightrec.consumers.diskfull"):
            stats = run_lake(kafka, db, data_path, idle=3.0, group=group)
    finally:
        safety.cancel()
        logging.getLogger("flightrec.consumers.diskfull").removeHandler(said_full)
    said = [r.getMessage() for r in caplog.records if r.name == "flightrec.consumers.diskfull"]
    assert len(said) == 2 and "is full" in said[0] and "room again" in said[1], said
    assert stats.lines_written == 6000
    con = lake_con(db, data_path)
    try:
        got = con.execute(
            "SELECT count(*), count(DISTINCT (event_id, line_no)) FROM log_lines WHERE instance_id LIKE 'lake-full-%'"
        ).fetchall()[0]
    finally:
        con.close()
    assert got == (6000, 6000)
