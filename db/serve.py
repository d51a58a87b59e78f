"""Live reads: the materializer answers read-only queries (Arrow Flight) on a Unix socket next to its database.

Guarantees: each query runs on its own cursor of the writer's database, inside a
read-only transaction that is rolled back, so it sees exactly the last committed
batch (a consistent snapshot) and can change nothing (nor lock rows the writer
needs); the statement and the prelude are checked (``check_read_only``,
``check_prelude``, an allow-list by DuckDB statement type and syntax tree, see
flightrec.db.readonly) here again, whatever the client did. Behind that check, the
Store locks the database's configuration (``lock_configuration``) once its own
settings are made, so even a statement the check missed cannot change a setting
of the writer (memory_limit, threads, default_order ...), and turns file access,
extension autoloading and Python replacement scans off for the whole database.
Queries run past ``query_timeout`` are interrupted. The socket is made owner-only
(0600).

The writer always wins: a cursor shares the writer's memory, so a read that grows
(a huge aggregate, a sort of everything) could leave the writer's next commit
without memory. While reads run, a watchdog samples DuckDB's memory every
``WATCH_S``; when the query operators' memory (hash tables, sorts, windows) passes
``READER_SHARE`` of the memory limit, or what reads spilled to disk passes
``READER_SPILL_BYTES``, it interrupts the running reads, which are told in one line
that the query is too large for a live read and what to do instead. And should a
commit still meet "Out of Memory", the store interrupts the reads and commits again
(:meth:`QueryServer.make_room`, given to ``Store.make_room``). The protocol (Arrow Flight DoGet, the ticket's layout,
refusals) is ``flightrec.db.live``, which readers import too.

Why cursors of the writer and not a separate read-only instance: DuckDB lets no
other instance open the file while the writer holds it (not even read-only, not
even in the same process: a second ``duckdb.connect`` with other settings is
refused), so a cursor is the only way to read the live data; a cursor shares the
database instance and so its global settings, which is what the lock closes.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.flight as flight
from flightrec.db.live import Params, decode_request, location, refuse, socket_path
from flightrec.db.query import ResultTooLarge, check_read_only, execute_read_only

from flightrec.errors import MaterializeError, QueryError

log = logging.getLogger(__name__)
ONLY_READS = "this endpoint answers read-only queries only (Flight DoGet with a flightrec.db.live ticket)"
WATCH_S = 0.05  # how often the memory of running reads is looked at
READER_SHARE = 0.5  # of the memory limit that the operators of running reads may hold, the rest is the writer's
READER_SPILL_BYTES = 1 << 30  # what running reads may spill to disk next to the database
RESULT_SHARE = 0.5  # of the memory limit that one read's result may hold (it lives outside DuckDB's limit)
# duckdb_memory() tags of what a query holds while it runs: operators (hash tables, sorts, windows), aggregate
# states and expressions (ALLOCATOR: list(), string_agg()), materialized CTEs and results (COLUMN_DATA)
OPERATOR_TAGS = ("HASH_TABLE", "ORDER_BY", "WINDOW", "ALLOCATOR", "COLUMN_DATA")
TOO_LARGE = (
    "the query is too large for a live read ({why}): it was stopped so that the materializer keeps "
    "committing. Narrow it (a WHERE on instance_id or ts_us, a LIMIT, fewer DISTINCT keys), or run it on a "
    "copy of the database (`cp {db} /tmp/copy.duckdb` while no commit runs, or `flightrec replay --db "
    "/tmp/copy.duckdb`), where it competes with nothing"
)
_UNITS = {
    "B": 1,
    "BYTES": 1,
    "KB": 1000,
    "MB": 1000**2,
    "GB": 1000**3,
    "TB": 1000**4,
    "KIB": 1024,
    "MIB": 1024**2,
    "GIB": 1024**3,
    "TIB": 1024**4,
}


def memory_bytes(setting: str) -> int:
    """DuckDB's memory_limit as it shows it ('488.2 MiB') in bytes."""
    number, _, unit = setting.strip().partition(" ")
    return int(float(number) * _UNITS.get(unit.strip().upper() or "B", 1))


