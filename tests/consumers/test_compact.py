"""Compaction (db/compact.py, `flightrec compact`): the space deleted rows leave goes back to the disk, and a kill
at any moment leaves a complete database at the path."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import pytest
from flightrec.db.compact import FileBusy, compact_file, copy_path
from flightrec.db.rowwriter import MATERIALIZED_TABLES
from retention_helpers import DAY, MINUTE, NOW, Timed, write


def chatter(instances: int, batches: int, per_batch: int, kept_only: bool = False) -> list[Timed]:
    """Instances that each write ``batches`` batches of ``per_batch`` lines, interleaved in time; ``kept_only``:
    the same boots with only every fifth line (the lines a deletion of 80 % keeps)."""
    boots = []
    for i in range(instances):
        b = Timed(instance=f"inst-{i:03d}", boot=f"boot-{i:03d}")
        b.started("supervisor", NOW - 2 * DAY)
        for k in range(batches):
            n0 = k * per_batch
            texts = [
                f"proof {n0 + j} done in {(n0 + j) * 7919 % 997} ms, root {(n0 + j) * 2654435761 % 2**32:08x}"
                for j in range(per_batch)
            ]
            if kept_only:
                texts = [t for j, t in enumerate(texts) if (n0 + j) % 5 == 0]
            b.lines("supervisor", NOW - 2 * DAY + k * MINUTE + i, texts)
        boots.append(b)
    return boots


def rows(db: Path, tables: tuple[str, ...] = MATERIALIZED_TABLES) -> dict[str, list[tuple]]:
    con = duckdb.connect(str(db), read_only=True)
    try:
        return {t: sorted(map(repr, con.execute(f"SELECT * FROM {t}").fetchall())) for t in tables}
    finally:
        con.close()


@pytest.mark.slow  # ~10 s: 200,000 lines committed twice
def test_eighty_percent_deleted_compacts_to_within_a_fifth_of_a_fresh_rebuild(tmp_path: Path) -> None:
    full, fresh = tmp_path / "full.duckdb", tmp_path / "fresh.duckdb"
    write(full, chatter(20, 100, 100), batch=400)  # 200,000 lines, committed as a materializer would
    write(fresh, chatter(20, 100, 100, kept_only=True), batch=400)  # what is kept, written from scratch
    con = duckdb.connect(str(full))
    try:
        deleted = con.execute("DELETE FROM log_lines WHERE line_no % 5 <> 0").fetchall()[0][0]
        con.execute("CHECKPOINT")
    finally:
        con.close()
    assert deleted == 160_000
    before = full.stat().st_size
    done = compact_file(full)
    after = full.stat().st_size
    print(f"before {before:,} after {after:,} fresh {fresh.stat().st_size:,} ratio {after / fresh.stat().st_size:.3f}")
    assert done.bytes_before == before and done.bytes_after == after
    assert after <= 1.2 * fresh.stat().st_size
    assert after < before
    kept = duckdb.connect(str(full), read_only=True)
    try:
        assert kept.execute("SELECT count(*), count(*) FILTER (WHERE line_no % 5 = 0) FROM log_lines").fetchall() == [
            (40_000, 40_000)
        ]
    finally:
        kept.close()
    assert not copy_path(full).exists()


def test_compaction_keeps_every_row_view_and_column_setting(tmp_path: Path) -> None:
    db = tmp_path / "f.duckdb"
    write(db, chatter(3, 5, 10))
    con = duckdb.connect(str(db))
    try:
        con.execute("CREATE VIEW mine AS SELECT count(*) AS n FROM log_lines")
    finally:
        con.close()
    before = rows(db)
    compact_file(db)
    assert rows(db) == before
    con = duckdb.connect(str(db), read_only=True)
    try:
        assert con.execute("SELECT n FROM mine").fetchall() == [(150,)]
    finally:
        con.close()
    # the file stays the materializer's: it opens, migrates nothing, and commits into it
    write(db, chatter(1, 1, 3))


@pytest.mark.slow  # a holder process and `flightrec compact` (~5 s)
def test_a_file_another_process_holds_is_refused_with_who(tmp_path: Path) -> None:
    db = tmp_path / "f.duckdb"
    write(db, chatter(1, 2, 5))
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"import duckdb, time; c = duckdb.connect({str(db)!r}); print('ok', flush=True); time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "ok"
        with pytest.raises(FileBusy, match=f"pid {holder.pid}"):
            compact_file(db, lock_wait=0.3)
        cli = subprocess.run(
            [str(Path(sys.executable).with_name("flightrec")), "compact", "--db", str(db), "--lock-wait", "0.3"],
            capture_output=True,
            text=True,
            env={**os.environ, "PYTHONSAFEPATH": "1"},
        )
        assert cli.returncode == 1
        assert f"pid {holder.pid}" in cli.stderr and "stop the materializer" in cli.stderr
    finally:
        holder.kill()
        holder.wait()
    assert not copy_path(db).exists()


@pytest.mark.slow  # kills `flightrec compact` a dozen times (~20 s)
def test_a_compaction_killed_at_any_moment_leaves_a_complete_database(tmp_path: Path) -> None:
    db = tmp_path / "f.duckdb"
    write(db, chatter(20, 50, 100), batch=300)  # 100,000 lines: a compaction takes a second or so
    con = duckdb.connect(str(db))
    try:
        con.execute("DELETE FROM log_lines WHERE line_no % 3 = 0")
    finally:
        con.close()
    expected = rows(db)
    exe = str(Path(sys.executable).with_name("flightrec"))
    env = {**os.environ, "PYTHONSAFEPATH": "1", "FLIGHTREC_LOG_LEVEL": "WARNING"}
    started = time.monotonic()
    proc = subprocess.run([exe, "compact", "--db", str(db)], env=env, capture_output=True, text=True, check=True)
    whole = time.monotonic() - started
    assert rows(db) == expected, proc.stderr
    killed_in_copy = 0
    for k in range(12):
        p = subprocess.Popen([exe, "compact", "--db", str(db)], env=env, stderr=subprocess.PIPE)
        time.sleep(whole * (k + 0.5) / 12)
        p.send_signal(signal.SIGKILL)
        p.wait()
        killed_in_copy += copy_path(db).exists()
        assert rows(db) == expected, f"kill {k} after {whole * (k + 0.5) / 12:.2f} s"
    assert killed_in_copy >= 3  # some kills landed while the copy was being made
    compact_file(db)  # a later compaction clears what the killed ones left
    assert not copy_path(db).exists() and not Path(f"{copy_path(db)}.wal").exists()
    assert rows(db) == expected


def test_a_store_refused_the_file_names_who_holds_it(tmp_path: Path) -> None:
    """FileStore and compact_file open the file the same way (filestore.connect_giving_way): past the wait, the
    store's refusal names the process that holds the file, and no notice to readers is left behind."""
    from flightrec.db.filestore import FileStore
    from flightrec.db.query import writer_notice_path

    from flightrec.errors import MaterializeError

    db = tmp_path / "f.duckdb"
    FileStore(db, "g", publish=False).close()
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"import duckdb, time; c = duckdb.connect({str(db)!r}); print('ok', flush=True); time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "ok"
        with pytest.raises(
            MaterializeError, match=rf"cannot open {db} for writing: pid {holder.pid} .* held it for 0.3s"
        ):
            FileStore(db, "g", lock_wait=0.3, publish=False)
        assert not writer_notice_path(db).exists()
    finally:
        holder.kill()
        holder.wait()
