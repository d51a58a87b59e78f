"""Packaging: the wheel holds every mapped folder and its data; subpackages do not import each other."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import sysconfig
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


def test_wheel_ships_the_demo_entrypoint(wheel):
    # src/flightrec/demo/entrypoint.sh links to examples/entrypoint.sh: one file, its content shipped.
    assert wheel.read("flightrec/demo/entrypoint.sh") == (ROOT / "examples" / "entrypoint.sh").read_bytes()


def _free_port() -> int:
    from flightrec.broker.local import free_port

    return free_port()


@pytest.mark.integration
def test_a_wheel_installed_elsewhere_fetches_kafka_and_runs_the_demo(wheel, tmp_path):
    """Nothing in the installed package looks for the repository around it."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True)
    py = venv / "bin" / "python"
    site = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    # The dependencies come from this environment's site-packages (a plain path: its editable finder is not run).
    Path(site, "flightrec-deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-deps", wheel.filename], check=True,
                   capture_output=True)
    work = tmp_path / "elsewhere"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLIGHTREC_") and k != "PYTHONPATH"}
    env.update(XDG_CACHE_HOME=str(tmp_path / "xdg"), PYTHONSAFEPATH="1")
    where = subprocess.run([str(py), "-c", "import flightrec; print(flightrec.__file__)"], cwd=work, env=env,
                           capture_output=True, text=True, check=True).stdout
    assert where.startswith(site), where
    flightrec = str(venv / "bin" / "flightrec")
    fetched = subprocess.run([flightrec, "broker", "fetch"], cwd=work, env=env, capture_output=True, text=True,
                             timeout=600)
    assert fetched.returncode == 0, fetched.stdout + fetched.stderr
    libs = tmp_path / "xdg" / "flightrec" / "kafka"
    assert str(libs) in fetched.stdout and any(libs.glob("*/libs/kafka_2.13-*.jar")), fetched.stdout
    demo = subprocess.run([flightrec, "demo", "--headless", "--instances", "2", "--port", str(_free_port()),
                           "--home", str(work / "demo"), "--supervisor-seconds", "1"],
                          cwd=work, env=env, capture_output=True, text=True, timeout=500)
    assert demo.returncode == 0, demo.stdout[-3000:] + demo.stderr[-3000:]
    assert "the whole fleet is materialized" in demo.stdout
    assert "gpu_arch_unsupported" in demo.stdout  # the second instance's fate, explained
    assert (work / "demo" / "flightrec.duckdb").exists()
