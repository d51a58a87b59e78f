"""Ctrl-C (SIGINT) and SIGTERM always stop `flightrec wait-sealed`, also when they land as a read of the snapshot
ends (DuckDB turns one that lands inside a query into "Query interrupted": flightrec.db.query makes it a stop)."""

from __future__ import annotations

import pytest
from signal_helpers import signals_lost

pytestmark = pytest.mark.integration

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


def test_no_ctrl_c_is_lost_while_wait_sealed_reads_the_snapshot(tmp_path):
    """(Reads went through Arrow Flight before, whose handler dropped a signal that landed as a read ended.)"""
    lost = signals_lost(tmp_path / "flightrec.duckdb", WAITER, 400, 11, (b"stopped 130\n", b"stopped outside\n"))
    assert lost == [], f"{len(lost)} of 400 stop signals never stopped wait-sealed: {lost}"
