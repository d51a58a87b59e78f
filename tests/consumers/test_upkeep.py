"""A running materializer keeps its file bounded by itself (consumers/upkeep.py): old lines expire in steps between
its commits, the deleted rows are checkpointed out, the file is compacted at a quiet moment, and /metrics says so."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb
import pytest
from flightrec.broker.local import free_port
from flightrec.consumers import upkeep
from flightrec.consumers.materializer import Materializer, Options
from flightrec.consumers.storefigures import StoreFigures
from flightrec.db.keep import Keep
from flightrec.db.query import run_query
from flightrec.db.retention import StepResult
from flightrec.db.snapshot import current
from materializer_helpers import Boot, publish
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from retention_helpers import DAY, MINUTE, Timed, write


def history(instances: int, batches: int) -> list[Timed]:
    """Healthy supervisors that talked 20 days ago (by the broker's clock): all of it expires at 14 days."""
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


@pytest.mark.slow  # ~15 s: a materializer that expires 200,000 lines, checkpoints and compacts while it reads
def test_a_running_materializer_expires_checkpoints_and_compacts_by_itself(
    fresh_kafka, db: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a broker of its own: under `make test` a process an earlier test left behind can still publish old lines to the
    # session's broker, and they would expire here too (the count read 200,099 of 200,000 in 2 of 3 full runs)
    kafka = fresh_kafka
    monkeypatch.setattr(upkeep, "MIN_FREE_BYTES", 0)
    monkeypatch.setattr(upkeep, "FIGURES_S", 0.5)
    monkeypatch.setattr(upkeep, "IDLE_S", 0.5)
    kafka.seed_at_mark(db)
    write(db, history(20, 50), batch=500, offsets=False)  # 200,000 old lines
    before = db.stat().st_size
    fresh = Boot(instance="fresh-now")
    for k in range(5):
        fresh.lines("supervisor", "stdout", [f"fresh {k}.{j}" for j in range(100)], first_line=k * 100)
    publish(kafka.bootstrap, fresh.events)

    async def go() -> tuple[Materializer, str]:
        opts = Options(
            db=str(db), keep=Keep(lines_days=14), compact_free_share=0.15, metrics_port=free_port(),
            metrics_address="127.0.0.1",
        )  # fmt: skip
        async with Materializer(kafka.settings.kafka_kwargs(), opts) as m:
            runner = asyncio.ensure_future(m.run())
            deadline = time.monotonic() + 120
            while not (m._figures.figures.compactions and m._figures.figures.lines_expired == 200_000):
                assert time.monotonic() < deadline and not runner.done(), m._figures.figures
                await asyncio.sleep(0.2)
            m.stop()
            await runner
            assert m._metrics is not None
            assert current(db) is not None  # readers read its snapshot again after compacting
            live = await asyncio.to_thread(run_query, db, "SELECT count(*) AS n FROM log_lines")
            assert live.column("n").to_pylist() == [500]
            return m, generate_latest(m._metrics.registry).decode()

    m, text = asyncio.run(go())
    metrics = {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}
    con = duckdb.connect(str(db), read_only=True)
    try:
        left = dict(con.execute("SELECT instance_id LIKE 'old-%', count(*) FROM log_lines GROUP BY ALL").fetchall())
    finally:
        con.close()
    assert left == {False: 500}  # the old chatter expired, the fresh lines are all there
    assert metrics["flightrec_retention_lines_expired_total"] == 200_000
    assert m._figures.figures.compactions >= 1 and metrics["flightrec_compactions_total"] >= 1
    assert db.stat().st_size < before
    assert metrics["flightrec_database_bytes"] > 0 and "flightrec_database_free_bytes" in metrics
    assert metrics["flightrec_lines_expired_before_timestamp_seconds"] > 0
    assert metrics["flightrec_oldest_line_timestamp_seconds"] > 0
    assert metrics["flightrec_disk_full"] == 0


@dataclass
class _Gathering:
    """The batch being gathered, as the upkeep sees it: small (the materializer keeps up)."""

    bytes: int = 0
    lines: int = 0
    max_bytes: int = 1 << 20
    max_lines: int = 10_000


def test_no_compaction_while_a_retention_pass_is_still_deleting(tmp_path: Path) -> None:
    """A compaction in the middle of a pass copies the rows the pass deletes next and leaves their space behind (the
    file ended larger than before); it waits until the pass found nothing more to judge and was checkpointed."""
    figures = StoreFigures()
    figures.update(database_bytes=200 << 20, free_bytes=120 << 20)  # due by share and bytes

    async def run(fn: Any, *args: Any) -> Any:
        return fn(*args)

    async def reopen(between: Any) -> Any:
        return between()

    u = upkeep.Upkeep(Keep(lines_days=14), tmp_path / "f.duckdb", figures, run=run, con=lambda: None,
                      reopen=reopen, commit_interval=0.5, compact_free_share=0.3)  # fmt: skip
    now, small = time.monotonic() + 1, _Gathering()
    assert not u._compaction_due(now, small)  # retention has not judged the file yet
    steps = iter([StepResult(lines_deleted=100, done=False), StepResult(lines_deleted=100, done=True)])
    u._run = lambda fn: run(lambda: next(steps))
    asyncio.run(u._step())
    assert not u._compaction_due(now, small)  # more to judge
    asyncio.run(u._step())
    assert not u._compaction_due(now, small)  # the pass's deletes not yet checkpointed
    u._run = run
    u._con = lambda: duckdb.connect()
    asyncio.run(u._checkpoint())
    u.deleted_since_checkpoint = 0  # as start() does when it hands out the checkpoint
    assert u._compaction_due(now, small)
    assert not upkeep.Upkeep(Keep(lines_days=None, samples_days=None), tmp_path / "g.duckdb", figures, run=run,
                             con=lambda: None, reopen=reopen, commit_interval=0.5,
                             compact_free_share=0.3)._compaction_due(now, _Gathering(bytes=1 << 20))  # fmt: skip
    assert upkeep.Upkeep(Keep(lines_days=None, samples_days=None), tmp_path / "g.duckdb", figures, run=run,
                         con=lambda: None, reopen=reopen, commit_interval=0.5,
                         compact_free_share=0.3)._compaction_due(now, small)  # fmt: skip  # nothing expires: free