class _FlightServer(flight.FlightServerBase):
    """DoGet only: the ticket is one read (flightrec.db.live); anything else is refused by Flight itself."""

    def __init__(self, owner: QueryServer, where: str) -> None:
        super().__init__(where)
        self.owner = owner

    def do_get(self, context: flight.ServerCallContext, ticket: flight.Ticket) -> flight.RecordBatchStream:
        owner = self.owner
        try:
            sql, params, prelude = decode_request(ticket.ticket)
            return flight.RecordBatchStream(owner.answer(sql, params, prelude))
        except QueryError as exc:
            owner.count("errors_total")
            raise refuse(str(exc)) from None
        except Exception as exc:  # noqa: BLE001 - one line to the reader, the traceback in our log
            owner.count("errors_total")
            log.exception("a live read failed")
            raise refuse(f"the materializer could not answer: {type(exc).__name__}: {exc}") from None

    # Every other Flight call is refused with one line (not Flight's default traceback).
    def list_flights(self, context: Any, criteria: Any) -> Any:
        raise refuse(ONLY_READS)

    def get_flight_info(self, context: Any, descriptor: Any) -> Any:
        raise refuse(ONLY_READS)

    def get_schema(self, context: Any, descriptor: Any) -> Any:
        raise refuse(ONLY_READS)

    def do_put(self, context: Any, descriptor: Any, reader: Any, writer: Any) -> None:
        raise refuse(ONLY_READS)

    def do_exchange(self, context: Any, descriptor: Any, reader: Any, writer: Any) -> None:
        raise refuse(ONLY_READS)

    def list_actions(self, context: Any) -> Any:
        raise refuse(ONLY_READS)

    def do_action(self, context: Any, action: Any) -> Any:
        raise refuse(ONLY_READS)


