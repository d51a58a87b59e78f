"""A read on a lake: this process's locked-down, read-only attachment of it (flightrec.db.lake), behind the
:class:`~flightrec.db.query.Reader` interface run_query reads through.

Every read runs in the reader's own process (there is no writer's process to keep it out of); a catalog that does
not answer makes the next read attach afresh; a read of a lake that holds no tables yet says how to make them.
"""

from __future__ import annotations

from collections.abc import Sequence

import duckdb
import pyarrow as pa
from flightrec.db.lake import (
    LakeLocation,
    forget_reader,
    is_catalog_away,
    mask_password,
    reader_cursor,
    reader_snapshot,
    still_to_run,
)
from flightrec.db.readonly import check_read_only
from flightrec.db.sandbox import Params, ReadLimits
from flightrec.db.statement import Freshness, execute_read_only, stamped

from flightrec.errors import QueryError


class LakeReader:
    """A DuckLake: each read on this process's own attachment, as of the lake's latest snapshot. ``limits`` do not
    apply: a lake's reads run here, on the reader's attachment (flightrec.db.lake)."""

    def __init__(self, loc: LakeLocation) -> None:
        self.loc = loc

    def read(self, sql: str, params: Params, prelude: Sequence[str], limits: ReadLimits | None) -> pa.Table:
        check_read_only(sql)
        loc = self.loc
        cur = reader_cursor(loc, texts=(sql, *prelude))
        try:
            table = execute_read_only(cur, sql, params, still_to_run(loc, prelude))
        except QueryError as exc:
            if is_catalog_away(exc):  # the next read attaches afresh
                forget_reader(loc)
            hint = ""
            if "does not exist" in str(exc) and not _lake_has_tables(cur):
                hint = (
                    f"; the lake holds no tables yet: a materializer makes them when it starts "
                    f"(`flightrec materialize --db '{loc.describe()}' --data-path DIR`)"
                )
            raise QueryError(mask_password(str(exc)) + hint) from None
        finally:
            cur.close()
        return stamped(table, Freshness("lake", reader_snapshot(loc), None))


def _lake_has_tables(cur: duckdb.DuckDBPyConnection) -> bool:
    try:
        return bool(cur.execute("SELECT count(*) FROM duckdb_tables() WHERE database_name = 'lake'").fetchall()[0][0])
    except duckdb.Error:
        return True  # cannot tell: no hint
