"""A read in a process of its own, bounded by the OS: how a reader's own SQL runs (`flightrec sql`, the console).

The statement is checked and run in a child process that opens the database file itself (a snapshot copy, or the
file when no materializer runs: ``Target``), so nothing it does happens in the materializer's process or in the
process that asked (the dashboard serves other pages meanwhile). The child is bounded by :class:`ReadLimits`:

- **memory**: ``RLIMIT_AS``, the address space the child may add to what it had when it started (the kernel refuses
  the allocation past it; DuckDB then fails the query with "Out of Memory", Python with MemoryError). Chosen over
  cgroups (``memory.max`` bounds resident memory more exactly, but needs a cgroup delegated to the user, which CI
  containers and many hosts do not give) and over ``RLIMIT_DATA`` (the same accounting of reserved memory, minus
  mappings of files; no gain). RLIMIT_AS counts memory reserved, not touched, so the budget is added to the
  child's own size at start, and DuckDB's own ``memory_limit`` is set to half of it, with no temporary folder:
  a read never spills to disk (a reader's spill files once delayed the writer's commits: their writeback and the
  writer's fsync share the disk and its journal), it runs out of memory instead;
- **time**: DuckDB is interrupted at ``seconds``; ``SIGALRM`` ends the child a second later whatever it is doing
  (building one huge value is not interrupted), and the asker kills it at five;
- **result**: a result over a quarter of the memory budget is given up as it is built (it is then sent to the
  asker batch by batch, never copied whole);
- **CPU**: the child runs at nice 10 from its fork on (the fork server too), so that the materializer (nice 0) gets
  the cores first; on a machine busy with other work a read is slower for it.

Each limit, when it stops a read, is named in one line (:class:`QueryError`). How the child is made: by ``fork``
when the asking process said it may (:func:`allow_fork`: `flightrec sql`, one thread and no DuckDB database
opened: a few ms), else by a fork server of our own (``_Zygote``: one small process per asking process, started at
its first such read, that forks a child per read and reports its exit status), because forking a process whose
other threads may hold locks, or whose DuckDB has databases open, is unsafe.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import io
import json
import logging
import os
import resource
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from flightrec.errors import QueryError

log = logging.getLogger(__name__)

Params = Sequence[Any] | dict[str, Any] | None
# What a child runs: (target, sql, params, prelude, limits) -> table; a module's function, found by its name
Runner = Callable[..., pa.Table]
NICE = 10  # the read's process yields the cores to the materializer (weight 110 against its 1024)
HARD_STOP_S = 1.0  # SIGALRM ends the child this long after its time limit, whatever it is doing
ASKER_STOP_S = 5.0  # the asker kills it this long after its time limit
_NAMED = b"flightrec.named"  # schema metadata of a request: the params struct holds named parameters
MIB = 1 << 20


def human_bytes(n: int) -> str:
    """1 GiB, 512 MiB, 64 KiB. Pure."""
    for unit, size in (("GiB", 1 << 30), ("MiB", MIB), ("KiB", 1 << 10)):
        if n >= size:
            value = n / size
            return f"{value:.0f} {unit}" if value == int(value) else f"{value:.1f} {unit}"
    return f"{n} bytes"


_UNITS = {"": 1, "B": 1, "KB": 1000, "MB": 1000**2, "GB": 1000**3, "TB": 1000**4}
_UNITS.update({"KIB": 1 << 10, "MIB": 1 << 20, "GIB": 1 << 30, "TIB": 1 << 40})


def parse_bytes(text: str) -> int:
    """'4GB', '512MiB', '1e9' -> bytes; ValueError for anything else. Pure."""
    t = text.strip().upper().replace(" ", "")
    number = t.rstrip("KMGTIB")
    unit = t[len(number) :]
    if unit not in _UNITS or not number:
        raise ValueError(f"{text!r} is no size: use a number with KB, MB, GB, MiB, GiB ...")
    value = float(number) * _UNITS[unit]
    if not value > 0:
        raise ValueError(f"{text!r}: a size must be above 0")
    return int(value)


@dataclass(frozen=True)
class ReadLimits:
    """What one read in its own process may take. The defaults are the `flightrec sql` flags' and the console's."""

    memory: int = 1 << 30  # bytes of address space the read's process may add to its own (RLIMIT_AS)
    seconds: float = 60.0
    threads: int = 2

    @property
    def result_bytes(self) -> int:
        """A result is given up once it holds this much (DuckDB's half of the budget is beside it)."""
        return self.memory // 4

    def memory_message(self, how: str = "") -> str:
        return (
            f"stopped by the memory limit: {human_bytes(self.memory)} for the read's own process (RLIMIT_AS; "
            f"DuckDB keeps half of it, and a read never spills to disk){how}; narrow the query "
            f"(a WHERE on instance_id or ts_us, a LIMIT, fewer DISTINCT keys) or ask for more "
            f"(`flightrec sql --memory-limit 4GB`)"
        )

    def time_message(self) -> str:
        return (
            f"stopped by the time limit of {self.seconds:g} s; narrow the query or give it longer "
            f"(`flightrec sql --timeout 600`)"
        )

    def result_message(self) -> str:
        return (
            f"stopped by the result limit: its result passed {human_bytes(self.result_bytes)} (a quarter of the "
            f"memory limit); add a LIMIT or aggregate, or raise it with `flightrec sql --memory-limit`"
        )


@dataclass(frozen=True)
class Target:
    """What the child opens: a snapshot copy (``snapshot``) or the database file itself (``file``: no materializer
    runs; the read gives the file up when one asks for it, flightrec.db.query)."""

    kind: str
    path: Path
    db: Path  # the database the target belongs to (the give-way notice is next to it)


class Retry(Exception):
    """The read did not run and should be asked again: its copy was taken for a newer snapshot, or it gave the file up
    to a starting materializer (``why``: 'busy' or 'gave_way'), with the child's message."""

    def __init__(self, why: str, message: str) -> None:
        super().__init__(message)
        self.why = why


# ---- the request: Arrow IPC of one row, so parameters keep their types ---------------------------------------


def encode_request(
    runner: str, target: Target, sql: str, params: Params, prelude: Sequence[str], limits: ReadLimits
) -> bytes:
    """The request as Arrow IPC: one row of sql, prelude, params (a struct, one field per parameter) and a JSON of
    the runner (``module:function``), the target and the limits."""
    named = isinstance(params, dict)
    values = dict(params) if isinstance(params, dict) else {str(i): v for i, v in enumerate(params or ())}
    how = {"runner": runner, "kind": target.kind, "path": str(target.path), "db": str(target.db), **limits.__dict__}
    try:
        arr = pa.array([values]) if values else pa.array([{}], type=pa.struct([]))
        table = pa.table(
            {
                "sql": pa.array([sql], pa.string()),
                "prelude": pa.array([list(prelude)], pa.list_(pa.string())),
                "params": arr,
                "how": pa.array([json.dumps(how)], pa.string()),
            }
        )
    except (pa.ArrowException, TypeError, ValueError) as exc:
        raise QueryError(f"query parameters must be plain values (str, numbers, dates): {exc}") from exc
    table = table.replace_schema_metadata({_NAMED: b"1" if named else b"0"})
    sink = io.BytesIO()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue()


def decode_request(data: bytes) -> tuple[str, Target, str, Params, list[str], ReadLimits]:
    """The request :func:`encode_request` made."""
    table = pa.ipc.open_stream(data).read_all()
    row = table.to_pylist()[0]
    how = json.loads(row["how"])
    runner = str(how.pop("runner"))
    target = Target(how.pop("kind"), Path(how.pop("path")), Path(how.pop("db")))
    limits = ReadLimits(**how)
    values = row["params"] or {}
    named = (table.schema.metadata or {}).get(_NAMED) == b"1"
    params: Params = (values or None) if named else ([values[str(i)] for i in range(len(values))] or None)
    return runner, target, row["sql"], params, [str(p) for p in row["prelude"] or []], limits


# ---- the child ------------------------------------------------------------------------------------------------


def _die_with_parent() -> None:
    """The child ends when the process that made it does (Linux's PR_SET_PDEATHSIG; elsewhere a no-op)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _own_size() -> int:
    """The process's address space now (bytes)."""
    try:
        return int(Path("/proc/self/statm").read_text().split()[0]) * resource.getpagesize()
    except (OSError, ValueError, IndexError):
        return 0


def _bound(limits: ReadLimits) -> None:
    """The OS limits of the read's process (in the child, before it reads anything; its nice is set already)."""
    signal.signal(signal.SIGALRM, signal.SIG_DFL)
    signal.alarm(max(1, int(limits.seconds + HARD_STOP_S + 0.999)))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    size = _own_size()
    if size:
        resource.setrlimit(resource.RLIMIT_AS, (size + limits.memory, size + limits.memory))


def _frame(kind: bytes, payload: bytes | dict[str, Any]) -> bytes:
    return kind + (payload if isinstance(payload, bytes) else json.dumps(payload).encode())


def _resolve(runner: str) -> Runner:
    """The function a request names (``module:function``; the fork server has its module loaded already)."""
    module, _, name = runner.partition(":")
    fn: Runner = getattr(importlib.import_module(module), name)
    return fn


def serve_request(request: bytes) -> tuple[bytes, pa.Table | None]:
    """Run one request in this (child) process, bounded: the answer's frame (its first byte only, for a table) and
    the table. Never raises."""
    limits = ReadLimits()
    try:
        runner, target, sql, params, prelude, limits = decode_request(request)
        _bound(limits)
        return b"T", _resolve(runner)(target, sql, params, prelude, limits)
    except Retry as exc:
        return _frame(b"R", {"why": exc.why, "message": str(exc)}), None
    except QueryError as exc:
        return _frame(b"E", {"message": " ".join(str(exc).split())}), None
    except Exception as exc:  # noqa: BLE001 - one line to the asker
        if isinstance(exc, MemoryError | pa.ArrowMemoryError) or "out of memory" in str(exc).lower():
            return _frame(b"E", {"message": limits.memory_message()}), None
        return _frame(b"E", {"message": " ".join(f"the read failed: {type(exc).__name__}: {exc}".split())}), None


def _send(sock: socket.socket, frame: bytes, table: pa.Table | None) -> None:
    """The frame, then the table's batches as an Arrow IPC stream, written to the socket as they are encoded."""
    sock.sendall(frame)
    if table is None:
        return
    with sock.makefile("wb") as out, pa.ipc.new_stream(pa.PythonFile(out, mode="w"), table.schema) as writer:
        for batch in table.to_batches(max_chunksize=1 << 13):
            writer.write_batch(batch)


def _child(sock: socket.socket, request: bytes | None) -> int:
    """The child's whole life: read the request (when not inherited), answer it, exit."""
    from flightrec.db.nopandas import keep_pandas_out

    _die_with_parent()
    keep_pandas_out()  # pyarrow would import it at its first conversion, in every read's process (db/nopandas.py)
    if request is None:
        request = _recv_all(sock, None)
    frame, table = serve_request(request)
    try:
        _send(sock, frame, table)
    except MemoryError:
        return 3
    except OSError:
        return 1
    return 0


def _recv_all(sock: socket.socket, deadline: float | None) -> bytes:
    chunks: list[bytes] = []
    while True:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            ready, _w, _x = select.select([sock], [], [], left)
            if not ready:
                raise TimeoutError
        chunk = sock.recv(1 << 20)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


# ---- the asker -------------------------------------------------------------------------------------------------


def _signal_name(n: int) -> str:
    try:
        return signal.Signals(n).name
    except ValueError:
        return f"signal {n}"


def _answer(data: bytes, status: int | None, timed_out: bool, limits: ReadLimits) -> pa.Table:
    """The table, or the one line that says why there is none."""
    if data[:1] == b"T":
        try:
            return pa.ipc.open_stream(data[1:]).read_all()
        except (pa.ArrowException, OSError):
            pass  # cut short: the child died while it sent it
    elif data[:1] in (b"E", b"R"):
        try:
            info = json.loads(data[1:])
        except ValueError:
            info = None
        if info is not None:
            if data[:1] == b"R":
                raise Retry(str(info.get("why")), str(info.get("message")))
            raise QueryError(str(info.get("message")))
    if timed_out:
        raise QueryError(limits.time_message())
    code = os.waitstatus_to_exitcode(status) if status is not None else None
    if code is not None and code < 0:
        raise QueryError(_death_message(-code, limits))
    raise QueryError(f"the read's process ended without an answer (exit {code})")


def _death_message(sig: int, limits: ReadLimits) -> str:
    """The one line for a read's process that a signal ended."""
    if sig == signal.SIGALRM:
        return limits.time_message()
    if sig == signal.SIGKILL:
        return (
            "the read's process was killed (SIGKILL: by the kernel's OOM killer when the machine ran out of "
            f"memory, or by an operator); its own memory limit was {human_bytes(limits.memory)}"
        )
    if sig == signal.SIGABRT:
        return limits.memory_message(", where its process aborted (SIGABRT)")
    return f"the read's process died of {_signal_name(sig)}; the materializer is not affected"


_fork_allowed = False


def allow_fork() -> None:
    """Let reads fork this process (while it has one thread): for a process that has opened no DuckDB database and
    will not before its reads (`flightrec sql`). A child forked from a process that has one would find DuckDB's
    cache of open databases copied into it, their worker threads gone: opening the same file there hangs."""
    global _fork_allowed
    _fork_allowed = True


def _fork_safe() -> bool:
    """Whether this process may fork a child that runs DuckDB: allowed, and no other thread that could hold a lock."""
    return _fork_allowed and threading.active_count() == 1


def _run_forked(request: bytes, limits: ReadLimits) -> tuple[bytes, int | None, bool]:
    mine, theirs = socket.socketpair()
    pid = os.fork()
    if pid == 0:  # the child
        code = 1
        try:
            os.nice(NICE)  # first: the child's start-up yields the cores too
            mine.close()
            code = _child(theirs, request)
        finally:
            os._exit(code)
    theirs.close()
    return _collect(mine, pid, None, limits)


def _collect(
    sock: socket.socket, pid: int, control: socket.socket | None, limits: ReadLimits
) -> tuple[bytes, int | None, bool]:
    """Read the child's answer (until it closes), then its exit status; kill it past the time limit."""
    deadline = time.monotonic() + limits.seconds + ASKER_STOP_S
    timed_out = False
    data = b""
    try:
        data = _recv_all(sock, deadline)
    except TimeoutError:
        timed_out = True
    except BaseException:
        _kill(pid)
        _status(pid, control)
        raise
    finally:
        sock.close()
    if timed_out:
        _kill(pid)
    return data, _status(pid, control), timed_out


def _kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, signal.SIGKILL)


