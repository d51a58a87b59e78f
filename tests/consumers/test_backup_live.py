"""A backup of a database a materializer holds and writes: taken from the readers' snapshot (the copy the
materializer publishes, db/snapshot.py), equal table by table to that snapshot, one self-contained file; restored,
it resumes from Kafka with nothing lost or twice."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import duckdb
import pytest
from flightrec.consumers.materializer import Materializer, Options
from flightrec.db import snapshot
from materializer_helpers import Boot, materialize, motivating_boot, publish

pytestmark = pytest.mark.integration
EXE = str(Path(sys.executable).with_name("flightrec"))


def _tables(con: duckdb.DuckDBPyConnection) -> dict[str, list[Any]]:
    names = [
        r[0]
        for r in con.execute(
            "SELECT table_name FROM duckdb_tables() WHERE database_name = current_database() ORDER BY 1"
        ).fetchall()
    ]
    return {t: con.execute(f'SELECT * FROM "{t}" ORDER BY ALL').fetchall() for t in names}


def _commits(con: duckdb.DuckDBPyConnection) -> int:
    return int(con.execute("SELECT sum(commits) FROM materializer_runs").fetchall()[0][0])


def _events(con: duckdb.DuckDBPyConnection, ids: list[str]) -> int:
    return int(
        con.execute("SELECT count(*) FROM events_seen WHERE list_contains(?, instance_id)", [ids]).fetchall()[0][0]
    )


class Holder:
    """Holds snapshot copies open read-only (DuckDB's read lock: the publisher does not reuse a held copy), each
    as it becomes current, until it holds every copy: the pointer then stays where it is while the materializer
    goes on committing to its file."""

    def __init__(self, db: Path) -> None:
        self.db = db
        self.held: dict[Path, tuple[str, duckdb.DuckDBPyConnection]] = {}

    def take_current(self) -> tuple[str, duckdb.DuckDBPyConnection] | None:
        published = snapshot.current(self.db)
        if published is None or published.path is None:
            return None
        if published.path in self.held:
            token, con = self.held[published.path]
            return (token, con) if token == published.token else None
        try:
            con = duckdb.connect(str(published.path), read_only=True)
        except duckdb.IOException:  # being written for a newer snapshot
            return None
        again = snapshot.current(self.db)
        if again is None or again.token != published.token:
            con.close()
            return None
        self.held[published.path] = (published.token, con)
        return published.token, con

    def release(self) -> None:
        for _token, con in self.held.values():
            con.close()
        self.held.clear()


def _feed(bootstrap: str, stop: threading.Event, sent: list[Boot]) -> None:
    """New boots every 0.2 s until stopped: the materializer commits all along."""
    while not stop.is_set():
        b = Boot()
        b.stage_ok("params", ["params ok"])
        b.seal()
        publish(bootstrap, b.events)
        sent.append(b)
        stop.wait(0.2)


def _back_up_while_it_writes(kafka: Any, db: Path, to: Path, ids: list[str]) -> dict[str, Any]:
    holder = Holder(db)
    stop, sent = threading.Event(), []
    feeder = threading.Thread(target=_feed, args=(kafka.bootstrap, stop, sent), daemon=True)
    try:
        deadline = time.monotonic() + 120
        while True:  # the first boots read, through a snapshot
            got = holder.take_current()
            if got is not None and _events(got[1], ids) == 3 * len(motivating_boot().events):
                break
            holder.release()
            assert time.monotonic() < deadline, "the first boots never reached a snapshot"
            time.sleep(0.2)
        feeder.start()
        while len(holder.held) < snapshot.COPIES or holder.take_current() is None:
            holder.take_current()
            assert time.monotonic() < deadline, f"held {len(holder.held)} of the snapshot copies"
            time.sleep(0.05)
        token, pinned = holder.take_current() or ("", None)
        assert pinned is not None
        r = subprocess.run(
            [EXE, "backup", "--db", str(db), "--to", str(to)],
            env={**os.environ, "PYTHONSAFEPATH": "1"},
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert r.returncode == 0 and "running materializer's snapshot" in r.stdout, r.stdout + r.stderr
        after = snapshot.current(db)
        assert after is not None and after.token == token  # the pointer stayed: the backup took the pinned copy
        held = subprocess.run(  # the materializer is still the file's one writer (its lock kept)
            [sys.executable, "-c", f"import duckdb; duckdb.connect({str(db)!r}, read_only=True)"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert held.returncode != 0 and "lock" in held.stderr.lower(), held.stderr
        return {"snapshot": _tables(pinned), "commits": _commits(pinned), "sent": sent}
    finally:
        stop.set()
        if feeder.is_alive():
            feeder.join(60)
        holder.release()


def test_a_backup_while_the_materializer_writes_is_its_snapshot_and_restores(kafka, tmp_path: Path, db: Path):
    first = [motivating_boot() for _ in range(3)]
    ids = [b.instance for b in first]
    kafka.seed_at_mark(db)
    publish(kafka.bootstrap, [e for b in first for e in b.events])
    to = tmp_path / "nightly.duckdb"

    async def go() -> dict[str, Any]:
        async with Materializer(kafka.settings.kafka_kwargs(), Options(db=str(db))) as m:
            runner = asyncio.ensure_future(m.run())
            try:
                return await asyncio.to_thread(_back_up_while_it_writes, kafka, db, to, ids)
            finally:
                m.stop()
                await runner

    seen = asyncio.run(go())
    assert not [p for p in tmp_path.iterdir() if ".partial" in p.name or p.name.endswith(".wal")]
    con = duckdb.connect(str(to), read_only=True)
    try:
        assert _commits(con) == seen["commits"]
        assert _tables(con) == seen["snapshot"]  # the snapshot's every table, row for row
    finally:
        con.close()
    ours = ids + [b.instance for b in seen["sent"]]
    final = duckdb.connect(str(db), read_only=True)
    try:
        assert _commits(final) > seen["commits"]  # the materializer committed on while the snapshot was held
    finally:
        final.close()
    materialize(kafka, db, from_mark=False)  # the source reads what it had not read yet, to compare with
    # the disk is lost: the backup restored elsewhere resumes from Kafka, nothing lost, nothing twice
    restored = tmp_path / "new" / "fleet.duckdb"
    restored.parent.mkdir()
    r = subprocess.run(
        [EXE, "restore", "--from", str(to), "--db", str(restored)],
        env={**os.environ, "PYTHONSAFEPATH": "1"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    materialize(kafka, restored, from_mark=False)
    mine = "SELECT event_id FROM events_seen WHERE list_contains(?, instance_id) ORDER BY 1"
    rows = {}
    for path in (db, restored):
        con = duckdb.connect(str(path), read_only=True)
        try:
            rows[path] = con.execute(mine, [ours]).fetchall()
        finally:
            con.close()
    assert rows[restored] == rows[db]
    assert len(rows[db]) == 3 * len(first[0].events) + sum(len(b.events) for b in seen["sent"])
