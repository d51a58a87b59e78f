"""How a file stores its lines: the per-batch columns dictionary-compressed, a batch inserted in whole row groups."""

from __future__ import annotations

import time
import uuid

import duckdb
import pyarrow as pa

from flightrec.db.filestore import ROW_GROUP_ROWS, FileStore, in_row_groups
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


def test_a_batch_is_inserted_in_whole_row_groups_of_duckdb(tmp_path):
    table = fold(_messages(700, 500)).logs  # 350,000 lines
    chunks = in_row_groups(table)
    assert [len(b) for b in chunks.to_batches()] == [ROW_GROUP_ROWS, ROW_GROUP_ROWS, 350_000 - 2 * ROW_GROUP_ROWS]
    assert chunks.equals(table)
    assert in_row_groups(table.slice(0, 0)).num_rows == 0
    # the constant is DuckDB's row group: a file's rows lie in groups of that size
    con = duckdb.connect(str(tmp_path / "g.duckdb"))
    con.register("t", pa.table({"x": pa.array(range(ROW_GROUP_ROWS * 2 + 5))}))
    con.execute("CREATE TABLE g AS SELECT * FROM t")
    con.execute("CHECKPOINT")
    counts = con.execute(
        "SELECT max(row_group_id) + 1, max(start + count) FILTER (WHERE row_group_id = 0) "
        "FROM pragma_storage_info('g') WHERE column_name = 'x' AND segment_type = 'BIGINT'"
    ).fetchone()
    assert counts == (3, ROW_GROUP_ROWS)
