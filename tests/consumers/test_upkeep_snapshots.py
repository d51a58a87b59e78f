"""Readers of a running materializer's snapshots (db/snapshot.py) through its upkeep (consumers/upkeep.py): a
compaction replaces the database file without taking the snapshot away from readers, the first publish after it
copies the new file whole, and the lines retention deletes leave the readers' snapshot too."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any

import duckdb
import pytest
from flightrec.consumers import progress, upkeep
from flightrec.consumers.materializer import Materializer, Options
from flightrec.db import compact, snapshot
from flightrec.db.keep import Keep
from flightrec.db.query import run_query
from materializer_helpers import Boot, publish
from retention_helpers import DAY, MINUTE, Timed, write


def old_history(instances: int, batches: int) -> list[Timed]:
    """Supervisors that talked 20 days ago (by the broker's clock), 200 lines a batch: expired at 14 days."""
    old = time.time_ns() // 1000 - 20 * DAY
    boots = []
    for i in range(instances):
        b = Timed(instance=f"old-{i}")
        b.started("supervisor", old)
        for k in range(batches):
            b.lines("supervisor", old + k * MINUTE + i, [f"old chatter {k}.{j} " + "y" * 60 for j in range(200)])
        b.seal(old + batches * MINUTE + 1)
        boots.append(b)
    return boots


def fresh(instance: str, batches: int) -> list[Any]:
    boot = Boot(instance=instance)
    for k in range(batches):
        boot.lines("supervisor", "stdout", [f"{instance} {k}.{j}" for j in range(100)], first_line=k * 100)
    return boot.events


class Watcher:
    """Reads the snapshot pointer and counts the fresh lines through run_query, in a thread, until stopped."""

    def __init__(self, db: Path) -> None:
        self.db = db
        self.pointer_gone = 0  # times the pointer was missing or named no copy once it had named one
        self.counts: list[int] = []
        self.errors: list[BaseException] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def __enter__(self) -> Watcher:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)

    def _watch(self) -> None:
        seen = False
        while not self._stop.is_set():
            p = snapshot.current(self.db)
            if p is not None and p.path is not None:
                seen = True
                try:
                    n = run_query(self.db, "SELECT count(*) AS n FROM log_lines WHERE instance_id LIKE 'now-%'")
                    self.counts.append(n.column("n").to_pylist()[0])
                except Exception as exc:  # noqa: BLE001 - every failed read is a finding of the test
                    self.errors.append(exc)
            elif seen:
                self.pointer_gone += 1
            time.sleep(0.005)


async def _until(cond: Any, what: str, runner: asyncio.Future[Any], seconds: float = 90.0) -> None:
    deadline = time.monotonic() + seconds
    while not cond():
        assert time.monotonic() < deadline and not runner.done(), what
        await asyncio.sleep(0.05)


