"""docs/contributing.md stays true: every file and test it names exists."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "contributing.md"


def _tests_in(path: Path) -> set[str]:
    tree = ast.parse(path.read_text("utf-8"))
    return {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}


def test_every_test_the_contributing_guide_names_exists() -> None:
    text = DOC.read_text("utf-8")
    named = re.findall(r"`(tests/[\w/]+\.py)(?:::(\w+))?`", text)
    short = re.findall(r"`(test_\w+\.py)::(\w+)`", text)
    assert named
    for path, test in named:
        assert (ROOT / path).is_file(), f"docs/contributing.md names {path}, which is gone"
        if test:
            assert test in _tests_in(ROOT / path), f"docs/contributing.md names {path}::{test}, which is gone"
    for file, test in short:
        matches = [p for p in ROOT.glob(f"tests/**/{file}")]
        assert any(test in _tests_in(p) for p in matches), f"docs/contributing.md names {file}::{test}, which is gone"


def test_every_file_the_contributing_guide_names_exists() -> None:
    text = DOC.read_text("utf-8")
    for path in re.findall(
        r"`((?:schemas|consumers|analytics|producer|src/flightrec|docs)/[\w/.]+\.(?:py|sql|toml|md))`", text
    ):
        assert (ROOT / path).exists(), f"docs/contributing.md names {path}, which is gone"
