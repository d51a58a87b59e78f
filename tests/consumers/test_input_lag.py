"""No instance is judged lost for a silence the materializer has not read: silences are counted up to the moment
its input was last caught up (materializer_progress), not up to the reader's now."""

from __future__ import annotations

import time
from pathlib import Path

import duckdb
from flightrec.db.filestore import FileStore
from flightrec.db.fold import LOG_APPEND_TIME, RawMessage, fold
from flightrec.db.query import run_query
from flightrec.db.views import VIEWS
from flightrec.schemas import Heartbeat, Lifecycle, encode
from flightrec.schemas.sendtime import sent_header
from materializer_helpers import Boot

S = 1_000_000


def _status(db: Path, instance: str) -> str:
    rows = run_query(db, "SELECT status FROM fleet WHERE instance_id = ?", [instance], prelude=VIEWS).to_pylist()
    return rows[0]["status"]


def _record(db: Path, run_id: str, caught_up_us: int) -> None:
    con = duckdb.connect(str(db))
    try:
        con.execute("INSERT OR REPLACE INTO materializer_progress VALUES (?, ?)", [run_id, caught_up_us])
    finally:
        con.close()


def test_a_silence_is_judged_up_to_where_the_input_was_read_not_up_to_now(tmp_path: Path) -> None:
    db = tmp_path / "f.duckdb"
    now = time.time_ns() // 1000
    b = Boot(t0=now - 120 * S)
    b.add(Lifecycle, stage="supervisor", state="started")
    b.add(Heartbeat, stage="supervisor", interval_s=1.0)  # Kafka got its last beat two minutes ago
    recv = now - 120 * S
    msgs = [
        RawMessage(
            e.topic, 0, n, e.instance_id.encode(), encode(e), recv // 1000, LOG_APPEND_TIME, (sent_header(recv),)
        )
        for n, e in enumerate(b.events)
    ]
    store = FileStore(db, group="lag")
    store.commit(fold(msgs))
    store.close()
    # the materializer had read everything a second after that beat, then stopped (or its input lags since)
    _record(db, "earlier-run", recv + 1 * S)
    assert _status(db, b.instance) == "running"  # two minutes unread are no silence
    # read to the end again just now: the two minutes were read, and they were silent
    _record(db, "later-run", now)
    assert _status(db, b.instance) == "lost"
