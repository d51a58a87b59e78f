"""Packaging: the wheel holds every mapped folder and its data; subpackages do not import each other."""

from __future__ import annotations

import ast
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MAPPED = {"schemas": "flightrec/schemas", "producer": "flightrec/producer", "consumers": "flightrec/consumers",
          "analytics": "flightrec/analytics", "cuda": "flightrec/cuda", "broker": "flightrec/broker",
          "src/flightrec": "flightrec"}
DATA_SUFFIXES = {".py", ".avsc", ".sql", ".toml", ".cu", ".cuh", ".xml"}
PEERS = {"producer", "consumers", "analytics", "cuda"}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> zipfile.ZipFile:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(out), str(ROOT)],
                   check=True, capture_output=True)
    (path,) = out.glob("flightrec-*.whl")
    return zipfile.ZipFile(path)


def test_wheel_holds_every_file_of_every_mapped_folder(wheel):
    names = set(wheel.namelist())
    missing = []
    for folder, package in MAPPED.items():
        for path in (ROOT / folder).rglob("*"):
            if "__pycache__" in path.parts or path.suffix not in DATA_SUFFIXES:
                continue
            if path.name == "pom.xml" or path.suffix != ".xml":
                rel = path.relative_to(ROOT / folder).as_posix()
                if f"{package}/{rel}" not in names:
                    missing.append(f"{folder}/{rel}")
    assert not missing, f"absent from the wheel (list the subpackage or its data in pyproject): {missing}"


def test_wheel_installs_nothing_under_a_bare_top_level_name(wheel):
    tops = {n.split("/")[0] for n in wheel.namelist()}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"flightrec"}


def test_every_package_folder_has_an_init():
    for folder in MAPPED:
        for sub in [ROOT / folder, *[p for p in (ROOT / folder).rglob("*") if p.is_dir()]]:
            if "__pycache__" in sub.parts or not any(sub.glob("*.py")):
                continue
            assert (sub / "__init__.py").exists(), f"{sub} has modules but no __init__.py"


def _imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


def test_parts_depend_on_the_schemas_and_not_on_each_other():
    bad = []
    for part in PEERS | {"schemas"}:
        for path in (ROOT / part).rglob("*.py"):
            for mod in _imports(path):
                parts = mod.split(".")
                if parts[0] == "flightrec" and len(parts) > 1 and parts[1] in (PEERS | {"broker"}) - {part}:
                    bad.append(f"{path.relative_to(ROOT)} imports {mod}")
    assert not bad, "the CLI wires the parts together; they must not import each other:\n" + "\n".join(bad)


def test_every_module_says_what_it_holds_and_stays_small():
    for folder in MAPPED:
        for path in (ROOT / folder).rglob("*.py"):
            if "__pycache__" in path.parts:
                continue
            src = path.read_text()
            assert ast.get_docstring(ast.parse(src)), f"{path.relative_to(ROOT)} opens with no one-line docstring"
            assert src.count("\n") < 600, f"{path.relative_to(ROOT)} has grown past 600 lines: split it"
