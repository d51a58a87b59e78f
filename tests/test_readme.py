"""The README and docs stay true: every command in them parses, is exercised by a test, and docs/cli.md is current."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from flightrec.cli import build_parser
from flightrec.cli.reference import render

ROOT = Path(__file__).resolve().parent.parent
SHELL_BLOCK = re.compile(r"```sh\n(.*?)```", re.S)


def readme_commands() -> list[list[str]]:
    """Every `flightrec ...` command line in the README's shell blocks, as argv after `flightrec`."""
    out = []
    for block in SHELL_BLOCK.findall((ROOT / "README.md").read_text()):
        for line in block.splitlines():
            line = line.split(" #")[0].strip()
            if line.startswith(("flightrec ", ".venv/bin/flightrec ")):
                out.append(shlex.split(line)[1:])
    return out


def test_the_readme_shows_commands():
    cmds = readme_commands()
    assert len(cmds) >= 15
    assert {c[0] for c in cmds} >= {
        "agent",
        "materialize",
        "replay",
        "timeline",
        "sql",
        "dashboard",
        "broker",
        "topics",
        "wait-sealed",
        "prove",
    }


@pytest.mark.parametrize("argv", readme_commands(), ids=lambda a: " ".join(a)[:60])
def test_every_readme_command_parses(argv):
    args = build_parser().parse_args(argv)
    assert callable(args.func)


def _test_sources() -> str:
    return "\n".join(p.read_text() for p in (ROOT / "tests").rglob("*.py") if p.name != "test_readme.py")


@pytest.mark.parametrize("argv", readme_commands(), ids=lambda a: " ".join(a)[:60])
def test_every_readme_command_is_run_by_a_test(argv):
    """A test runs the same command (and action): the README shows nothing that no test exercised."""
    words = [argv[0]] + ([argv[1]] if argv[0] in ("broker", "catalog", "agent", "prove", "topics") else [])
    q = r"[\"']"
    patterns = [q + (q + r"\s*,\s*" + q).join(re.escape(w) for w in words) + q]
    if words[0] == "agent":  # tests/producer's helper prepends "agent": agent_env.run("event", ...)
        patterns.append(r"(?:run|argv)\(" + q + re.escape(words[1]) + q)
    sources = _test_sources()
    assert any(re.search(p, sources) for p in patterns), f"no test runs `flightrec {' '.join(words)}`"


def test_the_command_reference_is_current():
    assert (ROOT / "docs" / "cli.md").read_text() == render(build_parser()), "run `make docs`"


def test_the_readme_links_resolve():
    text = (ROOT / "README.md").read_text()
    for target in re.findall(r"\]\(([^)#]+)\)", text):
        if not target.startswith("http"):
            assert (ROOT / target).exists(), f"README links to missing {target}"
