"""How large one function may grow: ruff's complexity rules at pyproject's thresholds, with a list that may only shrink.

The thresholds (mccabe's ``max-complexity``, pylint's ``max-branches`` and ``max-statements``) are in
``[tool.ruff.lint.mccabe]`` and ``[tool.ruff.lint.pylint]``; the functions over them today are named, with the rules
each breaks, in ``[tool.flightrec.complexity.allowed]``. A new function over a threshold fails here; so does a listed
one that no longer needs its entry (take it off: the list only shrinks).
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import tomllib
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RULES = ("C901", "PLR0912", "PLR0915")


def _ruff() -> Path:
    return Path(sys.executable).parent / "ruff"


def _config() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))


@cache
def _functions(path: Path) -> dict[int, str]:
    """Each function's qualified name (``Class.method``, ``outer.inner``) by the line of its ``def``."""
    names: dict[int, str] = {}

    def walk(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                name = f"{prefix}{child.name}"
                if not isinstance(child, ast.ClassDef):
                    names[child.lineno] = name
                walk(child, f"{name}.")
            else:
                walk(child, prefix)

    walk(ast.parse(path.read_text("utf-8")), "")
    return names


def over_thresholds(root: Path) -> dict[str, list[str]]:
    """``{"path::function": [rules it breaks]}`` for every function in ``root`` over a complexity threshold."""
    out = subprocess.run(
        [str(_ruff()), "check", "--select", ",".join(RULES), "--output-format", "json", "--exit-zero", "."],
        cwd=root,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    found: dict[str, list[str]] = {}
    for d in json.loads(out):
        path = Path(d["filename"])
        name = _functions(path)[d["location"]["row"]]
        found.setdefault(f"{path.relative_to(root).as_posix()}::{name}", []).append(d["code"])
    return {k: sorted(v) for k, v in found.items()}


def test_no_function_grows_past_the_thresholds_but_those_listed_and_the_list_only_shrinks():
    allowed = {k: sorted(v) for k, v in _config()["tool"]["flightrec"]["complexity"]["allowed"].items()}
    found = over_thresholds(ROOT)
    new = [
        f"{k} {sorted(set(v) - set(allowed.get(k, [])))}" for k, v in found.items() if set(v) - set(allowed.get(k, []))
    ]
    shrunk = [
        f"{k} {sorted(set(v) - set(found.get(k, [])))}" for k, v in allowed.items() if set(v) - set(found.get(k, []))
    ]
    assert not new, (
        "over pyproject's complexity thresholds (split the function by what its parts do; the allow-list is for "
        "what was there when the rule came, not for new code):\n" + "\n".join(sorted(new))
    )
    assert not shrunk, (
        "no longer over these thresholds: take them off [tool.flightrec.complexity.allowed] in pyproject.toml "
        "(the list only shrinks):\n" + "\n".join(sorted(shrunk))
    )


def test_the_thresholds_are_stated_in_pyproject():
    lint = _config()["tool"]["ruff"]["lint"]
    assert lint["mccabe"]["max-complexity"] == 10
    assert (lint["pylint"]["max-branches"], lint["pylint"]["max-statements"]) == (12, 50)


def test_a_function_over_a_threshold_is_found_by_its_qualified_name(tmp_path):
    branches = "\n".join(f"        if x == {n}:\n            return {n}" for n in range(14))
    (tmp_path / "pyproject.toml").write_text((ROOT / "pyproject.toml").read_text("utf-8"))
    (tmp_path / "m.py").write_text(f'"""m."""\n\n\nclass C:\n    def f(self, x):\n{branches}\n        return -1\n')
    assert over_thresholds(tmp_path) == {"m.py::C.f": ["C901", "PLR0912"]}
