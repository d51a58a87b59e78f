"""A bad flag on a subcommand prints that subcommand's usage (it printed the top-level one), exit status 2."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BIN = Path(sys.executable).parent


@pytest.mark.parametrize(
    ("argv", "usage"),
    [
        (["flightrec", "materialize", "--bogus"], "usage: flightrec materialize"),
        (["flightrec", "agent", "flush", "--bogus"], "usage: flightrec agent flush"),
        (
            ["flightrec", "manager", "event", "--instance", "a", "--kind", "note", "--nope", "1"],
            "usage: flightrec manager event",
        ),
        (["flightrec-agent", "seal", "--bogus"], "usage: flightrec-agent seal"),
    ],
)
def test_a_bad_flag_prints_the_subcommands_usage(argv: list[str], usage: str) -> None:
    r = subprocess.run([str(BIN / argv[0]), *argv[1:]], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stderr
    assert r.stderr.startswith(usage), r.stderr
    assert "unrecognized arguments" in r.stderr and ("--bogus" in r.stderr or "--nope" in r.stderr), r.stderr


def test_agent_run_still_passes_its_commands_flags_through(tmp_path: Path) -> None:
    """`agent run -- CMD --its-own-flag`: the command's flags are the command's (not an unknown flag of the agent)."""
    import os

    env = dict(
        os.environ,
        FLIGHTREC_BOOTSTRAP="127.0.0.1:9",
        FLIGHTREC_SPOOL=str(tmp_path),
        FLIGHTREC_FLUSH_TIMEOUT="0",
        FLIGHTREC_FACTS="",
        FLIGHTREC_INSTANCE="usage-test",
    )
    r = subprocess.run(
        [str(BIN / "flightrec"), "agent", "run", "--stage", "s", "--no-facts", "--", "echo", "--x"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert (r.returncode, r.stdout) == (0, "--x\n"), r.stderr
