"""Read-only SQL over a flightrec database, whether or not a materializer holds it.

This is the one door readers (``flightrec sql``, the dashboard, ``timeline``)
use. Guarantees: the statement is one a reader may run (decided by DuckDB's own
parser, see ``flightrec.readonly``), cannot read or write files, and returns a
pyarrow Table. Parameters are bound,
never pasted into SQL text. ``prelude`` holds temp views (checked: one
``CREATE TEMP VIEW`` each) run first on the same connection.

While a materializer runs it holds DuckDB's write lock and no other process can
open the file; it then serves queries on a Unix socket next to the database
(:func:`socket_path`, see ``flightrec.consumers.serve``), answering with Arrow
IPC from a snapshot of its last commit. ``run_query`` asks that socket first
and opens the file read-only when nobody answers.
"""

from __future__ import annotations

import datetime as _dt
import decimal
import hashlib
import io
import json
import socket
import struct
import time
from pathlib import Path
from typing import Any, Sequence

import duckdb
import pyarrow as pa

from flightrec.errors import QueryError
from flightrec.readonly import READ_PRAGMAS, check_prelude, check_read_only  # noqa: F401 - re-exported

_FRAME = struct.Struct(">Q")
MAX_REQUEST = 16 * 1024 * 1024
Params = Sequence[Any] | dict[str, Any] | None
# The file path's own DuckDB instance: no files, no extensions, no Python objects, settings locked.
READER_CONFIG = {"enable_external_access": False, "autoload_known_extensions": False,
                 "autoinstall_known_extensions": False, "python_enable_replacements": False,
                 "lock_configuration": True}


def socket_path(db: str | Path) -> Path:
    """Where a materializer writing ``db`` serves queries: ``<db>.sock``, or a short path in /tmp
    when that would be too long for a Unix socket address."""
    path = Path(db).absolute()
    sock = path.with_name(path.name + ".sock")
    if len(str(sock).encode()) < 100:
        return sock
    digest = hashlib.sha256(str(path).encode()).hexdigest()[:20]
    return Path("/tmp") / f"flightrec-{digest}.sock"


def open_read_only(db: str | Path) -> duckdb.DuckDBPyConnection:
    """Open the database file read-only with file access disabled."""
    path = Path(db)
    if not path.exists():
        raise QueryError(f"no database at {path}; run `flightrec materialize --db {path}` first")
    try:
        return duckdb.connect(str(path), read_only=True, config=READER_CONFIG)
    except duckdb.IOException as exc:
        raise QueryError(
            f"{path} is held by another process and it serves no queries: {exc}", ) from exc


def execute_read_only(con: duckdb.DuckDBPyConnection, sql: str, params: Params = None,
                      prelude: Sequence[str] = ()) -> pa.Table:
    """Run the checked ``prelude`` statements (temp views), then the checked user statement."""
    check_read_only(sql)
    for stmt in prelude:
        check_prelude(stmt)
    try:
        for stmt in prelude:
            con.execute(stmt)
        rel = con.sql(sql, params=params) if params else con.sql(sql)
        if rel is None:
            return pa.table({})
        return rel.to_arrow_table()
    except duckdb.Error as exc:
        raise QueryError(f"{type(exc).__name__}: {exc}") from exc


# -- the live path: a tiny framed protocol over a Unix socket ---------------------

def send_frame(sock: socket.socket, payload: bytes) -> None:
    """Send one length-prefixed frame."""
    sock.sendall(_FRAME.pack(len(payload)) + payload)


def recv_frame(sock: socket.socket, limit: int | None = None) -> bytes:
    """Receive one length-prefixed frame; ConnectionError when the peer goes away."""
    head = _recv_exact(sock, _FRAME.size)
    (n,) = _FRAME.unpack(head)
    if limit is not None and n > limit:
        raise ConnectionError(f"frame of {n} bytes is over the limit of {limit}")
    return _recv_exact(sock, n)


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(min(n - len(buf), 1 << 20))
        if not chunk:
            raise ConnectionError("the peer closed the connection")
        buf += chunk
    return bytes(buf)


def _to_json(value: Any) -> Any:
    if isinstance(value, _dt.datetime):
        return {"$datetime": value.isoformat()}
    if isinstance(value, _dt.date):
        return {"$date": value.isoformat()}
    if isinstance(value, decimal.Decimal):
        return float(value)
    if isinstance(value, (list, tuple)):
        return [_to_json(v) for v in value]
    if isinstance(value, dict):
        return {k: _to_json(v) for k, v in value.items()}
    if hasattr(value, "item"):  # numpy scalars
        return value.item()
    return value


def params_from_json(value: Any) -> Any:
    """The inverse of the client's parameter encoding (datetimes and dates are tagged)."""
    if isinstance(value, dict):
        if set(value) == {"$datetime"}:
            return _dt.datetime.fromisoformat(value["$datetime"])
        if set(value) == {"$date"}:
            return _dt.date.fromisoformat(value["$date"])
        return {k: params_from_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [params_from_json(v) for v in value]
    return value


def encode_request(sql: str, params: Params, prelude: Sequence[str]) -> bytes:
    """The request frame's payload."""
    try:
        return json.dumps({"sql": sql, "params": _to_json(params), "prelude": list(prelude)}).encode()
    except (TypeError, ValueError) as exc:
        raise QueryError(f"query parameters must be plain values (str, numbers, dates): {exc}") from exc


def table_to_ipc(table: pa.Table) -> bytes:
    """A table as one Arrow IPC stream."""
    sink = io.BytesIO()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue()


def query_live(db: str | Path, sql: str, params: Params = None, prelude: Sequence[str] = (),
               timeout: float = 120.0) -> pa.Table | None:
    """Ask the materializer serving ``db``; None when none answers (no socket, or a stale one)."""
    path = socket_path(db)
    if not path.exists():
        return None
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        try:
            sock.connect(str(path))
        except (ConnectionRefusedError, FileNotFoundError):
            return None  # a materializer that died left its socket file behind
        send_frame(sock, encode_request(sql, params, prelude))
        reply = recv_frame(sock)
    except (OSError, ConnectionError) as exc:
        raise QueryError(f"the materializer serving {db} stopped answering: {exc}; retry") from exc
    finally:
        sock.close()
    if reply[:1] == b"A":
        return pa.ipc.open_stream(reply[1:]).read_all()
    raise QueryError(reply[1:].decode("utf-8", "replace"))


def run_query(db: str | Path, sql: str, params: Params = None, prelude: Sequence[str] = ()) -> pa.Table:
    """Run one read-only statement against the database and return its rows as Arrow."""
    check_read_only(sql)
    deadline = time.monotonic() + 5.0
    while True:
        live = query_live(db, sql, params, prelude)
        if live is not None:
            return live
        try:
            con = open_read_only(db)
        except QueryError:
            # A materializer may be starting (lock taken, socket not yet up): retry briefly.
            if time.monotonic() < deadline and Path(db).exists():
                time.sleep(0.2)
                continue
            raise
        try:
            return execute_read_only(con, sql, params, prelude)
        finally:
            con.close()
