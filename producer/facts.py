"""Instance facts: what the machine is (GPU from nvidia-smi, host, CPU, RAM), with a JSON override."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
from collections.abc import Mapping
from dataclasses import fields
from typing import Any

from flightrec.schemas import InstanceFacts

from flightrec import __version__
from flightrec.errors import ConfigError

GPU_FIELDS = ("gpu_model", "gpu_count", "gpu_memory_mib", "driver_version", "cuda_version", "compute_capability")
_BASE_FIELDS = {"event_id", "instance_id", "boot_id", "seq", "ts_us"}
FACT_FIELDS = tuple(f.name for f in fields(InstanceFacts) if f.name not in _BASE_FIELDS)
PROBE_TIMEOUT_S = 15.0


def parse_gpu_query(csv: str) -> dict[str, Any]:
    """Pure: facts from ``nvidia-smi --query-gpu=name,memory.total,driver_version,compute_cap
    --format=csv,noheader,nounits`` output (one line per GPU; several models are joined by ' + ')."""
    rows = [[c.strip() for c in line.split(",")] for line in csv.splitlines() if line.strip()]
    if not rows:
        raise ValueError("nvidia-smi listed no GPU")
    models: list[str] = []
    for r in rows:
        if len(r) < 4:
            raise ValueError(f"unexpected nvidia-smi line: {','.join(r)!r}")
        if r[0] not in models:
            models.append(r[0])
    mem = [int(float(r[1])) for r in rows if re.fullmatch(r"[\d.]+", r[1])]
    caps = sorted({r[3] for r in rows})
    return {
        "gpu_model": " + ".join(models),
        "gpu_count": len(rows),
        "gpu_memory_mib": min(mem) if mem else 0,
        "driver_version": rows[0][2],
        "compute_capability": ",".join(caps),
    }


def parse_cuda_version(text: str) -> str:
    """Pure: the 'CUDA Version: 12.4' of nvidia-smi's banner, or ''."""
    m = re.search(r"CUDA Version\s*:\s*([\d.]+)", text)
    return m.group(1) if m else ""


def _run(argv: list[str]) -> str:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=PROBE_TIMEOUT_S, stdin=subprocess.DEVNULL)
    if proc.returncode != 0:
        last = (proc.stderr.strip() or proc.stdout.strip()).splitlines()[-1:] or [""]
        raise RuntimeError(f"`{' '.join(argv[:2])}` exited with code {proc.returncode}: {last[0][:300]}")
    return proc.stdout


def probe_gpu() -> dict[str, Any]:
    """GPU facts from nvidia-smi; where it is missing or fails, ``gpu_probe_error`` says why."""
    smi = shutil.which("nvidia-smi")
    if not smi:
        return {"gpu_probe_error": "nvidia-smi not found on PATH (no NVIDIA driver in this machine or container)"}
    try:
        out = parse_gpu_query(
            _run([smi, "--query-gpu=name,memory.total,driver_version,compute_cap", "--format=csv,noheader,nounits"])
        )
        try:
            out["cuda_version"] = parse_cuda_version(_run([smi]))
        except (RuntimeError, OSError, subprocess.TimeoutExpired):
            out["cuda_version"] = ""
        out["gpu_probe_error"] = None
        return out
    except subprocess.TimeoutExpired:
        return {"gpu_probe_error": f"nvidia-smi did not answer within {PROBE_TIMEOUT_S:.0f}s"}
    except (RuntimeError, OSError, ValueError) as exc:
        return {"gpu_probe_error": str(exc)}


def probe_host() -> dict[str, Any]:
    """Host name, CPU model and count, RAM (from /proc where there is one)."""
    cpu_model = ""
    ram_mib = 0
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu_model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    ram_mib = int(line.split()[1]) // 1024
                    break
    except (OSError, ValueError, IndexError):
        pass
    return {"host": socket.gethostname(), "cpu_model": cpu_model, "cpu_count": os.cpu_count() or 0, "ram_mib": ram_mib}


def load_override(path: str) -> dict[str, Any]:
    """The InstanceFacts fields of a JSON file (FLIGHTREC_FACTS); unknown keys are a ConfigError."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"FLIGHTREC_FACTS={path}: cannot read a JSON object of facts: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"FLIGHTREC_FACTS={path}: expected a JSON object of InstanceFacts fields")
    unknown = sorted(set(data) - set(FACT_FIELDS))
    if unknown:
        raise ConfigError(f"FLIGHTREC_FACTS={path}: unknown fields {unknown}; known: {', '.join(FACT_FIELDS)}")
    if "attributes" in data:
        data["attributes"] = {str(k): str(v) for k, v in dict(data["attributes"]).items()}
    return data


def collect_facts(override: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """All fact fields: the host probe, the GPU probe (skipped when the override gives GPU facts), the override last."""
    override = dict(override or {})
    facts: dict[str, Any] = probe_host()
    if any(k in override for k in GPU_FIELDS):
        facts["gpu_probe_error"] = None
    else:
        facts.update(probe_gpu())
    facts.update(override)
    # which agent sent them (`flightrec status` lists the versions seen); an override's attributes come on top
    facts["attributes"] = {"agent_version": __version__, **dict(override.get("attributes") or {})}
    return facts
