"""Every third-party name the code imports is a declared dependency (pyproject.toml), and no private client calls."""

from __future__ import annotations

import ast
import importlib.metadata as md
import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))
# The folders the wheel ships (tool.setuptools.package-dir), and those only the checkout uses.
PACKAGE_DIRS = sorted({ROOT / d for d in PYPROJECT["tool"]["setuptools"]["package-dir"].values()})
CHECKOUT_DIRS = [ROOT / "tests", ROOT / "benchmarks", ROOT / "scripts"]


def _dist(requirement: str) -> str:
    return re.split(r"[\s<>=!~;\[(]", requirement.strip(), maxsplit=1)[0].lower().replace("_", "-")


def _declared(*extras: str) -> set[str]:
    out = {_dist(r) for r in PYPROJECT["project"]["dependencies"]}
    for extra in extras:
        out |= {_dist(r) for r in PYPROJECT["project"]["optional-dependencies"][extra]}
    return out


def _imports(folders: list[Path]) -> dict[str, list[str]]:
    """Top-level names of every absolute import, with where they are imported."""
    found: dict[str, list[str]] = {}
    for folder in folders:
        for path in sorted(folder.rglob("*.py")):
            if ".venv" in path.parts:
                continue
            for node in ast.walk(ast.parse(path.read_text("utf-8"), str(path))):
                names = []
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                for name in names:
                    found.setdefault(name.split(".")[0], []).append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return found


def _local_names(folders: list[Path]) -> set[str]:
    """Modules of the checkout itself (tests import their helpers by bare name)."""
    return {p.stem for f in folders for p in f.rglob("*.py")} | {
        p.name for f in folders for p in f.rglob("*") if p.is_dir()
    }


def _undeclared(found: dict[str, list[str]], declared: set[str], local: set[str]) -> list[str]:
    providers = md.packages_distributions()
    bad = []
    for name, where in sorted(found.items()):
        if name in sys.stdlib_module_names or name in ("flightrec", "__future__") or name in local:
            continue
        dists = {d.lower().replace("_", "-") for d in providers.get(name, [name])}
        if not dists & declared:
            bad.append(f"{name} (from {', '.join(sorted(dists))}) imported at {where[0]}")
    return bad


def test_every_import_of_the_package_is_a_declared_dependency():
    # The server extra is everything but the agent (tests/cli/test_profiles.py); the GPU extra is what the optional
    # CUDA backend imports (behind a guard).
    assert _undeclared(_imports(PACKAGE_DIRS), _declared("server", "gpu"), set()) == []


def test_every_import_of_the_tests_and_benchmarks_is_declared():
    assert _undeclared(_imports(CHECKOUT_DIRS), _declared("gpu", "server", "test"), _local_names(CHECKOUT_DIRS)) == []


def test_no_private_kafka_client_calls():
    # aiokafka's ``_client`` is internal: the public admin client describes topics (flightrec.cluster).
    found = []
    for folder in PACKAGE_DIRS + CHECKOUT_DIRS:
        for path in folder.rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text("utf-8"))):
                if isinstance(node, ast.Attribute) and node.attr == "_client":
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert found == []
