"""A broker that is away is retried on a backoff, however fast the instance writes (no retry storm)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import uuid
from pathlib import Path

import pytest

FLIGHTREC = str(Path(sys.executable).parent / "flightrec")
SECONDS = 4.0
# a busy stage: a line every 20 ms (each one wakes the deliverer)
BUSY = f"""import time
for i in range({int(SECONDS / 0.02)}):
    print(f'line {{i}}', flush=True)
    time.sleep(0.02)
"""


class Refuser:
    """A TCP port where something answers and hangs up at once: every connection attempt is counted."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.count = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.count += 1
            conn.close()


@pytest.mark.slow
def test_a_busy_stage_does_not_hammer_a_broker_that_is_away(tmp_path: Path) -> None:
    refuser = Refuser()
    env = dict(
        os.environ,
        FLIGHTREC_SPOOL=str(tmp_path / "spool"),
        FLIGHTREC_INSTANCE=f"test-{uuid.uuid4()}",
        FLIGHTREC_BOOTSTRAP=f"127.0.0.1:{refuser.port}",
        FLIGHTREC_FLUSH_TIMEOUT="0",
        FLIGHTREC_FACTS="",
    )
    r = subprocess.run(
        [FLIGHTREC, "agent", "run", "--stage", "busy", "--", sys.executable, "-c", BUSY],
        env=env,
        capture_output=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr.decode()[-2000:]
    assert r.stdout.decode().count("line ") == int(SECONDS / 0.02)
    # the backoff (0.2, 0.5, 1, 2, 3 s) allows about 5 attempts in 4 s, each a few connections
    assert refuser.count <= 25, f"{refuser.count} connections in {SECONDS} s: the backoff is cut short by new lines"
