"""The checks that gate every submission: CI runs `make check` before `make test`, and `make check` needs no Kafka."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _commands(script: str) -> list[str]:
    return [line.strip() for line in script.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def _prerequisites(target: str) -> list[str]:
    makefile = (ROOT / "Makefile").read_text("utf-8")
    match = re.search(rf"^{re.escape(target)}:([^\n]*)$", makefile, re.M)
    assert match, f"the Makefile has no target {target}"
    return match.group(1).split()


def test_ci_runs_the_checks_before_the_whole_suite():
    commands = _commands((ROOT / ".ci" / "run").read_text("utf-8"))
    assert "make check" in commands and "make test" in commands, commands
    assert commands.index("make check") < commands.index("make test"), commands


def test_make_check_needs_the_virtual_environment_only():
    # not `setup`: that fetches Kafka's jars with Maven (Java), which no check needs
    assert _prerequisites("check") == ["$(VENV)/.installed"]


def test_ruff_selects_the_families_every_submission_is_held_to():
    select = set(tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))["tool"]["ruff"]["lint"]["select"])
    assert {"F", "E9", "I", "B", "UP", "SIM", "E501"} <= select, select
