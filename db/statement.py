"""One read-only statement on an open connection: checked, run, its result bounded and stamped with how fresh it is.

What every reader shares whatever the location (db/query.py's file and snapshot reads, db/lakeread.py's lake reads):
the reader's own DuckDB settings, opening a file read-only, running a checked prelude and statement
(``flightrec.db.readonly``), and the :class:`Freshness` each result carries in its schema's metadata.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import duckdb
import pyarrow as pa
from flightrec.db.readonly import check_prelude, check_read_only
from flightrec.db.sandbox import Params

from flightrec.errors import QueryError

# The reader's own DuckDB instance: no files, no extensions, no Python objects, settings locked
# (after the time zone: the views' TIMESTAMPTZ columns come out in UTC whatever the machine's zone,
# as the dashboard says; DuckDB takes TimeZone only as a SET, not in the connect config).
READER_CONFIG = {
    "enable_external_access": False,
    "autoload_known_extensions": False,
    "autoinstall_known_extensions": False,
    "python_enable_replacements": False,
    "lock_configuration": True,
}
READER_TIME_ZONE = "UTC"
FRESHNESS_KEY = b"flightrec.freshness"  # the schema metadata of every result: how fresh it is (JSON)


# ---- how fresh a result is ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Freshness:
    """How fresh a result is: the commit it was read as of, and how long commits it does not see have waited.

    ``source``: ``snapshot`` (a materializer runs and published it), ``file`` (no materializer runs: nothing
    waits) or ``lake`` (the lake's latest snapshot at the time of the read)."""

    source: str
    commits: int | None  # the database's commit number (every materializer run's commits counted)
    commit_us: int | None  # when that commit was made
    behind_s: float = 0.0

    def line(self) -> str:
        """'as of commit 1,234 (2026-12-05 10:00:01 UTC), 0.4 s behind the materializer'."""
        at = (
            datetime.fromtimestamp(self.commit_us / 1e6, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
            if self.commit_us
            else "no time known"
        )
        if self.source == "lake":
            return f"as of the lake's snapshot {self.commits}, the latest when it was read"
        what = f"as of commit {self.commits:,} ({at})" if self.commits else "as of no commit yet"
        if self.source == "snapshot":
            return f"{what}, {self.behind_s:.1f} s behind the materializer"
        return f"{what}; no materializer is running"

    def to_json(self) -> bytes:
        return json.dumps(self.__dict__).encode()


def freshness(table: pa.Table) -> Freshness | None:
    """The freshness a result of :func:`run_query` carries."""
    raw = (table.schema.metadata or {}).get(FRESHNESS_KEY)
    if not raw:
        return None
    try:
        return Freshness(**json.loads(raw))
    except (TypeError, ValueError):
        return None


def stamped(table: pa.Table, fresh: Freshness) -> pa.Table:
    meta = dict(table.schema.metadata or {})
    meta[FRESHNESS_KEY] = fresh.to_json()
    return table.replace_schema_metadata(meta)


def last_commit(con: duckdb.DuckDBPyConnection) -> tuple[int | None, int | None]:
    """(commit number, its time in µs) of the database ``con`` reads: the runs' commits summed, the latest end."""
    try:
        row = con.execute("SELECT sum(commits), max(last_commit_us) FROM main.materializer_runs").fetchall()[0]
    except duckdb.Error:
        return None, None  # not a flightrec database (yet)
    return (int(row[0]) if row[0] is not None else None), (int(row[1]) if row[1] is not None else None)


# ---- opening a file --------------------------------------------------------------------------------------


class FileBusy(QueryError):
    """Another process holds the file (a materializer; for a snapshot copy, the one making it current)."""


def open_read_only(db: str | Path, config: dict[str, str | int] | None = None) -> duckdb.DuckDBPyConnection:
    """Open the database file read-only with file access disabled (``config``: more of DuckDB's settings)."""
    path = Path(db)
    if not path.exists():
        raise QueryError(f"no database at {path}; run `flightrec materialize --db {path}` first")
    settings: dict[str, str | int | bool] = {
        k: v for k, v in READER_CONFIG.items() if k not in ("lock_configuration", "enable_external_access")
    }
    try:
        con = duckdb.connect(str(path), read_only=True, config={**settings, **(config or {})})
    except duckdb.IOException as exc:
        if "lock" in str(exc).lower():
            raise FileBusy(f"{path} is held by another process: {exc}") from exc
        raise QueryError(f"{path} is not a DuckDB database flightrec can read (check --db): {exc}") from exc
    try:  # another open connection of this process to the file shares its instance, already set and locked
        locked, zone = con.execute(
            "SELECT current_setting('lock_configuration'), current_setting('TimeZone')"
        ).fetchone()  # type: ignore[misc]  # a SELECT without FROM returns one row
        if not locked:
            if zone != READER_TIME_ZONE:
                con.execute(f"SET GLOBAL TimeZone = '{READER_TIME_ZONE}'")
            con.execute("SET enable_progress_bar = false")  # never drawn on a reader's terminal
            con.execute("SET enable_external_access = false")
            con.execute("SET lock_configuration = true")
    except BaseException:
        con.close()
        raise
    return con


class ResultTooLarge(QueryError):
    """A read's result passed the bytes a reader may have built for it."""


def _bounded_result(rel: duckdb.DuckDBPyRelation, max_bytes: int) -> pa.Table:
    """The relation's table, built batch by batch and given up (ResultTooLarge) once it holds over ``max_bytes``."""
    reader = rel.to_arrow_reader(1 << 13)
    batches, size = [], 0
    for batch in reader:
        size += batch.nbytes
        if size > max_bytes:
            raise ResultTooLarge(f"its result passed {max_bytes >> 20} MiB")
        batches.append(batch)
    return pa.Table.from_batches(batches, schema=reader.schema)


def execute_read_only(
    con: duckdb.DuckDBPyConnection,
    sql: str,
    params: Params = None,
    prelude: Sequence[str] = (),
    max_bytes: int | None = None,
) -> pa.Table:
    """Run the checked ``prelude`` statements (temp views), then the checked user statement.

    ``max_bytes``: the result is built batch by batch and given up (ResultTooLarge) once it holds more.
    """
    check_read_only(sql)
    for stmt in prelude:
        check_prelude(stmt)
    try:
        for stmt in prelude:
            con.execute(stmt)
    except duckdb.BinderException as exc:  # a view names a column the file's tables do not have (yet)
        raise QueryError(
            f"the readers' views do not fit the tables of this database ({' '.join(str(exc).split())}): "
            "it was probably written by an older flightrec; a materializer adds the new columns when it "
            "opens it (`flightrec materialize --db …`)"
        ) from exc
    except duckdb.Error as exc:
        raise QueryError(f"{type(exc).__name__}: {exc}") from exc
    try:
        rel = con.sql(sql, params=params) if params else con.sql(sql)
        if rel is None:
            return pa.table({})
        return rel.to_arrow_table() if max_bytes is None else _bounded_result(rel, max_bytes)
    except duckdb.Error as exc:
        raise QueryError(f"{type(exc).__name__}: {exc}") from exc
    except RuntimeError as exc:
        if "interrupted" in str(exc).lower():  # a stop signal (Ctrl-C) that DuckDB turned into this: stop
            raise KeyboardInterrupt from exc
        raise
