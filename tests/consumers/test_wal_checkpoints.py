"""A materializer that publishes snapshots for readers still lets DuckDB checkpoint its WAL into the file: nothing
the publisher does holds a transaction open (it reads the file's bytes, not its tables), so commits, publishes and a
table created later (retention's marks) leave the WAL bounded and a CHECKPOINT possible."""

from __future__ import annotations

from pathlib import Path

import pytest
from flightrec.db import filestore
from flightrec.db.query import run_query


@pytest.mark.slow  # 100 writes to a file, each published (~3-7 s)
def test_publishing_snapshots_holds_no_transaction_that_stops_checkpoints(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(filestore, "SNAPSHOT_WAL_BYTES", 64 << 10)  # a publish checkpoints past 64 KB of WAL
    db, wal = tmp_path / "f.duckdb", tmp_path / "f.duckdb.wal"
    store = filestore.FileStore(db, "g")
    try:
        assert store.publisher is not None
        con = store.con
        con.execute("CREATE TABLE t (i BIGINT, s VARCHAR)")
        store.wrote()
        assert store.publish()
        con.execute("CREATE TABLE IF NOT EXISTS made_later (i BIGINT)")  # a table made while it publishes
        largest = 0
        for _ in range(100):  # small writes, each to the WAL and published, as between commits
            con.execute("INSERT INTO t SELECT range, 'line ' || range FROM range(2000)")
            store.wrote()
            assert store.publish()
            largest = max(largest, wal.stat().st_size if wal.exists() else 0)
        assert largest < 1 << 20  # checkpointed as it went: not 100 writes' worth (~3 MB)
        con.execute("CHECKPOINT")  # refused while another transaction is open
        store.wrote()
        assert store.publish()
        seen = run_query(db, "SELECT count(*) AS n FROM t")  # through the snapshot: the store holds the file
        assert seen.column("n").to_pylist() == [200_000]
    finally:
        store.close()