def _status(pid: int, control: socket.socket | None) -> int | None:
    """The child's wait status: waited for here (a forked child), or as its fork server reports it."""
    if control is None:
        try:
            return os.waitpid(pid, 0)[1]
        except ChildProcessError:
            return None
    try:
        control.settimeout(ASKER_STOP_S + 5.0)
        raw = control.recv(8)
        return struct.unpack("<q", raw)[0] if len(raw) == 8 else None
    except OSError:
        return None
    finally:
        control.close()


class _Zygote:
    """A fork server of this process: a fresh interpreter with duckdb and pyarrow loaded and no threads, which forks
    one child per read. Requests: a SOCK_SEQPACKET message with two descriptors (the child's socket, and a control
    socket where the server writes the child's pid and then its wait status)."""

    def __init__(self, preload: str) -> None:
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.sock = mine
        self.lock = threading.Lock()
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-c",
                f"from flightrec.db.sandbox import zygote_main; zygote_main({theirs.fileno()}, {preload!r})",
            ],
            pass_fds=(theirs.fileno(),),
            stdin=subprocess.DEVNULL,
        )
        theirs.close()

    def alive(self) -> bool:
        return self.proc.poll() is None

    def run(self, request: bytes, limits: ReadLimits) -> tuple[bytes, int | None, bool]:
        mine, theirs = socket.socketpair()
        control, control_theirs = socket.socketpair()
        try:
            with self.lock:
                socket.send_fds(self.sock, [b"R"], [theirs.fileno(), control_theirs.fileno()])
        finally:
            theirs.close()
            control_theirs.close()
        control.settimeout(30.0)
        raw = control.recv(8)
        if len(raw) != 8:
            control.close()
            mine.close()
            raise QueryError("the process that runs reads did not start one; run the query again")
        pid = struct.unpack("<q", raw)[0]
        mine.settimeout(limits.seconds + ASKER_STOP_S)
        try:
            mine.sendall(request)
            mine.shutdown(socket.SHUT_WR)
        except OSError:
            pass  # the child died already: its status says why
        mine.settimeout(None)
        return _collect(mine, pid, control, limits)

    def close(self) -> None:
        self.sock.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(5.0)


