"""`flightrec backup` / `restore` with no materializer running: a consistent copy that round-trips, never
overwriting a file, and a restore that checks what it restores (the live path: tests/consumers/test_backup_live.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import duckdb
import pytest
from flightrec.db.backup import backup, restore
from flightrec.db.filestore import FileStore
from flightrec.db.fold import RawMessage, fold
from flightrec.schemas import Heartbeat, Lifecycle, encode

from flightrec.errors import QueryError

EXE = str(Path(sys.executable).with_name("flightrec"))
TABLES = ("instances", "events_seen", "lifecycle_events", "heartbeats", "consumer_offsets", "boots")


def _db(path: Path, n: int = 20) -> None:
    events = []
    for i in range(n):
        events.append(
            Lifecycle(
                event_id=f"e{i}",
                instance_id=f"i{i % 3}",
                boot_id="b",
                seq=i // 3,
                ts_us=1_790_000_000_000_000 + i,
                stage="s",
                state="started",
            )
        )
    store = FileStore(path, group="backup-test")
    try:
        store.commit(fold([RawMessage(e.topic, 0, k, e.instance_id.encode(), encode(e)) for k, e in enumerate(events)]))
        # a second commit
        hb = Heartbeat(
            event_id="h", instance_id="i0", boot_id="b", seq=99, ts_us=1_790_000_000_000_100, stage="s", interval_s=30.0
        )
        store.commit(fold([RawMessage(hb.topic, 0, n, b"i0", encode(hb))]))
    finally:
        store.close()


def _rows(path: Path) -> dict[str, list]:
    con = duckdb.connect(str(path), read_only=True)
    try:
        return {t: con.execute(f"SELECT * FROM {t} ORDER BY ALL").fetchall() for t in TABLES}
    finally:
        con.close()


def test_an_offline_backup_round_trips(tmp_path: Path) -> None:
    db, to, back = tmp_path / "fleet.duckdb", tmp_path / "b" / "nightly.duckdb", tmp_path / "new" / "fleet.duckdb"
    _db(db)
    to.parent.mkdir()
    back.parent.mkdir()
    made = backup(db, to)
    assert not made.live and made.instances == 3 and made.events == 21
    assert not to.with_name(to.name + ".wal").exists()  # one file, whole
    restore(to, back)
    assert _rows(back) == _rows(db)


def test_backup_and_restore_never_overwrite_and_check_what_they_take(tmp_path: Path) -> None:
    db, to = tmp_path / "fleet.duckdb", tmp_path / "b.duckdb"
    _db(db)
    to.write_text("something of value")
    with pytest.raises(QueryError, match="never overwrites"):
        backup(db, to)
    assert to.read_text() == "something of value"
    with pytest.raises(QueryError, match="never overwrites"):
        restore(db, db)
    with pytest.raises(QueryError, match="not a DuckDB database"):
        restore(to, tmp_path / "restored.duckdb")
    other = tmp_path / "other.duckdb"
    duckdb.connect(str(other)).execute("CREATE TABLE t (x INT)").close()
    with pytest.raises(QueryError, match="not a flightrec database"):
        restore(other, tmp_path / "restored.duckdb")
    assert not (tmp_path / "restored.duckdb").exists()


def test_the_commands_say_what_they_did_and_refuse_a_lake(tmp_path: Path) -> None:
    db, to = tmp_path / "fleet.duckdb", tmp_path / "b.duckdb"
    _db(db)
    r = subprocess.run([EXE, "backup", "--db", str(db), "--to", str(to)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "3 instances, 21 events" in r.stdout and "with no materializer" in r.stdout, r.stderr
    r = subprocess.run(
        [EXE, "restore", "--from", str(to), "--db", str(db)], capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 1 and "never overwrites" in r.stderr, r.stderr
    r = subprocess.run(
        [EXE, "backup", "--db", "ducklake:postgres:dbname=x", "--to", str(tmp_path / "l.duckdb")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 1 and "own snapshots" in r.stderr, r.stderr