@pytest.mark.slow  # ~15 s: a file with free blocks compacted by a running materializer while readers read
def test_readers_keep_the_snapshot_through_a_compaction_and_its_first_publish_copies_the_whole_file(
    kafka, db: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(upkeep, "MIN_FREE_BYTES", 0)
    monkeypatch.setattr(upkeep, "FIGURES_S", 0.3)
    kafka.seed_at_mark(db)
    write(db, old_history(10, 20), batch=500, offsets=False)  # 40,000 lines ...
    con = duckdb.connect(str(db))
    try:
        con.execute("DELETE FROM log_lines WHERE instance_id LIKE 'old-%'")  # ... deleted: their blocks free
        con.execute("CHECKPOINT")
    finally:
        con.close()
    events: list[tuple[Any, ...]] = []  # compactions and the block runs each publish copied, in order
    real_runs, real_compact = snapshot.changed_runs, compact.compact_file

    def runs(new: Any, old: Any) -> list[tuple[int, int]]:
        found = real_runs(new, old)
        events.append(("publish", len(new), found))
        return found

    def compact_file(*args: Any, **kwargs: Any) -> compact.Compaction:
        done = real_compact(*args, **kwargs)
        events.append(("compacted",))
        return done

    monkeypatch.setattr(snapshot, "changed_runs", runs)
    monkeypatch.setattr(compact, "compact_file", compact_file)
    publish(kafka.bootstrap, fresh("now-a", 3))

    async def go() -> Watcher:
        opts = Options(db=str(db), keep=Keep(lines_days=None, samples_days=None), compact_free_share=0.05)
        async with Materializer(kafka.settings.kafka_kwargs(), opts) as m:
            runner = asyncio.ensure_future(m.run())
            with Watcher(db) as w:
                await _until(lambda: 300 in w.counts, "the first lines read through the snapshot", runner)
                await _until(lambda: m._figures.figures.compactions, "a compaction", runner)
                await asyncio.to_thread(publish, kafka.bootstrap, fresh("now-b", 2))
                await _until(lambda: 500 in w.counts, "the lines after the compaction through the snapshot", runner)
            m.stop()
            await runner
        return w

    w = asyncio.run(go())
    assert not w.errors, w.errors[:3]
    assert w.pointer_gone == 0  # readers never lost the snapshot (they would have read, and held, the file)
    assert set(w.counts) <= {0, 300, 500}, sorted(set(w.counts))
    after = events[events.index(("compacted",)) + 1 :]
    assert after and after[0][0] == "publish"
    _, blocks, copied = after[0]
    assert copied == [(0, blocks)]  # the new file whole: no block of the copies is known to match it


@pytest.mark.slow  # ~10 s: 20,000 lines expire while a materializer runs
def test_readers_stop_seeing_the_lines_retention_deleted(
    fresh_kafka, db: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a broker of its own: under `make test` a process an earlier test left behind (its agent, its late output) can
    # still publish to the session's broker, and its lines and commits would count here
    kafka = fresh_kafka
    monkeypatch.setattr(upkeep, "IDLE_S", 0.5)
    monkeypatch.setattr(progress, "RECORD_EVERY_S", 3600.0)  # no progress write to publish the deletes by chance
    kafka.seed_at_mark(db)
    write(db, old_history(5, 20), batch=500, offsets=False)  # 20,000 lines, 20 days old
    publish(kafka.bootstrap, fresh("now-a", 2))

    def old_lines() -> int:
        n = run_query(db, "SELECT count(*) AS n FROM log_lines WHERE instance_id LIKE 'old-%'")
        return int(n.column("n").to_pylist()[0])

    async def go() -> tuple[int, int]:
        opts = Options(db=str(db), keep=Keep(lines_days=14), compact_free_share=0.0)  # no compaction: no new file
        async with Materializer(kafka.settings.kafka_kwargs(), opts) as m:
            assert m._upkeep is not None
            m._upkeep.next_step = float("inf")  # retention held back until the readers' snapshot has settled
            runner = asyncio.ensure_future(m.run())
            await _until(lambda: m.stats.lines_written == 200, "the fresh lines committed", runner)
            await asyncio.sleep(2.0)  # published (PUBLISH_S), progress recorded: nothing more due
            assert await asyncio.to_thread(old_lines) == 20_000
            commits = m.stats.commits
            m._upkeep.next_step = 0.0
            # retention paces its steps by how long commits wait: under `make test`'s load it took over 90 s
            await _until(lambda: m._figures.figures.lines_expired == 20_000, "the old lines expired", runner, 300.0)
            deadline = time.monotonic() + 10
            left = await asyncio.to_thread(old_lines)
            while left and time.monotonic() < deadline:
                await asyncio.sleep(0.2)
                left = await asyncio.to_thread(old_lines)
            assert snapshot.current(db) is not None  # read through the snapshot, not the file
            m.stop()
            await runner
            return left, m.stats.commits - commits

    left, commits_meanwhile = asyncio.run(go())
    assert commits_meanwhile == 0  # nothing but the deletes could have made a publish due
    assert left == 0
