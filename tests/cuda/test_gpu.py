"""On a machine with an NVIDIA GPU and pycuda: the CUDA backend's roots equal the CPU backend's.

Everywhere else these tests are skipped with the reason (CI has no GPU); they are not counted
as passing. `python -m flightrec.cuda.bench_device` runs the same check plus the timings.
"""

from __future__ import annotations

import random

import numpy as np
import pytest

from flightrec.cuda.backend import CpuProver
from flightrec.cuda.proof import ProofParams


def _gpu_reason() -> str | None:
    try:
        import pycuda.driver as drv
    except ImportError:
        return "pycuda is not installed (pip install 'flightrec[gpu]' on a machine with an NVIDIA GPU)"
    try:
        drv.init()
        if drv.Device.count() == 0:
            return "no CUDA device is visible"
    except Exception as exc:  # a driver that cannot initialise
        return f"CUDA cannot initialise: {exc}"
    return None


REASON = _gpu_reason()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(REASON is not None, reason=REASON or "")]


@pytest.mark.parametrize("log_n, width", [(8, 8), (10, 4), (12, 8)])
def test_gpu_root_equals_cpu_root_on_fresh_seeds(log_n, width):
    from flightrec.cuda.gpu import CudaProver

    params = ProofParams(width=width, log_n=log_n, log_blowup=2)
    seeds = [random.randrange(1 << 62) for _ in range(3)]
    cpu = CpuProver(params)
    with CudaProver(params) as gpu:
        for seed in seeds:
            assert gpu.prove(seed) == cpu.prove(seed), f"seed {seed}"


def test_gpu_extension_equals_cpu_extension():
    from flightrec.cuda.gpu import CudaProver
    from flightrec.cuda.proof import extend
    from flightrec.cuda.trace import trace

    params = ProofParams(width=4, log_n=10, log_blowup=2)
    with CudaProver(params) as gpu:
        gpu.prove(7)
        np.testing.assert_array_equal(gpu.extension(), extend(trace(7, params.width, params.log_n), params))
