"""Live reads: the materializer answers read-only queries on a Unix socket next to its database.

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
(0600).

Why cursors of the writer and not a separate read-only instance: DuckDB lets no
other instance open the file while the writer holds it (not even read-only, not
even in the same process: a second ``duckdb.connect`` with other settings is
refused), so a cursor is the only way to read the live data; a cursor shares the
database instance and so its global settings, which is what the lock closes.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import socketserver
import threading
from pathlib import Path
from typing import Any

import duckdb

from flightrec.errors import MaterializeError, QueryError
from flightrec.query import (
    MAX_REQUEST,
    check_read_only,
    execute_read_only,
    params_from_json,
    recv_frame,
    send_frame,
    socket_path,
    table_to_ipc,
)

log = logging.getLogger(__name__)


class _Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True
    owner: "QueryServer"


class _Handler(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        owner: QueryServer = self.server.owner  # type: ignore[attr-defined]
        try:
            request = json.loads(recv_frame(self.request, MAX_REQUEST))
            payload = b"A" + table_to_ipc(owner.answer(request))
        except QueryError as exc:
            owner.counters["errors_total"] += 1
            payload = b"E" + str(exc).encode()
        except (ValueError, KeyError, TypeError) as exc:
            owner.counters["errors_total"] += 1
            payload = b"E" + f"bad request: {exc}".encode()
        except (ConnectionError, OSError):
            return
        try:
            send_frame(self.request, payload)
        except OSError:
            pass


class QueryServer:
    """Serves read-only queries over ``con``'s database on ``socket_path(db)``; use as a context manager."""

    def __init__(self, con: duckdb.DuckDBPyConnection, db: str | Path, query_timeout: float = 60.0) -> None:
        self.con = con
        self.path = socket_path(db)
        self.query_timeout = query_timeout
        self.counters = {"queries_served": 0, "errors_total": 0}
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def answer(self, request: dict[str, Any]) -> Any:
        """Run one request {sql, params, prelude} and return its Arrow table; QueryError when refused."""
        sql = request["sql"]
        if not isinstance(sql, str):
            raise QueryError("sql must be a string")
        check_read_only(sql)
        prelude = [str(p) for p in request.get("prelude") or ()]
        params = params_from_json(request.get("params"))
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
            self.counters["queries_served"] += 1
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
        """Bind the socket (replacing a stale one) and serve in a background thread."""
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
                self._server = _Server(str(self.path), _Handler)
            finally:
                os.umask(old)
        except OSError as exc:
            raise MaterializeError(f"cannot serve live queries on {self.path}: {exc}") from exc
        self._server.owner = self
        self._thread = threading.Thread(target=self._server.serve_forever, name="flightrec-query-server", daemon=True)
        self._thread.start()
        log.info("serving read-only queries on %s", self.path)

    def stop(self) -> None:
        """Stop serving and remove the socket file."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        self.path.unlink(missing_ok=True)
