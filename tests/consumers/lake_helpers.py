"""Helpers for the lake writer tests: a varied fleet's events, in-process lake runs, table-by-table comparison."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

import duckdb
from flightrec.db import lake as lakes
from flightrec.db.nul import spelled
from flightrec.db.rowwriter import MATERIALIZED_TABLES
from flightrec.schemas import Heartbeat, Lifecycle, ManagerEvent
from materializer_helpers import Boot, motivating_boot


def varied_fleet(n_healthy: int = 4) -> tuple[list[Any], list[tuple[str, bytes | None, bytes | None]]]:
    """Events of a small fleet that reaches every table: failures, heartbeats, manager events, a second boot,
    an unsealed boot, a duplicate event; plus raw messages that become dead letters."""
    boots = [motivating_boot()]
    for k in range(n_healthy):
        b = Boot()
        b.facts(host=f"host-{k}")
        b.stage_ok("tunnel", [f"tunnel {k} up"])
        b.add(Lifecycle, stage="benchmark", state="started")
        b.add(Heartbeat, stage="benchmark", interval_s=30.0, pid=7)
        b.lines("benchmark", "stdout", [f"proof {i} ok" for i in range(50)])
        b.add(Heartbeat, stage="benchmark", interval_s=15.0, pid=7)
        b.benchmark(1500.0 + k, 1000.0, "pass")
        b.exit("benchmark", 0)
        b.add(Lifecycle, stage="benchmark", state="succeeded")
        if k % 2 == 0:
            b.seal()
        boots.append(b)
    again = Boot(instance=boots[1].instance)  # a second boot of an instance
    again.add(Lifecycle, stage="tunnel", state="started")
    again.lines("tunnel", "stderr", ["ssh: connect to host refused"])
    again.exit("tunnel", 255, stderr=["ssh: connect to host refused"])
    again.add(Lifecycle, stage="tunnel", state="failed", detail="tunnel exited 255")
    boots.append(again)
    events = [e for b in boots for e in b.events]
    events.append(events[3])  # the agent re-sent one event
    events.append(
        ManagerEvent(
            event_id=str(uuid.uuid4()),
            instance_id=boots[0].instance,
            boot_id="mgr",
            seq=0,
            ts_us=boots[0].t0 + 99_000_000,
            source_id="manager@ctl",
            kind="destroyed",
            detail="benchmark failed",
        )
    )
    raw = [
        ("flightrec.logs", boots[2].instance.encode(), b"not avro at all"),
        ("flightrec.exits", None, b"\xc3\x01garbage"),
    ]
    return events, raw


def run_lake(kafka: Any, db: str, data_path: str, idle: float = 2.0, **opts: Any) -> Any:
    """One in-process group member on the lake until caught up and idle; its Stats."""
    from flightrec.consumers.group import GroupMaterializer
    from flightrec.consumers.materializer import Options
    from flightrec.db.views import stored_views

    opts.setdefault("group", f"test-{uuid.uuid4().hex[:8]}")
    opts.setdefault("views", stored_views())

    async def go() -> Any:
        async with GroupMaterializer(
            kafka.settings.kafka_kwargs(), Options(db=db, data_path=data_path, until_idle=idle, **opts)
        ) as m:
            return await m.run()

    return asyncio.run(go())


def seed_lake_at_mark(kafka: Any, db: str, data_path: str, group: str) -> None:
    """Give a new lake the test's mark of the topics as ``group``'s stored offsets (every shard claimed once, by a
    seeding owner, through the members' own LakeStore), so the group's members start there, as after a run that
    read up to it, instead of reading every earlier test's messages first. The members' first claims are epoch 2."""
    import dataclasses

    from flightrec.db.fold import fold
    from flightrec.db.lakestore import LakeStore
    from flightrec.db.views import stored_views

    assert kafka.mark, "the test has no mark of the topics"
    shards = sorted({p for _t, p in kafka.mark})
    store = LakeStore(
        lakes.lake_location(db, data_path, writing=True), group, views=stored_views(), shards=shards, owner="seed"
    )
    try:
        store.claim(shards)
        store.commit(
            {
                s: dataclasses.replace(fold([]), offsets={tp: o for tp, o in kafka.mark.items() if tp[1] == s})
                for s in shards
            }
        )
    finally:
        store.close()


def lake_con(db: str, data_path: str | None = None) -> duckdb.DuckDBPyConnection:
    return lakes.connect(lakes.parse_db(db, data_path))


def lake_count(db: str, sql: str, params: list[Any] | None = None, data_path: str | None = None) -> int:
    """A count read from the lake; 0 while the members have not made the lake or its tables yet."""
    from flightrec.errors import LakeError

    try:
        con = lake_con(db, data_path)
    except LakeError:
        return 0
    try:
        return int(con.execute(sql, params or []).fetchone()[0])
    except duckdb.CatalogException:
        return 0
    finally:
        con.close()


def table_rows(con: duckdb.DuckDBPyConnection, table: str) -> list[str]:
    """Every row of ``table`` as sorted text (a value's text is the same on a file and on a lake; a file's NUL is
    compared as the lake stores it, spelled out: db/nul.py)."""
    rows = con.execute(f"SELECT * FROM {table}").fetchall()
    return sorted(repr([str(spelled(v)) for v in row]) for row in rows)


def columns(con: duckdb.DuckDBPyConnection, table: str) -> list[tuple[str, str]]:
    return [(r[0], r[1]) for r in con.execute(f"DESCRIBE SELECT * FROM {table}").fetchall()]


def assert_lake_equals_file(db: str, file: Path, tables: tuple[str, ...] = MATERIALIZED_TABLES) -> dict[str, int]:
    """Each materialized table of the lake holds the file's rows, no more, no fewer; row counts by table."""
    lake = lake_con(db)
    f = duckdb.connect(str(file), read_only=True)
    counts = {}
    try:
        for table in tables:
            assert columns(lake, table) == columns(f, table), table
            on_lake, on_file = table_rows(lake, table), table_rows(f, table)
            assert len(on_lake) == len(on_file), (table, len(on_lake), len(on_file))
            assert on_lake == on_file, table
            counts[table] = len(on_file)
    finally:
        lake.close()
        f.close()
    return counts