_zygote: _Zygote | None = None
_zygote_lock = threading.Lock()


def _fork_server(preload: str) -> _Zygote:
    global _zygote
    with _zygote_lock:
        if _zygote is None or not _zygote.alive():
            _zygote = _Zygote(preload)
        return _zygote


def _child_ended_fd() -> int:
    """A descriptor that becomes readable when a child ends (SIGCHLD through Python's wakeup fd), so the fork server
    reports a child's status as soon as it exits rather than at its next poll."""
    rfd, wfd = os.pipe()
    os.set_blocking(rfd, False)
    os.set_blocking(wfd, False)
    signal.set_wakeup_fd(wfd)
    signal.signal(signal.SIGCHLD, lambda _sig, _frame: None)
    return rfd


def zygote_main(fd: int, preload: str) -> None:
    """The fork server's loop (its own interpreter): a child per request until the asking process goes away."""
    import duckdb  # noqa: F401 - loaded once here, inherited by every child

    importlib.import_module(preload)  # the runner's module, loaded once here, inherited by every child

    from flightrec.db.nopandas import keep_pandas_out

    keep_pandas_out()

    os.nice(NICE)  # the server and every child it forks (their fork and start-up included) yield the cores
    sock = socket.socket(fileno=fd)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the asker's Ctrl-C is the asker's; it ends us by closing
    children: dict[int, socket.socket] = {}
    ended = _child_ended_fd()
    try:
        while True:
            ready, _w, _x = select.select([sock.fileno(), ended], [], [], 1.0)
            if ended in ready:
                with contextlib.suppress(BlockingIOError):
                    os.read(ended, 4096)
            if sock.fileno() in ready:
                msg, fds, _flags, _addr = socket.recv_fds(sock, 16, 2)
                if not msg:
                    break
                _spawn(sock, fds, children)
            _reap(children)  # at once: the asker waits for the child's status after its answer
    finally:
        for pid in list(children):
            _kill(pid)


