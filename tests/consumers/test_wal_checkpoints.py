"""A materializer serving live reads still lets DuckDB checkpoint its WAL into the file: a read-side cursor that
holds a transaction open would make every checkpoint wait, and the WAL grow as long as the materializer runs."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest
from flightrec.db.serve import QueryServer


@pytest.mark.slow  # 100 commits to a file (~3-7 s)
def test_the_live_read_server_holds_no_transaction_that_stops_checkpoints(tmp_path: Path) -> None:
    db = tmp_path / "f.duckdb"
    con = duckdb.connect(str(db))
    try:
        con.execute("SET checkpoint_threshold = '64KB'")
        con.execute("CREATE TABLE t (i BIGINT, s VARCHAR)")
        server = QueryServer(con.cursor(), db)  # built as the materializer builds it (not started: no socket)
        con.execute("CREATE TABLE IF NOT EXISTS made_later (i BIGINT)")  # a table made while it serves (retention's)
        for _ in range(100):  # small commits: each goes to the WAL, and DuckDB checkpoints past 64 KB of it
            con.execute("INSERT INTO t SELECT range, 'line ' || range FROM range(2000)")
        wal = Path(f"{db}.wal")
        assert (wal.stat().st_size if wal.exists() else 0) < 1 << 20  # not 100 commits' worth (~3 MB)
        con.execute("CHECKPOINT")  # refused while another transaction is open
        server.con.close()
    finally:
        con.close()
