"""Choosing a backend: ``cpu`` (NumPy), ``cuda`` (PyCUDA) or ``auto`` (CUDA when a device can serve)."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Protocol

from flightrec.cuda.proof import ProofParams, prove

log = logging.getLogger(__name__)

BACKENDS = ("auto", "cuda", "cpu")


class Prover(Protocol):
    """A backend sized for one ProofParams; ``prove(seed)`` returns the 32-byte root."""

    backend: str
    params: ProofParams

    @property
    def device(self) -> str: ...

    @property
    def facts(self) -> dict[str, str]: ...

    def prove(self, seed: int) -> bytes: ...

    def close(self) -> None: ...


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo, or the machine type where there is none."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return os.uname().machine


class CpuProver:
    """The NumPy backend (flightrec.cuda.proof.prove); holds nothing between proofs."""

    backend = "cpu"

    def __init__(self, params: ProofParams) -> None:
        self.params = params
        self._device = f"{cpu_model()} x{os.cpu_count() or 1}"

    @property
    def device(self) -> str:
        return self._device

    @property
    def facts(self) -> dict[str, str]:
        return {"device": self._device}

    def prove(self, seed: int) -> bytes:
        return prove(seed, self.params)

    def close(self) -> None:
        return None


def open_prover(backend: str, params: ProofParams) -> tuple[Prover, str]:
    """A ready prover and, for ``auto`` falling back to the CPU, why CUDA could not serve ("" otherwise).

    ``cuda`` raises DeviceError (a ProveError) when CUDA cannot serve; ``auto`` never does.
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(BACKENDS)}; got {backend!r}")
    if backend == "cpu":
        return CpuProver(params), ""
    from flightrec.cuda.gpu import CudaProver, DeviceError

    try:
        return CudaProver(params), ""
    except DeviceError as exc:
        if backend == "cuda":
            raise
        log.info("CUDA cannot serve, proving on the CPU: %s", exc)
        return CpuProver(params), str(exc)
