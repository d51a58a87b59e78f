"""A flood from one instance does not hide another's failure: 200 MB of log lines from a host while another
instance fails; the failure is visible to `flightrec sql` within FLOOD_BOUND_S of its stage's exit."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from materializer_helpers import flightrec, serving

pytestmark = [pytest.mark.integration, pytest.mark.slow]

FLOOD_MB = 200
FLOOD_BOUND_S = 10.0  # exit of the failing stage -> its failures row visible, with the flood in full flow
# 2M lines of 100 bytes, as fast as the pipe takes them
FLOOD = (
    "import sys\nline = b'x' * 99 + b'\\n'\nw = sys.stdout.buffer\n"
    f"for i in range({FLOOD_MB * 1024 * 1024 // 100}):\n    w.write(line)\n"
)


def test_a_failure_is_seen_within_the_bound_while_another_instance_floods(kafka, db, tmp_path: Path) -> None:
    env = kafka.env(FLIGHTREC_LOG_LEVEL="WARNING", FLIGHTREC_FACTS="", PYTHONSAFEPATH="1")
    exe = str(Path(sys.executable).with_name("flightrec"))
    kafka.seed_at_mark(db)
    mat = subprocess.Popen(
        [exe, "materialize", "--db", str(db)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    flood = None
    try:
        # flood-1 and victim-2 land on different partitions (murmur2 of the key: 2 and 3 of 6)
        flood = subprocess.Popen(
            [exe, "agent", "run", "--instance", "flood-1", "--stage", "supervisor", "--", sys.executable, "-c", FLOOD],
            env={**env, "FLIGHTREC_SPOOL": str(tmp_path / "flood")},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        deadline = time.monotonic() + 120
        while not serving(db) or _count(db, env, "log_lines", "flood-1") < 200_000:
            assert time.monotonic() < deadline, "the flood never reached the database"
            assert mat.poll() is None, mat.communicate()[1].decode()
            time.sleep(0.2)
        victim = subprocess.run(
            [
                exe,
                "agent",
                "run",
                "--instance",
                "victim-2",
                "--stage",
                "benchmark",
                "--",
                "sh",
                "-c",
                "echo 'CUDA error: out of memory' >&2; exit 3",
            ],
            env={**env, "FLIGHTREC_SPOOL": str(tmp_path / "victim")},
            capture_output=True,
            timeout=120,
        )
        exited = time.monotonic()
        assert victim.returncode == 3
        while _count(db, env, "failures", "victim-2") == 0:
            assert time.monotonic() - exited < 60, "the victim's failure never became visible"
            time.sleep(0.1)
        waited = time.monotonic() - exited
        still_flooding = _count(db, env, "log_lines", "flood-1") < FLOOD_MB * 1024 * 1024 // 100
        print(f"failure visible {waited:.2f} s after the stage's exit; flood still arriving: {still_flooding}")
        assert waited <= FLOOD_BOUND_S, f"the failure took {waited:.1f} s to be seen behind the flood"
        assert flood.wait(timeout=300) == 0
    finally:
        if flood is not None and flood.poll() is None:
            flood.kill()
        mat.terminate()
        mat.wait(timeout=60)


def _count(db: Path, env: dict[str, str], table: str, instance: str) -> int:
    out = flightrec(
        "sql", "--db", str(db), "--json", f"SELECT count(*) AS n FROM {table} WHERE instance_id = '{instance}'", env=env
    )
    return int(json.loads(out.stdout.splitlines()[0])["n"])
