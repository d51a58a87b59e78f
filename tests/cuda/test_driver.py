"""flightrec.cuda.driver (the ctypes binding to libcuda) against a stand-in libcuda built here from C.

There is no GPU here, so tests/cuda/fake_libcuda.c stands in for the driver library: host memory
as device memory, kernels not run (except a 'fill' kernel that shows how arguments are packed).
What is tested is real: the C calling convention, argument types and sizes, kernel-parameter
packing, error names, and CudaProver's use of the binding from init to close.
"""

from __future__ import annotations

import ctypes
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from flightrec.cuda import compile as cc
from flightrec.cuda import driver, plan
from flightrec.cuda.gpu import CudaProver, DeviceError
from flightrec.cuda.proof import ProofParams

HERE = Path(__file__).resolve().parent
CC = shutil.which("cc") or shutil.which("gcc")


@pytest.fixture(scope="module")
def fake_lib(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if CC is None:
        pytest.skip("no C compiler here to build the stand-in libcuda (apt-get install gcc)")
    out = tmp_path_factory.mktemp("fakecuda") / "libcuda.so.1"
    subprocess.run([CC, "-shared", "-fPIC", "-O1", "-o", str(out), str(HERE / "fake_libcuda.c")], check=True)
    return out


@pytest.fixture()
def fake(fake_lib: Path, monkeypatch: pytest.MonkeyPatch) -> ctypes.CDLL:
    monkeypatch.setattr(driver, "LIBRARY_NAMES", (str(fake_lib),))
    monkeypatch.setattr(driver, "_lib", None)
    lib = driver.load()
    assert lib._name == str(fake_lib)
    return lib


def _last_launch(lib: ctypes.CDLL) -> tuple[int, list[int]]:
    dims = (ctypes.c_uint * 7)()
    n = lib.fake_last_launch(dims)
    return n, list(dims)


def test_device_queries_memory_kernels_and_events(fake: ctypes.CDLL) -> None:
    driver.init()
    assert driver.get_driver_version() == 13000 and driver.Device.count() == 1
    dev = driver.Device(0)
    assert (dev.name(), dev.compute_capability(), dev.total_memory()) == ("Fake H200", (9, 0), 141 << 30)
    ctx = dev.make_context()
    assert fake.fake_context_depth() == 1
    assert driver.Context.get_device().get_attribute(driver.device_attribute.MULTIPROCESSOR_COUNT) == 132
    assert driver.mem_get_info() == (140 << 30, 141 << 30)

    host = np.arange(1000, dtype=np.uint64) * 3
    a, b = driver.mem_alloc(host.nbytes), driver.mem_alloc(host.nbytes)
    driver.memcpy_htod(a, host)
    driver.memcpy_dtod(b, a, host.nbytes)
    back = np.empty_like(host)
    driver.memcpy_dtoh(back, b)
    np.testing.assert_array_equal(back, host)

    fill = driver.module_from_buffer(b"\x7fELF fake cubin").get_function("fill").prepare("PQI")
    fill.prepared_call((3, 2), (256, 1, 1), a, np.uint64(2**63 + 5), np.uint32(10))
    assert _last_launch(fake)[1] == [3, 2, 1, 256, 1, 1, 0]
    driver.memcpy_dtoh(back, a)
    np.testing.assert_array_equal(back[:10], np.arange(10, dtype=np.uint64) + np.uint64(2**63 + 5))
    np.testing.assert_array_equal(back[10:], host[10:])

    start, stop = driver.Event(), driver.Event()
    start.record()
    stop.record().synchronize()
    assert start.time_till(stop) >= 0.0
    a.free()
    a.free()  # twice is safe
    b.free()
    ctx.pop()
    ctx.detach()
    assert fake.fake_context_depth() == 0


def test_errors_carry_the_cuda_error_name_and_classify(fake: ctypes.CDLL) -> None:
    driver.init()
    with pytest.raises(driver.DriverError, match="cuMemAlloc failed: CUDA_ERROR_OUT_OF_MEMORY: out of memory") as oom:
        driver.mem_alloc(1 << 40)
    assert CudaProver._classify(oom.value, "setup") == "out-of-memory"
    with pytest.raises(driver.DriverError, match="CUDA_ERROR_INVALID_IMAGE") as bad:
        driver.module_from_buffer(b"not a cubin")
    assert CudaProver._classify(bad.value, "load") == "no-kernel-image"
    with pytest.raises(driver.DriverError, match="CUDA_ERROR_NOT_FOUND"):
        driver.module_from_buffer(b"\x7fELF").get_function("missing")
    with pytest.raises(driver.DriverError, match="C-contiguous"):
        driver.memcpy_htod(driver.mem_alloc(64), np.zeros((4, 4), dtype=np.uint64)[:, ::2])


@pytest.mark.skipif(
    cc.load_nvrtc() is None and cc.nvcc_path() is None, reason="no NVRTC or nvcc to compile the kernels"
)
def test_the_cuda_prover_runs_on_the_binding_from_init_to_close(fake: ctypes.CDLL) -> None:
    params = ProofParams(width=8, log_n=20, log_blowup=2)
    with CudaProver(params, driver="ctypes") as gpu:
        assert gpu.driver == "ctypes" and gpu.arch == "sm_90"
        facts = gpu.facts
        assert (facts["device"], facts["compute_capability"], facts["driver_version"], facts["cuda_driver_api"]) == (
            "Fake H200",
            "9.0",
            "13.0",
            "ctypes",
        )
        assert gpu.peak_bandwidth_gbs() == pytest.approx(3201e6 * 2 * 6144 / 8 / 1e9)
        before, _ = _last_launch(fake)
        gpu.forward_ntt()
        after, dims = _last_launch(fake)
        passes = plan.plan_passes(params.log_m, dif=False)
        assert after - before == len(passes) == 3
        assert dims[:4] == [passes[-1].blocks(params.log_m), params.width, 1, 256]
        assert gpu.timed_ms(gpu.forward_ntt, 2) >= 0.0
        assert len(gpu.prove(1)) == 32  # kernels do not run here: only the calls are checked
    assert fake.fake_context_depth() == 0


def test_an_init_failure_becomes_a_device_error_with_the_driver_version(
    fake: ctypes.CDLL, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_CUDA_INIT_ERROR", "1")
    with pytest.raises(DeviceError) as err:
        CudaProver(ProofParams(width=4, log_n=8), driver="ctypes")
    attrs = err.value.attributes()
    assert attrs["cause"] == "init" and attrs["driver_version"] == "13.0"
    assert "CUDA_ERROR_NO_DEVICE: no CUDA-capable device is detected" in attrs["cuda_error"]


def test_asking_for_pycuda_where_it_is_missing_says_so() -> None:
    try:
        import pycuda  # noqa: F401 - imported to see whether it is installed
    except ImportError:
        with pytest.raises(DeviceError, match="pycuda is not installed"):
            CudaProver(ProofParams(width=4, log_n=8), driver="pycuda")
    else:
        pytest.skip("pycuda is installed here")


@pytest.mark.slow
def test_the_wrapper_runs_the_cuda_branch_on_the_stand_in_driver(fake_lib: Path, tmp_path: Path) -> None:
    """scripts/device_run.sh's GPU branch end to end: every step runs; the stand-in computes nothing,
    so bench_device and test_gpu.py must both report the roots as different (they can fail)."""
    import json
    import os
    import sys

    out = tmp_path / "out"
    env = {
        **os.environ,
        "OUT": str(out),
        "PYTHON": sys.executable,
        "LD_LIBRARY_PATH": str(fake_lib.parent),
        "FLIGHTREC_DEVICE_WHEELS": str(tmp_path / "none"),
    }
    proc = subprocess.run(
        [
            "sh",
            str(HERE.parents[1] / "scripts" / "device_run.sh"),
            "--roots-k",
            "8",
            "--seeds",
            "1",
            "--ks",
            "10",
            "--cpu-k",
            "10",
            "--budget-s",
            "60",
        ],
        capture_output=True,
        text=True,
        timeout=280,
        env=env,
        cwd=tmp_path,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    res = json.loads((out / "bench_device.json").read_text())
    assert res["facts"]["device"] == "Fake H200" and res["facts"]["cuda_driver_api"] == "ctypes"
    assert not res["roots_equal"] and res["roots"][0]["extension_equal"] is False
    assert [t["k"] for t in res["timings"]] == [10] and res["timings"][0]["peak_gbs"] > 4000
    assert "MISMATCH: fix the smallest k that differs first" in (out / "bench_device.txt").read_text()
    assert " failed" in (out / "test_gpu.txt").read_text().splitlines()[-1]
    events = [json.loads(x) for x in (out / "prove_bench.txt").read_text().splitlines() if x.startswith("{")]
    assert {e["backend"] for e in events} == {"cuda"} and events[-1]["device"] == "Fake H200"
    assert "exit statuses: bench_device 1, test_gpu 1, prove bench 0" in proc.stdout
