"""Derived tables do not depend on how the events were batched: one batch, one event a commit, shuffled.

One event a commit makes most commits carry only log lines or heartbeats, the batches whose derived rows
are updated from the boots alone (derive.BOOT_ONLY_KINDS); one batch recomputes everything in full.
"""

from __future__ import annotations

import random

import duckdb
import pytest
from flightrec.db.filestore import FileStore
from flightrec.db.fold import RawMessage, fold
from flightrec.db.rowwriter import MATERIALIZED_TABLES
from flightrec.schemas import Heartbeat, Lifecycle, encode
from lake_helpers import varied_fleet
from materializer_helpers import Boot

DERIVED = ("instances", "boots", "failures", "heartbeats", "running_stages")


def _events() -> list:
    events, _ = varied_fleet(2)
    quiet = Boot()  # a stage that fails without an exit: its tails come from lines that arrive after
    quiet.facts()
    quiet.add(Lifecycle, stage="prove", state="started")
    quiet.lines("prove", "stderr", ["panic: out of memory"])
    quiet.add(Lifecycle, stage="prove", state="failed", detail="prove died")
    quiet.lines("prove", "stderr", ["goroutine 1 [running]"], first_line=2)
    quiet.add(Heartbeat, stage="prove", interval_s=10.0, pid=3)
    quiet.lines("prove", "stdout", [f"late {i}" for i in range(5)], first_line=3)
    later = Boot(instance=quiet.instance, t0=quiet.t0 + 60_000_000)  # a second boot whose first event is a line
    later.lines("tunnel", "stdout", ["tunnel up again"])
    later.add(Heartbeat, stage="tunnel", interval_s=10.0, pid=4)
    later.add(Lifecycle, stage="tunnel", state="started")
    later.lines("tunnel", "stdout", ["still up"], first_line=2)
    return events + quiet.events + later.events


def _tables(path) -> dict[str, list[str]]:
    con = duckdb.connect(str(path), read_only=True)
    try:
        return {t: sorted(repr(r) for r in con.execute(f"SELECT * FROM {t}").fetchall()) for t in MATERIALIZED_TABLES}
    finally:
        con.close()


def _store(path, batches: list[list]) -> dict[str, list[str]]:
    store = FileStore(path, "g")
    offset = 0
    try:
        for events in batches:
            store.commit(
                fold(
                    [
                        RawMessage(e.topic, 0, offset + i, e.instance_id.encode(), encode(e))
                        for i, e in enumerate(events)
                    ]
                )
            )
            offset += len(events)
    finally:
        store.close()
    return _tables(path)


@pytest.mark.slow
def test_derived_tables_are_the_same_whatever_the_batching(tmp_path):
    events = _events()
    whole = _store(tmp_path / "whole.duckdb", [events])
    assert whole["failures"] and whole["running_stages"] and whole["heartbeats"]
    singles = _store(tmp_path / "singles.duckdb", [[e] for e in events])
    shuffled = list(events)
    random.Random(16).shuffle(shuffled)
    mixed = _store(tmp_path / "mixed.duckdb", [shuffled[i : i + 3] for i in range(0, len(shuffled), 3)])
    for table in DERIVED + MATERIALIZED_TABLES:
        assert singles[table] == whole[table], table
        assert mixed[table] == whole[table], table
