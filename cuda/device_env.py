"""What a machine offers for the CUDA backend: nvidia-smi, toolkits, compilers, NVRTC, libcuda, pycuda.

Used by bench_device.py to print the environment before measuring; every probe is
bounded in time and a probe that fails says so instead of stopping the run.
"""

from __future__ import annotations

import importlib.metadata
import logging
import os
import platform
import shutil
import subprocess
import sys
from dataclasses import dataclass

from flightrec.cuda import compile as cc

log = logging.getLogger(__name__)

PROBE_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class Probe:
    """One thing looked at: a label and what was found (several lines where a command printed them)."""

    label: str
    text: str


def run_command(cmd: list[str], timeout_s: float = PROBE_TIMEOUT_S) -> str:
    """A command's stdout and stderr, or a line saying why it could not run."""
    exe = shutil.which(cmd[0])
    if exe is None:
        return f"{cmd[0]}: not found on PATH"
    try:
        proc = subprocess.run([exe, *cmd[1:]], capture_output=True, text=True, timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{cmd[0]}: could not run ({exc})"
    text = (proc.stdout + proc.stderr).rstrip()
    return text if proc.returncode == 0 else f"{text}\n({cmd[0]} exited {proc.returncode})"


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _libcuda() -> str:
    from flightrec.cuda import driver

    try:
        lib = driver.load()
        v = driver.get_driver_version()
    except driver.DriverError as exc:
        return str(exc)
    return f"{lib._name}: driver API {v // 1000}.{v % 1000 // 10}"


def _nvrtc() -> str:
    try:
        nvrtc = cc.load_nvrtc()
    except OSError as exc:
        return f"could not load: {exc}"
    return "not found" if nvrtc is None else f"{nvrtc.path}: version {nvrtc.version[0]}.{nvrtc.version[1]}"


def _pycuda() -> str:
    try:
        import pycuda
    except ImportError as exc:
        return f"not importable ({exc})"
    return f"{getattr(pycuda, 'VERSION_TEXT', '?')} at {os.path.dirname(pycuda.__file__)}"


def _toolkits() -> str:
    homes = cc.cuda_homes()
    if not homes:
        return "none found ($CUDA_HOME, $CUDA_PATH, nvcc's folder, /usr/local/cuda*)"
    lines = []
    for home in homes:
        version = home / "version.json"
        header = home / "include" / "cuda.h"
        lines.append(
            f"{home}: version.json {'yes' if version.is_file() else 'no'}, "
            f"include/cuda.h {'yes' if header.is_file() else 'no'}"
        )
    return "\n".join(lines)


def probes(with_smi: bool = True) -> list[Probe]:
    """Everything bench_device prints about the machine before it measures."""
    out = []
    if with_smi:
        out.append(Probe("nvidia-smi", run_command(["nvidia-smi"])))
        out.append(
            Probe(
                "nvidia-smi --query-gpu",
                run_command(
                    [
                        "nvidia-smi",
                        "--query-gpu=name,driver_version,memory.total,clocks.max.memory,clocks.max.sm,power.limit",
                        "--format=csv",
                    ]
                ),
            )
        )
    out += [
        Probe("python", f"{sys.executable} {platform.python_version()}"),
        Probe("machine", f"{platform.platform()}, {os.cpu_count()} CPUs"),
        Probe("numpy", _version("numpy")),
        Probe("nvcc", run_command(["nvcc", "--version"]) if cc.nvcc_path() else "not on PATH"),
        Probe("CUDA toolkits", _toolkits()),
        Probe("C/C++ compilers", ", ".join(f"{c}={shutil.which(c) or 'no'}" for c in ("gcc", "g++", "clang", "c++"))),
        Probe("NVRTC", _nvrtc()),
        Probe("libcuda", _libcuda()),
        Probe("pycuda", _pycuda()),
        Probe("cuda-python", f"cuda-python {_version('cuda-python')}, cuda-bindings {_version('cuda-bindings')}"),
    ]
    return out


def render(items: list[Probe]) -> str:
    """The probes as text: one line each, multi-line findings indented under their label."""
    lines = []
    for p in items:
        first, *rest = p.text.splitlines() or [""]
        if rest:
            lines.append(f"{p.label}:")
            lines += [f"    {line}" for line in (first, *rest)]
        else:
            lines.append(f"{p.label}: {first}")
    return "\n".join(lines)
