"""The live read protocol on Arrow Flight: what a reader sends the materializer and how the answer comes back.

Both sides import this module: readers (``flightrec.db.query``) call :func:`query_live`;
the materializer (``flightrec.db.serve``) decodes requests with
:func:`decode_request` and answers with :func:`refuse` or a record batch stream.

The protocol is Arrow Flight's ``DoGet`` over a Unix socket (``grpc+unix://<db>.sock``,
:func:`socket_path`). The ticket is one Arrow IPC stream holding a one-row table:
``sql`` (string), ``prelude`` (list of strings) and ``params`` (a struct, one field per
parameter: ``"0"``, ``"1"``... for positional ones, the names for named ones), so
dates, timestamps and decimals keep their types with no encoding of our own. The answer
is the result's record batches; a refusal is a Flight server error whose ``extra_info``
holds the message (the QueryError text) a reader shows.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import io
import socket
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.flight as flight

from flightrec.errors import QueryError

Params = Sequence[Any] | dict[str, Any] | None
MAX_REQUEST = 16 * 1024 * 1024  # ticket bytes a server accepts
_NAMED = b"flightrec.named"  # schema metadata: the params struct holds named parameters
_REFUSED = b"flightrec.refused:"  # extra_info prefix of a refusal


def socket_path(db: str | Path) -> Path:
    """Where a materializer writing ``db`` serves queries: ``<db>.sock``, or a short path in /tmp
    when that would be too long for a Unix socket address."""
    path = Path(db).absolute()
    sock = path.with_name(path.name + ".sock")
    if len(str(sock).encode()) < 100:
        return sock
    digest = hashlib.sha256(str(path).encode()).hexdigest()[:20]
    return Path("/tmp") / f"flightrec-{digest}.sock"


def location(db: str | Path) -> str:
    """The Flight location of the materializer serving ``db``."""
    return f"grpc+unix://{socket_path(db)}"


def encode_request(sql: str, params: Params, prelude: Sequence[str]) -> bytes:
    """The ticket of one read: Arrow IPC of a one-row table (sql, prelude, params)."""
    named = isinstance(params, dict)
    values = dict(params) if isinstance(params, dict) else {str(i): v for i, v in enumerate(params or ())}
    try:
        arr = pa.array([values]) if values else pa.array([{}], type=pa.struct([]))
        table = pa.table(
            {
                "sql": pa.array([sql], pa.string()),
                "prelude": pa.array([list(prelude)], pa.list_(pa.string())),
                "params": arr,
            }
        )
    except (pa.ArrowException, TypeError, ValueError) as exc:
        raise QueryError(f"query parameters must be plain values (str, numbers, dates): {exc}") from exc
    table = table.replace_schema_metadata({_NAMED: b"1" if named else b"0"})
    sink = io.BytesIO()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue()


def decode_request(ticket: bytes) -> tuple[str, Params, list[str]]:
    """(sql, params, prelude) from a ticket; QueryError when it is not one."""
    if len(ticket) > MAX_REQUEST:
        raise QueryError(f"bad request: {len(ticket)} bytes is over the limit of {MAX_REQUEST}")
    try:
        table = pa.ipc.open_stream(ticket).read_all()
        if table.num_rows != 1 or not {"sql", "prelude", "params"} <= set(table.column_names):
            raise ValueError("expected one row of sql, prelude, params")
        row = table.to_pylist()[0]
        sql, prelude, values = row["sql"], row["prelude"] or [], row["params"] or {}
        if not isinstance(sql, str) or not isinstance(values, dict):
            raise ValueError("sql must be a string and params a struct")
    except (pa.ArrowException, OSError, ValueError, TypeError, KeyError) as exc:
        raise QueryError(f"bad request: {exc}") from exc
    named = (table.schema.metadata or {}).get(_NAMED) == b"1"
    params: Params = values if named else [values[str(i)] for i in range(len(values))] if values else None
    if named and not values:
        params = None
    return sql, params, [str(p) for p in prelude]


def refuse(message: str) -> flight.FlightServerError:
    """The error a server raises to refuse a read; the reader gets ``message`` as a QueryError."""
    return flight.FlightServerError(message, extra_info=_REFUSED + message.encode())


def _served(path: Path) -> bool:
    """Whether a process listens on the socket file (False for one a killed materializer left behind)."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(str(path))
        return True
    except (ConnectionRefusedError, FileNotFoundError):
        return False
    finally:
        probe.close()


def query_live(
    db: str | Path, sql: str, params: Params = None, prelude: Sequence[str] = (), timeout: float = 120.0
) -> pa.Table | None:
    """Ask the materializer serving ``db``; None when none answers (no socket, or a stale one)."""
    path = socket_path(db)
    if not path.exists() or not _served(path):
        return None
    ticket = flight.Ticket(encode_request(sql, params, prelude))
    where = location(db)
    options = flight.FlightCallOptions(timeout=timeout)
    try:
        try:
            return _client(where).do_get(ticket, options).read_all()
        except flight.FlightUnavailableError:
            # The kept channel may predate a restarted materializer: one more try on a fresh one.
            _client.cache_clear()
            return _client(where).do_get(ticket, options).read_all()
    except flight.FlightServerError as exc:
        info = exc.extra_info or b""
        if info.startswith(_REFUSED):
            raise QueryError(info[len(_REFUSED) :].decode("utf-8", "replace")) from None
        raise QueryError(f"the materializer serving {db} failed the query: {exc}") from exc
    except (flight.FlightError, pa.ArrowException, OSError) as exc:
        _client.cache_clear()  # the next read opens a fresh channel
        raise QueryError(f"the materializer serving {db} stopped answering: {exc}; retry") from exc


@contextlib.contextmanager
def python_signals() -> Iterator[None]:
    """Inside the block every stop signal reaches the process's own handlers, also one that lands as a live read
    ends (a context manager for code that reads live in a loop and must stop on Ctrl-C).

    During each Flight read pyarrow puts its own handler in for SIGINT and SIGTERM and passes the signal on from
    a thread of its own; one that landed as the read ended was dropped (1 to 6 of 500 in the tests). With
    pyarrow's handling off, a signal that comes during a read waits for the read's end (reads are short) and
    then raises as usual. pyarrow's default (on) is back after the block.
    """
    pa.enable_signal_handlers(False)
    try:
        yield
    finally:
        pa.enable_signal_handlers(True)


@functools.lru_cache(maxsize=8)
def _client(where: str) -> flight.FlightClient:
    """One Flight client (a gRPC channel, thread-safe, reconnecting) per location for the process's reads."""
    return flight.FlightClient(where)
