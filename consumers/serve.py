"""Live reads: the materializer answers read-only queries (Arrow Flight) on a Unix socket next to its database.

Guarantees: each query runs on its own cursor of the writer's database, inside a
read-only transaction that is rolled back, so it sees exactly the last committed
batch (a consistent snapshot) and can change nothing (nor lock rows the writer
needs); the statement and the prelude are checked (``check_read_only``,
``check_prelude``, an allow-list by DuckDB statement type and syntax tree, see
flightrec.readonly) here again, whatever the client did. Behind that check, the
Store locks the database's configuration (``lock_configuration``) once its own
settings are made, so even a statement the check missed cannot change a setting
of the writer (memory_limit, threads, default_order ...), and turns file access,
extension autoloading and Python replacement scans off for the whole database.
Queries run past ``query_timeout`` are interrupted. The socket is made owner-only
(0600). The protocol (Arrow Flight DoGet, the ticket's layout, refusals) is
``flightrec.live``, which readers import too.

Why cursors of the writer and not a separate read-only instance: DuckDB lets no
other instance open the file while the writer holds it (not even read-only, not
even in the same process: a second ``duckdb.connect`` with other settings is
refused), so a cursor is the only way to read the live data; a cursor shares the
database instance and so its global settings, which is what the lock closes.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.flight as flight

from flightrec.errors import MaterializeError, QueryError
from flightrec.live import Params, decode_request, location, refuse, socket_path
from flightrec.query import check_read_only, execute_read_only

log = logging.getLogger(__name__)
ONLY_READS = "this endpoint answers read-only queries only (Flight DoGet with a flightrec.live ticket)"


class _FlightServer(flight.FlightServerBase):
    """DoGet only: the ticket is one read (flightrec.live); anything else is refused by Flight itself."""

    def __init__(self, owner: "QueryServer", where: str) -> None:
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
        self.counters = {"queries_served": 0, "errors_total": 0}
        self._server: _FlightServer | None = None
        self._lock = threading.Lock()

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
        timer = threading.Timer(self.query_timeout, cur.interrupt)
        try:
            timer.start()
            # READ ONLY: a statement that writes inside a checked one (EXPLAIN ANALYZE DELETE ...)
            # fails here instead of holding row locks that would make the writer's commit conflict.
            cur.execute("BEGIN TRANSACTION READ ONLY")
            try:
                table = execute_read_only(cur, sql, params, prelude)
            finally:
                try:
                    cur.execute("ROLLBACK")
                except duckdb.Error:
                    pass
            self.count("queries_served")
            return table
        finally:
            timer.cancel()
            cur.close()

    def __enter__(self) -> "QueryServer":
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
        self.path.unlink(missing_ok=True)
