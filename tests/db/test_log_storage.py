"""How a file stores its lines: the five columns a LogBatch repeats on each line are dictionary-compressed."""

from __future__ import annotations

import time
import uuid

import duckdb
from flightrec.db.filestore import FileStore
from flightrec.db.fold import LOG_APPEND_TIME, RawMessage, fold
from flightrec.schemas import LogBatch, encode

PER_BATCH = ("instance_id", "boot_id", "event_id", "stage", "source")


def _messages(batches: int, lines: int) -> list[RawMessage]:
    """LogBatches of ``lines`` lines each, of 40 instances, every one with its own event id (a UUID)."""
    out = []
    for k in range(batches):
        inst = f"inst-{k % 40}"
        ev = LogBatch(
            event_id=str(uuid.uuid4()),
            instance_id=inst,
            boot_id=f"boot-{k % 3}",
            seq=k,
            ts_us=1_700_000_000_000_000 + k,
            stage="benchmark",
            source="/var/log/prover/daemon.log",
            pid=1,
            line_no=list(range(k * lines, (k + 1) * lines)),
            line_ts_us=[1_700_000_000_000_000 + k] * lines,
            text=[f"proof {k}.{i} done in 41.7s gpu0 util 97%" for i in range(lines)],
            truncated=[False] * lines,
            invalid_utf8=[False] * lines,
        )
        out.append(
            RawMessage("flightrec.logs", 0, k, inst.encode(), encode(ev), int(time.time() * 1000), LOG_APPEND_TIME)
        )
    return out


def test_the_per_batch_columns_of_a_new_file_are_dictionary_compressed(tmp_path):
    # batches of one line each: every event id differs, where DuckDB on its own picks FSST for them after analysing
    # each method (what a commit spent most of its time on for five columns whose values repeat per batch)
    db = tmp_path / "f.duckdb"
    store = FileStore(db, group="t")
    msgs = _messages(6000, 1)
    for start in range(0, len(msgs), 2000):
        store.commit(fold(msgs[start : start + 2000]))
    store.close()
    con = duckdb.connect(str(db), read_only=True)
    rows = con.execute(
        "SELECT column_name, list(DISTINCT compression) FROM pragma_storage_info('log_lines') "
        "WHERE segment_type = 'VARCHAR' GROUP BY column_name"
    ).fetchall()
    methods = dict(rows)
    for column in PER_BATCH:
        assert methods[column] == ["Dictionary"], (column, methods)
    assert con.execute("SELECT count(*), count(DISTINCT event_id) FROM log_lines").fetchone() == (6000, 6000)
