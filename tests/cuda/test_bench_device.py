"""The GPU run rehearsed here: bench_device and scripts/device_run.sh with the CPU standing in for the GPU.

Real subprocesses, real files; the rehearsal goes through the same code as the GPU run
apart from the device (CpuStandIn instead of CudaProver), so a typo or a broken step
shows up here and not in the few minutes a GPU is lent.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from flightrec.cuda import compile as cc
from flightrec.cuda import driver
from flightrec.cuda.proof import ProofParams, prove

ROOT = Path(__file__).resolve().parents[2]
SMALL_RUN = ["--backend", "cpu", "--roots-k", "8,10", "--seeds", "2", "--cpu-k", "10", "--no-smi"]


def _run(*args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONSAFEPATH": "1"}
    return subprocess.run(
        [sys.executable, "-m", "flightrec.cuda.bench_device", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


def _result(stdout: str) -> dict:
    (line,) = [x for x in stdout.splitlines() if x.startswith("RESULT ")]
    return json.loads(line[len("RESULT ") :])


@pytest.mark.slow
def test_rehearsal_checks_roots_times_sizes_and_compares_with_the_cpu(tmp_path: Path) -> None:
    out_json = tmp_path / "r.json"
    proc = _run(*SMALL_RUN, "--ks", "10,11", "--budget-s", "200", "--json", str(out_json))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    res = _result(proc.stdout)
    assert json.loads(out_json.read_text()) == res
    assert res["roots_equal"] and res["error"] == "" and res["stopped"] == []
    assert [r["k"] for r in res["roots"]] == [8, 8, 10, 10]
    for r in res["roots"]:  # real roots: recomputed here, independently of the run
        assert r["device_root"] == r["cpu_root"] == prove(r["seed"], ProofParams(8, r["k"], 2)).hex()
    assert len({r["seed"] for r in res["roots"]}) == 4, "fresh seeds"
    assert [t["k"] for t in res["timings"]] == [10, 11]
    for t in res["timings"]:
        assert t["ntt_ms"] > 0 and t["proof_ms"] > 0 and t["copy_gbs"] > 0 and t["floor_ms"] > 0
        assert t["bytes_moved"] == 2 * 8 * 8 * (1 << (t["k"] + 2)) * 2  # two passes at log m = 12, 13
    (cmp_,) = res["cpu"]
    assert cmp_["k"] == 10 and cmp_["equal"] and cmp_["device_ms"] > 0 and cmp_["cpu_ms"] > 0
    for text in ("nvcc:", "NVRTC:", "libcuda:", "pycuda:", "roots: 4/4 equal", "exit status 0"):
        assert text in proc.stdout


def test_past_the_budget_no_new_size_starts_and_the_summary_is_printed() -> None:
    proc = _run(*SMALL_RUN, "--ks", "10", "--budget-s", "0")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    res = _result(proc.stdout)
    assert res["roots"] == [] and res["timings"] == [] and res["cpu"] == []
    assert [s.split(":")[0] for s in res["stopped"]] == [
        "stopped before roots k=8",
        "stopped before timing k=10",
        "stopped before CPU comparison k=10",
    ]
    assert "== summary" in proc.stdout


@pytest.mark.slow
def test_an_error_midway_still_prints_what_was_measured() -> None:
    # k = 31 with blowup 4 is past the field's two-adicity: ProofParams raises in the middle of the run.
    proc = _run(*SMALL_RUN, "--ks", "10,31,11", "--budget-s", "200")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    res = _result(proc.stdout)
    assert [t["k"] for t in res["timings"]] == [10]
    assert len(res["roots"]) == 4 and res["roots_equal"]
    assert res["error"].startswith("ValueError") and "k=31" in res["error"]
    assert "Traceback" in proc.stdout and "exit status 2" in proc.stdout
    summary = proc.stdout[proc.stdout.index("== summary") :]
    assert "\n 10 " in summary and "error: ValueError" in summary


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="this machine has an NVIDIA driver")
def test_the_cuda_backend_without_a_driver_says_why_and_exits_2() -> None:
    proc = _run("--backend", "cuda", "--roots-k", "8", "--ks", "10", "--cpu-k", "", "--budget-s", "100")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    res = _result(proc.stdout)
    assert res["error"].startswith("CUDA cannot serve") and "libcuda could not be loaded" in res["error"]
    assert "'cause': 'unavailable'" in res["error"]


def test_a_bad_size_list_is_refused_by_the_parser() -> None:
    proc = _run("--backend", "cpu", "--ks", "20,x")
    assert proc.returncode == 2 and "comma-separated list of integers" in proc.stderr


@pytest.mark.slow
def test_the_wrapper_rehearses_every_step_of_the_gpu_run(tmp_path: Path) -> None:
    out = tmp_path / "out"
    env = {**os.environ, "OUT": str(out), "PYTHON": sys.executable, "FLIGHTREC_DEVICE_WHEELS": str(tmp_path / "none")}
    proc = subprocess.run(
        ["sh", str(ROOT / "scripts" / "device_run.sh"), "--rehearse", "--budget-s", "100"],
        capture_output=True,
        text=True,
        timeout=280,
        env=env,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert sorted(p.name for p in out.iterdir()) == [
        "bench_device.json",
        "bench_device.txt",
        "device_run.txt",
        "prove_bench.txt",
        "test_gpu.txt",
    ]
    assert json.loads((out / "bench_device.json").read_text())["roots_equal"]
    assert "skipped" in (out / "test_gpu.txt").read_text().splitlines()[-1]
    events = [json.loads(x) for x in (out / "prove_bench.txt").read_text().splitlines() if x.startswith("{")]
    assert [e["name"].rsplit(".", 1)[-1] for e in events] == ["Throughput"] * 4 + ["BenchmarkResult"]
    assert events[-1]["verdict"] == "pass" and events[-1]["params"]["k"] == "10"
    assert "exit statuses: bench_device 0, test_gpu 0, prove bench 0" in proc.stdout


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="this machine has an NVIDIA driver")
def test_the_ctypes_driver_without_libcuda_names_what_to_install() -> None:
    with pytest.raises(driver.DriverError, match="install the NVIDIA driver"):
        driver.load()


def test_kernel_argument_codes_are_checked_before_any_launch() -> None:
    fn = driver.Function(handle=None, name="ntt_pass")
    with pytest.raises(driver.DriverError, match="not supported"):
        fn.prepare("PZ")
    with pytest.raises(driver.DriverError, match="prepare"):
        fn.prepared_call((1, 1, 1), (1, 1, 1), 1)
    fn.prepare("PQI")
    with pytest.raises(driver.DriverError, match="one code per argument"):
        fn.prepared_call((1, 1, 1), (1, 1, 1), 1, 2)


NVRTC = cc.load_nvrtc()


@pytest.mark.skipif(NVRTC is None, reason="no NVRTC here: pip install nvidia-cuda-nvrtc-cu12")
def test_nvrtc_is_found_in_a_toolkit_named_by_cuda_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert NVRTC is not None
    lib64 = tmp_path / "cuda" / "lib64"
    lib64.mkdir(parents=True)
    (lib64 / Path(NVRTC.path).name).symlink_to(NVRTC.path)
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "cuda"))
    assert str(lib64 / Path(NVRTC.path).name) in cc._nvrtc_candidates()


@pytest.mark.skipif(NVRTC is None, reason="no NVRTC here: pip install nvidia-cuda-nvrtc-cu12")
def test_the_kernels_are_compiled_once_per_architecture() -> None:
    cc.compile_cubin_any.cache_clear()
    first = cc.compile_cubin_any("sm_90")
    assert first[0][:4] == b"\x7fELF" and cc.compile_cubin_any("sm_90") is first
    assert cc.compile_cubin_any.cache_info().hits == 1


@pytest.mark.skipif(NVRTC is None, reason="no NVRTC here: pip install nvidia-cuda-nvrtc-cu12")
def test_nvrtc_is_found_in_the_cuda_13_wheel_layout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert NVRTC is not None
    lib = tmp_path / "nvidia" / "cu13" / "lib"
    lib.mkdir(parents=True)
    (lib / Path(NVRTC.path).name).symlink_to(NVRTC.path)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert cc._nvrtc_candidates()[0] == str(lib / Path(NVRTC.path).name)
