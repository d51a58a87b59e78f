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


def _leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if ".partial" in p.name or p.name.endswith(".wal"))


def test_a_writer_that_publishes_no_snapshot_is_named_and_nothing_is_written(tmp_path: Path) -> None:
    db, to = tmp_path / "fleet.duckdb", tmp_path / "b" / "nightly.duckdb"
    _db(db)
    to.parent.mkdir()
    holder = subprocess.Popen(  # another DuckDB client holding the file for writing (no snapshots published)
        [
            sys.executable,
            "-c",
            f"import duckdb, sys, time; c = duckdb.connect({str(db)!r}); print('held', flush=True); sys.stdin.read()",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with pytest.raises(QueryError, match=r"publishes no snapshot.*--no-serve.*stop it") as err:
            backup(db, to, timeout=60)
        assert "did not answer" not in str(err.value)
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(30)
    assert not to.exists() and _leftovers(to.parent) == []
    backup(db, to)  # the writer gone: the file itself
    assert _rows(to) == _rows(db)


KILLER = """
import os, signal, sys
from pathlib import Path
from flightrec.db import backup as b
real = getattr(b, sys.argv[3])
def killed(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGKILL)
setattr(b, sys.argv[3], killed)
b.backup(Path(sys.argv[1]), Path(sys.argv[2]))
"""


@pytest.mark.parametrize("step", ["fold", "place"])
def test_a_backup_killed_leaves_no_file_and_the_next_one_clears_what_it_left(tmp_path: Path, step: str) -> None:
    """Killed after the copy (before its log is folded in) or just before the backup takes its name: no file at
    the destination, the work folder left is ignored, and the next backup removes it."""
    db, to = tmp_path / "fleet.duckdb", tmp_path / "b" / "nightly.duckdb"
    _db(db)
    to.parent.mkdir()
    r = subprocess.run([sys.executable, "-c", KILLER, str(db), str(to), f"_{step}"], capture_output=True, timeout=120)
    assert r.returncode == -9, r.stderr
    assert not to.exists()
    left = _leftovers(to.parent)
    assert left and all(name.startswith(".nightly.duckdb.partial-") for name in left), left
    made = backup(db, to)
    assert made.instances == 3 and _rows(to) == _rows(db)
    assert _leftovers(to.parent) == []
    restore(to, tmp_path / "restored.duckdb")
    assert _rows(tmp_path / "restored.duckdb") == _rows(db)


FULL = """
import resource, signal, sys
from pathlib import Path
from flightrec.db.backup import backup
from flightrec.errors import QueryError
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (64 << 10, 64 << 10))  # no file may grow past 64 KiB: a full disk
try:
    backup(Path(sys.argv[1]), Path(sys.argv[2]))
except QueryError as exc:
    print(exc)
    sys.exit(3)
"""


def test_a_backup_that_cannot_write_says_so_and_leaves_nothing(tmp_path: Path) -> None:
    db, to = tmp_path / "fleet.duckdb", tmp_path / "b" / "nightly.duckdb"
    _db(db)
    to.parent.mkdir()
    r = subprocess.run([sys.executable, "-c", FULL, str(db), str(to)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 3 and "cannot write the backup" in r.stdout, r.stdout + r.stderr
    assert not to.exists() and _leftovers(to.parent) == []