def _spawn(server: socket.socket, fds: list[int], children: dict[int, socket.socket]) -> None:
    if len(fds) != 2:
        for fd in fds:
            os.close(fd)
        return
    child_sock, control = socket.socket(fileno=fds[0]), socket.socket(fileno=fds[1])
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            server.close()
            control.close()
            for other in children.values():
                other.close()
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            signal.set_wakeup_fd(-1)  # the server's, not the child's
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            code = _child(child_sock, None)
        finally:
            os._exit(code)
    child_sock.close()
    try:
        control.sendall(struct.pack("<q", pid))
    except OSError:
        _kill(pid)
    children[pid] = control


def _reap(children: dict[int, socket.socket]) -> None:
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        control = children.pop(pid, None)
        if control is not None:
            with contextlib.suppress(OSError):
                control.sendall(struct.pack("<q", status))
            control.close()


def read_apart(
    runner: Runner, target: Target, sql: str, params: Params, prelude: Sequence[str], limits: ReadLimits
) -> pa.Table:
    """Run ``runner`` (a module's function: the child finds it by name) on the read in a child process bounded by
    ``limits``; its table, QueryError with one line, or Retry."""
    name = f"{runner.__module__}:{runner.__qualname__}"
    request = encode_request(name, target, sql, params, prelude, limits)
    if _fork_safe():
        data, status, timed_out = _run_forked(request, limits)
    else:
        data, status, timed_out = _fork_server(runner.__module__).run(request, limits)
    return _answer(data, status, timed_out, limits)
