"""Arrow tables registered as DuckDB views for one block: how a commit's batches and keys reach its SQL."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import duckdb
import pyarrow as pa


@contextmanager
def arrow_views(con: duckdb.DuckDBPyConnection, **tables: pa.Table) -> Iterator[None]:
    """Register Arrow tables under the given names for the block; unregister them after, whatever happens."""
    done = []
    try:
        for name, table in tables.items():
            con.register(name, table)
            done.append(name)
        yield
    finally:
        for name in done:
            con.unregister(name)
