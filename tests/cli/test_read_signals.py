"""Ctrl-C (SIGINT) and SIGTERM always stop `flightrec wait-sealed`, also when they land as a live read ends."""

from __future__ import annotations

import os
import random
import select
import signal
import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration

# A materializer's live endpoint (Arrow Flight) in a process of its own.
SERVER = """
import sys, time
from flightrec.consumers.serve import QueryServer
from flightrec.consumers.store import Store
store = Store(sys.argv[1], "g")
with QueryServer(store.con.cursor(), sys.argv[1]):
    print("serving", flush=True)
    time.sleep(600)
"""
# The CLI's own entry point, waiting for an instance that never seals, reading without a pause; what each
# run of it returned (130: stopped by a signal) on a line of its own. A signal sent just as one run
# ended lands in the loop around it: it stopped that run all the same ("outside").
WAITER = """
import signal, sys
from flightrec.cli import main
signal.signal(signal.SIGTERM, signal.default_int_handler)  # SIGTERM as Ctrl-C, to send both kinds
main(["wait-sealed", "i-never", "--db", sys.argv[1], "--timeout", "0"])  # imports done (lazy ones too)
print("reading", flush=True)
stopped = None
while True:
    try:
        while True:
            if stopped is not None:
                print("stopped", stopped, flush=True)
                stopped = None
            stopped = main(["wait-sealed", "i-never", "--db", sys.argv[1], "--timeout", "600", "--poll", "0"])
    except KeyboardInterrupt:
        stopped = "outside"
"""


def test_no_ctrl_c_is_lost_while_wait_sealed_reads_live(tmp_path):
    """pyarrow swaps its own handler in for SIGINT during a Flight read and hands the signal to a thread of
    its own; one that landed as the read ended was dropped and `wait-sealed` went on waiting."""
    db = tmp_path / "flightrec.duckdb"
    env = {**os.environ, "PYTHONSAFEPATH": "1", "PYTHONUNBUFFERED": "1"}
    server = subprocess.Popen([sys.executable, "-c", SERVER, str(db)], stdout=subprocess.PIPE, env=env)
    waiter = None
    try:
        assert server.stdout.readline() == b"serving\n"
        waiter = subprocess.Popen([sys.executable, "-c", WAITER, str(db)], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, env=env)
        assert waiter.stdout.readline() == b"reading\n"
        rng = random.Random(11)
        lost, sent = [], 0
        for n in range(400):
            select.select([], [], [], rng.uniform(0.0, 0.02))
            sig = (signal.SIGINT, signal.SIGTERM)[n % 2]
            waiter.send_signal(sig)
            sent += 1
            ready, _, _ = select.select([waiter.stdout], [], [], 5.0)
            if not ready:
                lost.append(sig.name)
                continue
            line = waiter.stdout.readline()
            assert line in (b"stopped 130\n", b"stopped outside\n"), \
                f"after {sent} signals: {line!r} {waiter.stderr.read() if waiter.poll() is not None else b''!r}"
        assert waiter.poll() is None
        assert lost == [], f"{len(lost)} of {sent} stop signals never stopped wait-sealed: {lost}"
    finally:
        for proc in (waiter, server):
            if proc is not None:
                proc.kill()
                proc.wait()
