"""The README's entrypoint snippet, run as written: a failed stage still seals the boot (its exit trap), so the
destroy gate is not left to wait out its timeout; the supervisor's normal end seals it otherwise."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from flightrec.schemas import Sealed

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ("register.sh", "fetch-params.sh", "benchmark.sh", "supervisor.sh")


def snippet() -> str:
    for text in re.findall(r"```sh\n(.*?)```", (ROOT / "README.md").read_text(), re.S):
        if text.startswith("set -euo pipefail\nexport FLIGHTREC_INSTANCE=gpu-7"):
            return text
    raise AssertionError("README.md has no entrypoint snippet starting with set -euo pipefail")


def run_snippet(spool_env, tmp_path: Path, failing: str | None) -> subprocess.CompletedProcess:
    for name in SCRIPTS:
        script = tmp_path / name
        script.write_text(f"#!/bin/sh\necho {name}\nexit {3 if name == failing else 0}\n")
        script.chmod(0o755)
    text = snippet().replace("kafka-1.example:9092", spool_env.away)  # nothing listens: the events stay spooled
    env = {
        **spool_env.env(),
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
        "PYTHONSAFEPATH": "1",
        "FLIGHTREC_LATE_WAIT": "1",
        "FLIGHTREC_SEAL_WAIT": "1",
    }
    env.pop("FLIGHTREC_INSTANCE")  # the snippet exports its own
    return subprocess.run(["bash", "-c", text], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("failing", ["register.sh", "benchmark.sh", None])
def test_the_readme_snippet_seals_the_boot_on_every_exit(spool_env, tmp_path: Path, failing: str | None) -> None:
    r = run_snippet(spool_env, tmp_path, failing)
    assert r.returncode == (3 if failing else 0), r.stderr[-3000:]
    seals = [e for e in spool_env.events("gpu-7") if isinstance(e, Sealed)]
    assert len(seals) == 1, seals
    if failing:
        assert "exited with 3" in seals[0].reason, seals[0].reason
