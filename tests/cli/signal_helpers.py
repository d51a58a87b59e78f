"""Helpers for the stop-signal tests: a materializer's store publishing snapshots in a process of its own, and a
reader pelted with signals."""

from __future__ import annotations

import os
import random
import select
import signal
import subprocess
import sys
from pathlib import Path

# A materializer's store in a process of its own, as in the demo: it holds the file and publishes its snapshot.
SERVER = """
import sys, time
from flightrec.db.filestore import FileStore
store = FileStore(sys.argv[1], "g")
print("serving", flush=True)
time.sleep(600)
"""


def _signals_as_at_a_terminal() -> None:
    """In the child before exec: no signal blocked, SIGINT and SIGTERM at their defaults, as a shell starts a command.
    A test run earlier in the same pytest worker may have left SIGINT ignored, which a child inherits: its Python
    then never turns Ctrl-C into KeyboardInterrupt, and every SIGINT here went unanswered."""
    signal.pthread_sigmask(signal.SIG_SETMASK, [])
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_DFL)


def signals_lost(db: Path, reader_code: str, count: int, seed: int, stopped: tuple[bytes, ...]) -> list[str]:
    """Hold ``db`` as a materializer does (readers read its snapshot), start ``reader_code`` (it prints "reading",
    then a line for each stop signal that reached it), send it ``count`` SIGINTs and SIGTERMs at random moments,
    each after the previous one's line.
    The names of the signals that brought no line within 5 s. A line not starting with one of ``stopped`` fails at
    once."""
    env = {**os.environ, "PYTHONSAFEPATH": "1", "PYTHONUNBUFFERED": "1"}
    server = subprocess.Popen(
        [sys.executable, "-c", SERVER, str(db)], stdout=subprocess.PIPE, env=env, preexec_fn=_signals_as_at_a_terminal
    )
    reader = None
    try:
        assert server.stdout is not None and server.stdout.readline() == b"serving\n"
        reader = subprocess.Popen(
            [sys.executable, "-c", reader_code, str(db)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            preexec_fn=_signals_as_at_a_terminal,
        )
        assert reader.stdout is not None and reader.stdout.readline() == b"reading\n"
        rng = random.Random(seed)
        lost = []
        streak = 0  # signals lost in a row: 3 in a row or 6 in all, and the rest would only wait (5 s each)
        for n in range(count):
            select.select([], [], [], rng.uniform(0.0, 0.02))
            sig = (signal.SIGINT, signal.SIGTERM)[n % 2]
            reader.send_signal(sig)
            ready, _, _ = select.select([reader.stdout], [], [], 5.0)
            if not ready:
                lost.append(sig.name)
                streak += 1
                if streak == 3 or len(lost) >= 6:
                    alive = reader.poll() is None
                    reader.kill()
                    _, err = reader.communicate()
                    raise AssertionError(
                        f"after {n + 1} signals {len(lost)} went unanswered ({'alive' if alive else 'gone'},"
                        f" server {'alive' if server.poll() is None else 'gone'}); lost so far {lost}; its stderr: "
                        f"{err[-3000:]!r}"
                    )
                continue
            streak = 0
            line = reader.stdout.readline()
            assert line.startswith(stopped), (
                f"after {n + 1} signals: {line!r} {reader.stderr.read() if reader.poll() is not None else b''!r}"
            )
        assert reader.poll() is None
        return lost
    finally:
        for proc in (reader, server):
            if proc is not None:
                proc.kill()
                proc.wait()
