"""BENCHMARKS.md is what the benchmarks' result files say (as docs/cli.md is what the parser says), and every
benchmark writes one: benchmarks/record.py writes, scripts/benchmarks_doc.py renders."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent
BENCHMARKS = ROOT / "benchmarks"
MAX_LINES = 200


def _module(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def doc() -> ModuleType:
    return _module(ROOT / "scripts" / "benchmarks_doc.py")


@pytest.fixture(scope="module")
def record() -> ModuleType:
    return _module(BENCHMARKS / "record.py")


def test_benchmarks_md_is_current(doc):
    assert (ROOT / "BENCHMARKS.md").read_text() == doc.render(), "run `make docs`"


def test_benchmarks_md_is_short(doc):
    lines = doc.render().count("\n")
    assert lines <= MAX_LINES, f"BENCHMARKS.md has {lines} lines: at most {MAX_LINES}, one table per benchmark"


def test_every_benchmark_writes_a_result_and_has_one():
    """Each benchmark script calls the writer, and its result file is there (seeded or from its last run)."""
    for script in sorted(BENCHMARKS.glob("bench_*.py")):
        assert "record.write(" in script.read_text(), f"{script.name} writes no result file (benchmarks/record.py)"
        assert (BENCHMARKS / "results" / f"{script.stem}.json").exists(), f"no result file for {script.name}"


def test_every_result_states_its_command_machine_and_baselines(doc):
    for result in doc.load():
        assert result["command"].startswith("PYTHONSAFEPATH=1 .venv/bin/python benchmarks/"), result["bench"]
        assert (BENCHMARKS / f"{result['bench']}.py").exists(), f"a result of no benchmark: {result['bench']}"
        assert result["machine"] and result["when"] and result["figures"], result["bench"]
        for figure in result["figures"]:
            assert figure["value"] and figure["baseline"], (result["bench"], figure)


def test_a_written_result_is_rendered_with_its_command_machine_and_baseline(record, doc, tmp_path):
    figures = [
        record.Figure("encode, lines/s", "1,000", "10 (1 line/msg)", "100x | met"),
        record.Figure("peak RSS", "86 MiB"),
    ]
    path = record.write(
        "bench_x", "X", "What it measures.", figures, directory=tmp_path, argv=["benchmarks/bench_x.py", "--runs", "2"]
    )
    result = json.loads(path.read_text())
    assert result["command"] == "PYTHONSAFEPATH=1 .venv/bin/python benchmarks/bench_x.py --runs 2"
    assert "cores" in result["machine"] and "Python" in result["machine"]
    text = doc.render(tmp_path)
    assert "## X" in text and result["command"] in text and result["machine"] in text
    assert "| encode, lines/s | 1,000 | 10 (1 line/msg) | 100x \\| met |" in text  # a | in a cell is escaped
    assert f"| peak RSS | 86 MiB | {record.NO_BASELINE} |  |" in text


def test_a_result_without_figures_is_refused(record, tmp_path):
    with pytest.raises(ValueError):
        record.write("bench_x", "X", "", [], directory=tmp_path)
    assert not list(tmp_path.iterdir())
