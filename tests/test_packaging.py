"""Packaging: the wheel holds every mapped folder and its data; subpackages do not import each other."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MAPPED = {
    "schemas": "flightrec/schemas",
    "producer": "flightrec/producer",
    "db": "flightrec/db",
    "consumers": "flightrec/consumers",
    "analytics": "flightrec/analytics",
    "cuda": "flightrec/cuda",
    "broker": "flightrec/broker",
    "catalog": "flightrec/catalog",
    "src/flightrec": "flightrec",
}
DATA_SUFFIXES = {".py", ".avsc", ".sql", ".toml", ".cu", ".cuh", ".xml"}
# The layering: which part may import which. Every part may import the ground floor (GROUND, the root package's
# own modules); only the CLI and the demo (src/flightrec/cli, src/flightrec/demo) wire the parts together.
GROUND = {"errors", "settings", "cluster", "localservice", "access"}
LAYERS: dict[str, set[str]] = {
    "schemas": set(),
    "db": {"schemas"},  # the database: tables, views, the store (file or lake), the read path
    "producer": {"schemas"},
    "cuda": {"schemas"},
    "consumers": {"schemas", "db"},
    "analytics": {"schemas", "db"},
    "broker": set(),
    "catalog": set(),
}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> zipfile.ZipFile:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(out), str(ROOT)],
        check=True,
        capture_output=True,
    )
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


def _violations(part: str, folder: Path) -> list[str]:
    bad = []
    for path in folder.rglob("*.py"):
        for mod in _imports(path):
            parts = mod.split(".")
            if parts[0] != "flightrec" or len(parts) == 1:
                continue
            if parts[1] not in LAYERS[part] | GROUND | {part}:
                bad.append(f"{path.relative_to(folder.parent)} imports {mod}")
    return bad


def test_each_part_imports_only_the_parts_below_it():
    bad = [v for part in LAYERS for v in _violations(part, ROOT / part)]
    assert not bad, (
        "a part imports only the ground floor and the parts LAYERS names; the CLI wires the rest:\n"
        + "\n".join(sorted(bad))
    )


def test_the_ground_floor_imports_no_part():
    bad = []
    for name in GROUND:
        for mod in _imports(ROOT / "src" / "flightrec" / f"{name}.py"):
            parts = mod.split(".")
            if parts[0] == "flightrec" and len(parts) > 1 and parts[1] not in GROUND | {"schemas"}:
                bad.append(f"src/flightrec/{name}.py imports {mod}")
    assert not bad, "the ground floor (settings, errors, ...) is below every part:\n" + "\n".join(bad)


def test_the_layering_test_fails_on_a_violation(tmp_path):
    (tmp_path / "x.py").write_text('"""x."""\nfrom flightrec.consumers import materializer\n')
    assert _violations("db", tmp_path) == [f"{tmp_path.name}/x.py imports flightrec.consumers"]
    assert _violations("consumers", tmp_path) == []


def test_the_root_package_holds_only_the_ground_floor_and_the_wiring():
    modules = {p.stem for p in (ROOT / "src" / "flightrec").glob("*.py")} - {"__init__", "__main__"}
    assert modules == GROUND, "src/flightrec/ holds the ground floor; the database's code lives in db/"


def test_every_module_says_what_it_holds():
    # How big a function may grow is ruff's to say (tests/test_complexity.py); a file is as long as its role.
    for folder in MAPPED:
        for path in (ROOT / folder).rglob("*.py"):
            if "__pycache__" in path.parts:
                continue
            src = path.read_text()
            assert ast.get_docstring(ast.parse(src)), f"{path.relative_to(ROOT)} opens with no one-line docstring"


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
    site = subprocess.run(
        [str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    # The dependencies come from this environment's site-packages (a plain path: its editable finder is not run).
    Path(site, "flightrec-deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run(
        [str(py), "-m", "pip", "install", "-q", "--no-deps", wheel.filename], check=True, capture_output=True
    )
    work = tmp_path / "elsewhere"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLIGHTREC_") and k != "PYTHONPATH"}
    env.update(XDG_CACHE_HOME=str(tmp_path / "xdg"), PYTHONSAFEPATH="1")
    where = subprocess.run(
        [str(py), "-c", "import flightrec; print(flightrec.__file__)"],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert where.startswith(site), where
    flightrec = str(venv / "bin" / "flightrec")
    fetched = subprocess.run(
        [flightrec, "broker", "fetch"], cwd=work, env=env, capture_output=True, text=True, timeout=600
    )
    assert fetched.returncode == 0, fetched.stdout + fetched.stderr
    libs = tmp_path / "xdg" / "flightrec" / "kafka"
    assert str(libs) in fetched.stdout and any(libs.glob("*/libs/kafka_2.13-*.jar")), fetched.stdout
    demo = subprocess.run(
        [
            flightrec,
            "demo",
            "--headless",
            "--instances",
            "2",
            "--port",
            str(_free_port()),
            "--home",
            str(work / "demo"),
            "--supervisor-seconds",
            "1",
        ],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=500,
    )
    assert demo.returncode == 0, demo.stdout[-3000:] + demo.stderr[-3000:]
    assert "the whole fleet is materialized" in demo.stdout
    assert "gpu_arch_unsupported" in demo.stdout  # the second instance's fate, explained
    assert (work / "demo" / "flightrec.duckdb").exists()


def _runtime_imports(path: Path) -> set[str]:
    """Every module ``path`` imports when it runs (in functions too), leaving out ``if TYPE_CHECKING:`` blocks."""
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text()))
    return found


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    out, state = [], {}

    def walk(node: str, trail: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                out.append(trail[trail.index(nxt) :] + [nxt])
            elif nxt not in state:
                walk(nxt, trail + [nxt])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            walk(node, [node])
    return out


@pytest.mark.parametrize("part", sorted(LAYERS))
def test_no_import_circle_within_a_part(part):
    modules = {f"flightrec.{part}.{p.stem}": p for p in (ROOT / part).glob("*.py") if p.stem != "__init__"}
    graph = {m: {i for i in _runtime_imports(p) if i in modules and i != m} for m, p in modules.items()}
    assert _cycles(graph) == [], "modules of a part import each other in a circle (in functions too): split one"


def test_the_circle_test_finds_a_circle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c", "a"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


_MARKER = re.compile(r"#\s*(type: ignore(\[[a-z, -]+\])?|noqa(: [A-Z0-9, ]+)?)(?P<rest>.*)$")


def test_every_type_ignore_and_noqa_says_why():
    bare = []
    for folder in [*MAPPED, "tests", "benchmarks", "scripts"]:
        for path in (ROOT / folder).rglob("*.py"):
            if "__pycache__" in path.parts:
                continue
            for no, line in enumerate(path.read_text().splitlines(), 1):
                m = _MARKER.search(line)
                if m and not re.match(r"\s*(-|#|\()\s*\w", m.group("rest")):
                    bare.append(f"{path.relative_to(ROOT)}:{no}: {line.strip()}")
    assert not bare, "say why after the marker (`# type: ignore[code]  # why`):\n" + "\n".join(bare)
