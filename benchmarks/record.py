"""A benchmark's result file: today's figures, each beside the baseline measured in the same run, the command and
the machine. Every ``bench_*.py`` ends with :func:`write` (``benchmarks/results/<bench>.json``);
``scripts/benchmarks_doc.py`` renders BENCHMARKS.md from these files (``make docs``; ``make bench`` runs it last).

A figure with no baseline in its run says so (``NO_BASELINE``): a baseline from another run is not one.
"""

from __future__ import annotations

import json
import os
import platform
import shlex
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
ROOT = Path(__file__).resolve().parent.parent
NO_BASELINE = "none in the run"


@dataclass(frozen=True)
class Figure:
    """One row of a benchmark's table: what was measured, today's value, the baseline of the same run."""

    figure: str
    value: str
    baseline: str = NO_BASELINE
    note: str = ""  # the ratio to the baseline, the goal and whether it is met


def machine() -> str:
    """This machine in one line: cores, memory, Python, GPU, the load average at the time of the call."""
    cores = os.cpu_count() or 0
    try:
        kib = next(
            int(line.split()[1]) for line in Path("/proc/meminfo").read_text().splitlines() if "MemTotal" in line
        )
        memory = f"{round(kib / (1 << 20))} GiB"
    except (OSError, StopIteration, ValueError):
        memory = "memory unknown"
    gpu = "a GPU" if Path("/dev/nvidia0").exists() else "no GPU"
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    return f"{cores} cores, {memory}, Python {platform.python_version()}, {gpu}; load {load:.1f}"


def command(argv: Sequence[str] | None = None) -> str:
    """The command that ran this benchmark, as run from the repository root."""
    args = list(sys.argv if argv is None else argv)
    script = Path(args[0]).resolve() if args else Path("benchmarks")
    with_root = script.relative_to(ROOT) if script.is_relative_to(ROOT) else script
    return "PYTHONSAFEPATH=1 .venv/bin/python " + shlex.join([str(with_root), *args[1:]])


def write(
    bench: str,
    title: str,
    what: str,
    figures: Sequence[Figure],
    *,
    directory: Path = RESULTS,
    argv: Sequence[str] | None = None,
) -> Path:
    """Write ``<directory>/<bench>.json`` (``bench``: the script's name without ``.py``) and return its path.

    ``what``: one or two sentences on what the run measures and what its baseline is."""
    if not figures:
        raise ValueError(f"{bench}: a result needs at least one figure")
    result = {
        "bench": bench,
        "title": title,
        "what": what,
        "command": command(argv),
        "machine": machine(),
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "figures": [asdict(f) for f in figures],
    }
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{bench}.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(result, indent=1, ensure_ascii=False) + "\n")
    tmp.replace(path)
    print(f"result: {path}")
    return path