class QueryServer:
    """Serves read-only queries over ``con``'s database on ``socket_path(db)``; use as a context manager."""

    def __init__(self, con: duckdb.DuckDBPyConnection, db: str | Path, query_timeout: float = 60.0) -> None:
        self.con = con
        self.db = db
        self.path = socket_path(db)
        self.query_timeout = query_timeout
        self.counters = {"queries_served": 0, "errors_total": 0, "reads_stopped": 0}
        self._server: _FlightServer | None = None
        self._lock = threading.Lock()
        self._running: dict[int, Any] = {}  # id -> cursor of each read running now
        self._stopped: dict[int, str] = {}  # id -> why the watchdog (or a commit) stopped it
        self._watcher: threading.Thread | None = None
        self._wake = threading.Condition(self._lock)
        self._closing = False
        # fetchall: a result left open keeps its transaction open, and a table made after it (DDL) then stops every
        # checkpoint: the WAL would grow as long as the materializer runs (tests/consumers/test_wal_checkpoints.py)
        limit = con.execute("SELECT value FROM duckdb_settings() WHERE name = 'memory_limit'").fetchall()
        self.memory_limit = memory_bytes(limit[0][0]) if limit else 0
        self._probe = con.cursor()  # the watchdog's own cursor (a cursor is used by one thread at a time)

    def count(self, name: str) -> None:
        """Add one to a counter (from any serving thread)."""
        with self._lock:
            self.counters[name] += 1

    def answer(self, sql: Any, params: Params, prelude: list[str]) -> pa.Table:
        """Run one read and return its Arrow table; QueryError when refused."""
        if not isinstance(sql, str):
            raise QueryError("sql must be a string")
        check_read_only(sql)
        with self._lock:  # cursors are created from the writer connection one at a time
            cur = self.con.cursor()
            key = id(cur)
            self._running[key] = cur
            self._start_watching()
        timer = threading.Timer(self.query_timeout, cur.interrupt)
        try:
            timer.start()
            # READ ONLY: a statement that writes inside a checked one (EXPLAIN ANALYZE DELETE ...)
            # fails here instead of holding row locks that would make the writer's commit conflict.
            cur.execute("BEGIN TRANSACTION READ ONLY")
            try:
                table = execute_read_only(
                    cur, sql, params, prelude, max_bytes=int(self.memory_limit * RESULT_SHARE) or None
                )
            except ResultTooLarge as exc:
                self.count("reads_stopped")
                raise QueryError(TOO_LARGE.format(why=str(exc), db=self.db)) from None
            except QueryError:
                why = self._stopped.get(key)
                if why is not None:
                    raise QueryError(TOO_LARGE.format(why=why, db=self.db)) from None
                raise
            finally:
                with contextlib.suppress(duckdb.Error):
                    cur.execute("ROLLBACK")
            self.count("queries_served")
            return table
        finally:
            timer.cancel()
            with self._lock:
                self._running.pop(key, None)
                self._stopped.pop(key, None)
            cur.close()

    def make_room(self, why: str) -> int:
        """Interrupt every running read (the writer needs the memory); returns how many were running."""
        with self._lock:
            running = list(self._running.items())
            for key, _cur in running:
                self._stopped.setdefault(key, why)
        for _key, cur in running:
            with contextlib.suppress(duckdb.Error):
                cur.interrupt()
        if running:
            with self._lock:
                self.counters["reads_stopped"] += len(running)
            log.warning("stopped %d live reads: %s", len(running), why)
        return len(running)

    def _start_watching(self) -> None:
        """(under the lock) The watchdog runs while reads run."""
        if self._watcher is None or not self._watcher.is_alive():
            self._watcher = threading.Thread(target=self._watch, name="flightrec-read-watch", daemon=True)
            self._watcher.start()
        self._wake.notify()

    def _usage(self) -> tuple[int, int]:
        """(bytes the query operators hold, bytes spilled to disk) in the whole database now."""
        rows = self._probe.execute(
            "SELECT tag, memory_usage_bytes, temporary_storage_bytes FROM duckdb_memory()"
        ).fetchall()
        return (sum(m for tag, m, _t in rows if tag in OPERATOR_TAGS), sum(t for _tag, _m, t in rows))

    def _watch(self) -> None:
        """Sample the memory while reads run; stop them when they take what the writer needs."""
        budget = int(self.memory_limit * READER_SHARE)
        while True:
            with self._lock:
                while not self._running and not self._closing:
                    self._wake.wait()
                if self._closing:
                    return
            time.sleep(WATCH_S)  # a read shorter than this is never sampled
            with self._lock:
                if not self._running:
                    continue
            try:
                held, spilled = self._usage()
            except duckdb.Error as exc:  # the database is closing
                log.debug("read watchdog: %s", exc)
                return
            if budget and held > budget:
                self.make_room(
                    f"its hash tables and sorts passed {budget >> 20} MiB, half of the materializer's memory limit"
                )
            elif spilled > READER_SPILL_BYTES:
                self.make_room(f"it spilled over {READER_SPILL_BYTES >> 20} MiB to disk next to the database")

    def __enter__(self) -> QueryServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        """Bind the socket (replacing a stale one) and serve on Flight's own threads."""
        if self.path.exists():
            probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                probe.connect(str(self.path))
                raise MaterializeError(f"{self.path} is served by another process; is another materializer running?")
            except (ConnectionRefusedError, FileNotFoundError):
                self.path.unlink(missing_ok=True)
            finally:
                probe.close()
        try:
            old = os.umask(0o177)
            try:
                self._server = _FlightServer(self, location(self.db))
            finally:
                os.umask(old)
            os.chmod(self.path, 0o600)
        except (OSError, flight.FlightError, pa.ArrowException) as exc:
            raise MaterializeError(f"cannot serve live queries on {self.path}: {exc}") from exc
        log.info("serving read-only queries on %s", self.path)

    def stop(self) -> None:
        """Stop serving and remove the socket file."""
        if self._server is not None:
            self._server.shutdown()
            self._server = None
        with self._lock:
            self._closing = True
            self._wake.notify_all()
        if self._watcher is not None:
            self._watcher.join(5.0)
        self.path.unlink(missing_ok=True)


def close_cursors(server: QueryServer) -> None:
    """Close the cursors a stopped server holds on the writer's database (its root and the watchdog's), so that
    the database can be closed and opened again (a compaction, a database DuckDB invalidated)."""
    for cur in (server._probe, server.con):
        with contextlib.suppress(duckdb.Error):
            cur.close()
