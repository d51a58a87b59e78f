"""The benchmark's events and verdicts, with an emitter that collects them in a list.

There is no GPU here: the CUDA paths run for real up to where a GPU is needed
(pycuda is not installed, so `--backend cuda` fails at import), and where a test
needs a GPU that misbehaves, a stand-in for pycuda's driver module (it cannot run
here) raises the errors a real driver raises.
"""

from __future__ import annotations

import sys
import types
from typing import Any

import pytest
from flightrec.cuda import bench
from flightrec.cuda.backend import CpuProver, open_prover
from flightrec.cuda.gpu import CudaProver, DeviceError
from flightrec.cuda.proof import ProofParams, prove
from flightrec.schemas import BenchmarkResult, Event, Lifecycle, Throughput, decode, encode, new_event_id, now_us

SMALL = ProofParams(width=4, log_n=8, log_blowup=2)


class Collector:
    """An emitter like the agent's: fills the envelope, keeps the events (and round-trips the codec)."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self.boot = new_event_id()

    def __call__(self, cls: type[Event], **fields: Any) -> Event:
        event = cls(
            event_id=new_event_id(),
            instance_id="test",
            boot_id=self.boot,
            seq=len(self.events),
            ts_us=now_us(),
            **fields,
        )
        assert decode(encode(event)) == event  # every emitted event is a valid wire event
        self.events.append(event)
        return event

    def of(self, cls: type[Event]) -> list[Any]:
        return [e for e in self.events if isinstance(e, cls)]


def test_cpu_benchmark_emits_a_throughput_per_proof_and_a_passing_result() -> None:
    emit = Collector()
    out = bench.run_benchmark(SMALL, backend="cpu", warmup=1, proofs=2, seed=10, emit=emit)
    tps = emit.of(Throughput)
    assert [t.phase for t in tps] == ["warmup", "measured", "measured"]
    assert [t.params["seed"] for t in tps] == ["10", "11", "12"]
    assert tps[1].params["root"] == prove(11, SMALL).hex()
    assert all(t.backend == "cpu" and t.proofs == 1 and t.seconds > 0 for t in tps)
    assert all(t.proofs_per_hour == pytest.approx(3600 / t.seconds) for t in tps)
    (result,) = emit.of(BenchmarkResult)
    assert result.verdict == "pass" and out.exit_code == 0
    assert result.proofs == 2
    assert result.proofs_per_hour == pytest.approx(3600 * 2 / (tps[1].seconds + tps[2].seconds))
    assert result.params == {"k": "8", "width": "4", "blowup": "4"}
    assert emit.events[-1] is result


def test_below_the_minimum_rate_fails_with_exit_1() -> None:
    emit = Collector()
    out = bench.run_benchmark(SMALL, backend="cpu", warmup=0, proofs=1, min_rate=1e15, emit=emit)
    (result,) = emit.of(BenchmarkResult)
    assert (result.verdict, out.verdict, out.exit_code) == ("fail", "fail", 1)
    assert result.min_rate == 1e15


def test_cuda_without_pycuda_fails_naming_the_cause() -> None:
    if _cuda_may_serve():
        pytest.skip("pycuda or an NVIDIA driver is here; this test is about machines without either")
    emit = Collector()
    out = bench.run_benchmark(SMALL, backend="cuda", emit=emit)
    (failed,) = emit.of(Lifecycle)
    assert failed.state == "failed" and failed.stage == "benchmark"
    assert "pycuda is not installed" in failed.attributes["cuda_error"]
    assert "libcuda could not be loaded" in failed.attributes["cuda_error"]
    assert failed.attributes["cause"] == "unavailable"
    (result,) = emit.of(BenchmarkResult)
    assert result.verdict == "error" and "pycuda" in result.detail
    assert not emit.of(Throughput)
    assert out.exit_code == 2


def test_auto_falls_back_to_the_cpu_and_says_why() -> None:
    if _cuda_may_serve():
        pytest.skip("pycuda or an NVIDIA driver is here; auto may pick the GPU")
    emit = Collector()
    out = bench.run_benchmark(SMALL, backend="auto", warmup=0, proofs=1, emit=emit)
    (info,) = emit.of(Lifecycle)
    assert info.state == "info" and "pycuda" in info.detail
    assert out.backend == "cpu" and out.exit_code == 0


def _cuda_may_serve() -> bool:
    """pycuda, or an NVIDIA driver the ctypes binding can use: either way CUDA may serve here."""
    import importlib.util

    from flightrec.cuda import driver

    if importlib.util.find_spec("pycuda") is not None:
        return True
    try:
        driver.load()
    except driver.DriverError:
        return False
    return True


def _fake_pycuda(monkeypatch: pytest.MonkeyPatch, init_error: str | None = None, free: int = 80 << 30) -> None:
    """A stand-in for pycuda.driver (a GPU cannot run here) that reports an H100 or fails cuInit."""

    class Dev:
        def __init__(self, i: int) -> None: ...
        @staticmethod
        def count() -> int:
            return 1

        def name(self) -> str:
            return "NVIDIA H100 80GB HBM3"

        def compute_capability(self) -> tuple[int, int]:
            return (9, 0)

        def total_memory(self) -> int:
            return 80 << 30

        def make_context(self) -> Any:
            return types.SimpleNamespace(pop=lambda: None, detach=lambda: None)

    def init() -> None:
        if init_error:
            raise RuntimeError(init_error)

    drv = types.ModuleType("pycuda.driver")
    drv.init = init
    drv.get_driver_version = lambda: 12040
    drv.Device = Dev
    drv.mem_get_info = lambda: (free, 80 << 30)
    pkg = types.ModuleType("pycuda")
    pkg.driver = drv
    monkeypatch.setitem(sys.modules, "pycuda", pkg)
    monkeypatch.setitem(sys.modules, "pycuda.driver", drv)


def test_init_failure_carries_the_driver_text_and_version(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_pycuda(monkeypatch, init_error="cuInit failed: no CUDA-capable device is detected")
    emit = Collector()
    out = bench.run_benchmark(SMALL, backend="cuda", emit=emit)
    (failed,) = emit.of(Lifecycle)
    assert failed.attributes["cuda_error"] == "cuInit failed: no CUDA-capable device is detected"
    assert failed.attributes["driver_version"] == "12.4"
    assert failed.attributes["cause"] == "init"
    assert "no CUDA-capable device" in failed.detail
    assert out.exit_code == 2


def test_too_little_device_memory_is_refused_before_allocating(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_pycuda(monkeypatch, free=1 << 20)
    emit = Collector()
    out = bench.run_benchmark(ProofParams(log_n=20), backend="cuda", emit=emit)
    (failed,) = emit.of(Lifecycle)
    attrs = failed.attributes
    assert (attrs["cause"], attrs["device"], attrs["compute_capability"], attrs["driver_version"]) == (
        "out-of-memory",
        "NVIDIA H100 80GB HBM3",
        "9.0",
        "12.4",
    )
    assert "GiB" in attrs["cuda_error"] and "lower --k" in failed.detail
    (result,) = emit.of(BenchmarkResult)
    assert result.verdict == "error" and result.device == "NVIDIA H100 80GB HBM3"
    assert out.exit_code == 2


class FailingGpu:
    """Stands in for a CUDA prover (no GPU here) whose second proof hits a kernel error."""

    backend = "cuda"
    device = "NVIDIA H200"
    facts = {"device": "NVIDIA H200", "compute_capability": "9.0", "driver_version": "12.8"}

    def __init__(self) -> None:
        self.calls = 0
        self.closed = False

    def prove(self, seed: int) -> bytes:
        self.calls += 1
        if self.calls == 2:
            raise DeviceError("kernel", "cuCtxSynchronize failed: an illegal memory access was encountered", self.facts)
        return bytes(32)

    def close(self) -> None:
        self.closed = True


def test_a_kernel_error_mid_benchmark_is_reported_and_the_device_released() -> None:
    gpu = FailingGpu()
    emit = Collector()
    out = bench.run_benchmark(
        SMALL, backend="cuda", warmup=1, proofs=2, emit=emit, open_fn=lambda backend, params: (gpu, "")
    )
    assert len(emit.of(Throughput)) == 1
    (failed,) = emit.of(Lifecycle)
    assert failed.attributes["cuda_error"].endswith("illegal memory access was encountered")
    assert failed.attributes["compute_capability"] == "9.0"
    assert emit.of(BenchmarkResult)[0].verdict == "error"
    assert gpu.closed and out.exit_code == 2


def test_error_classification() -> None:
    cls = CudaProver._classify
    assert cls(RuntimeError("cuModuleLoadDataEx failed: device kernel image is invalid"), "load") == "no-kernel-image"
    assert cls(RuntimeError("no kernel image is available for execution on the device"), "kernel") == "no-kernel-image"
    assert cls(RuntimeError("cuMemAlloc failed: out of memory"), "setup") == "out-of-memory"
    assert cls(RuntimeError("launch failed"), "kernel") == "kernel"


def test_backend_choice() -> None:
    prover, why = open_prover("cpu", SMALL)
    assert isinstance(prover, CpuProver) and why == ""
    with pytest.raises(ValueError):
        open_prover("tpu", SMALL)
    with pytest.raises(ValueError):
        bench.run_benchmark(SMALL, backend="cpu", proofs=0, emit=Collector())
