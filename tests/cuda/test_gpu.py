"""On a machine with an NVIDIA GPU: the CUDA backend's roots equal the CPU backend's, on every driver there.

The drivers are pycuda (where installed) and the ctypes binding to libcuda (wherever an NVIDIA
driver is); each test runs once per driver that can serve. Everywhere else these tests are
skipped with the reason (CI has no GPU); they are not counted as passing.
`sh scripts/device_run.sh` runs them on the GPU machine after `flightrec.cuda.bench_device`.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
from flightrec.cuda.backend import CpuProver
from flightrec.cuda.proof import ProofParams


def _driver_reasons() -> dict[str, str | None]:
    """Each driver and why it cannot serve here (None where it can)."""
    out: dict[str, str | None] = {}
    try:
        import pycuda.driver as drv

        try:
            drv.init()
            out["pycuda"] = None if drv.Device.count() > 0 else "pycuda sees no CUDA device"
        except Exception as exc:  # a driver that cannot initialise
            out["pycuda"] = f"CUDA cannot initialise through pycuda: {exc}"
    except ImportError:
        out["pycuda"] = "pycuda is not installed (pip install 'flightrec[gpu]' on a machine with an NVIDIA GPU)"
    from flightrec.cuda import driver

    try:
        driver.init()
        out["ctypes"] = None if driver.Device.count() > 0 else "libcuda sees no CUDA device"
    except driver.DriverError as exc:
        out["ctypes"] = f"no usable NVIDIA driver: {exc}"
    return out


REASONS = _driver_reasons()
DRIVERS = [pytest.param(d, marks=pytest.mark.skipif(why is not None, reason=why or "")) for d, why in REASONS.items()]
pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("driver", DRIVERS)
@pytest.mark.parametrize("log_n, width", [(8, 8), (10, 4), (12, 8)])
def test_gpu_root_equals_cpu_root_on_fresh_seeds(driver, log_n, width):
    from flightrec.cuda.gpu import CudaProver

    params = ProofParams(width=width, log_n=log_n, log_blowup=2)
    seeds = [random.randrange(1 << 62) for _ in range(3)]
    cpu = CpuProver(params)
    with CudaProver(params, driver=driver) as gpu:
        assert gpu.driver == driver
        for seed in seeds:
            assert gpu.prove(seed) == cpu.prove(seed), f"seed {seed}"


@pytest.mark.parametrize("driver", DRIVERS)
def test_gpu_extension_equals_cpu_extension(driver):
    from flightrec.cuda.gpu import CudaProver
    from flightrec.cuda.proof import extend
    from flightrec.cuda.trace import trace

    params = ProofParams(width=4, log_n=10, log_blowup=2)
    with CudaProver(params, driver=driver) as gpu:
        gpu.prove(7)
        np.testing.assert_array_equal(gpu.extension(), extend(trace(7, params.width, params.log_n), params))


@pytest.mark.parametrize("driver", DRIVERS)
def test_gpu_timers_and_bandwidth_figures_are_sane(driver):
    from flightrec.cuda.gpu import CudaProver

    params = ProofParams(width=8, log_n=16, log_blowup=2)
    with CudaProver(params, driver=driver) as gpu:
        gpu.prove(1)
        assert gpu.timed_ms(gpu.forward_ntt, 3) > 0
        assert gpu.copy_bandwidth_gbs() > 1.0
        assert gpu.peak_bandwidth_gbs() >= 0.0
        assert gpu.facts["cuda_driver_api"] == driver
