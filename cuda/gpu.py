"""The CUDA backend: the proof on the device through PyCUDA, data kept there between steps.

Every way CUDA can fail to serve (pycuda missing, no driver, init error, no device,
no kernel image for the architecture, out of memory, a kernel error) becomes a
DeviceError carrying the CUDA error text and whatever was learned about the device.
"""

from __future__ import annotations

import logging
import statistics
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
from flightrec.cuda import compile as cc
from flightrec.cuda import ntt, plan
from flightrec.cuda.proof import ProofParams, coset_scale

from flightrec.errors import ProveError

log = logging.getLogger(__name__)

THREADS = 256
MEMORY_HEADROOM = 0.9
"""Use at most this share of the device's free memory."""


class DeviceError(ProveError):
    """CUDA cannot serve: ``cause`` is a short class, ``cuda_error`` the CUDA text, ``facts`` the device."""

    def __init__(self, cause: str, cuda_error: str, facts: Mapping[str, str] | None = None, hint: str = "") -> None:
        self.cause = cause
        self.cuda_error = cuda_error
        self.facts = dict(facts or {})
        where = self.facts.get("device", "")
        super().__init__(
            f"CUDA {cause}{' on ' + where if where else ''}: {cuda_error}" + (f" ({hint})" if hint else "")
        )

    def attributes(self) -> dict[str, str]:
        """The failure event's attributes: device, compute_capability, driver_version, cuda_error, cause."""
        keys = ("device", "compute_capability", "driver_version")
        out = {k: self.facts.get(k, "") for k in keys}
        out.update(cuda_error=self.cuda_error, cause=self.cause)
        return out


DRIVERS = ("auto", "pycuda", "ctypes")


def _driver(choice: str = "auto") -> tuple[Any, str]:
    """(a pycuda.driver-like module, its name): pycuda where it is installed, else the ctypes binding
    to libcuda (flightrec.cuda.driver); ``choice`` forces one."""
    if choice not in DRIVERS:
        raise ValueError(f"driver must be one of {', '.join(DRIVERS)}; got {choice!r}")
    why = ""
    if choice in ("auto", "pycuda"):
        try:
            import pycuda.driver as drv

            return drv, "pycuda"
        except ImportError as exc:
            why = f"pycuda is not installed ({exc})"
            if choice == "pycuda":
                raise DeviceError(
                    "unavailable", why, hint="pip install 'flightrec[gpu]' on a machine with the CUDA toolkit"
                ) from exc
    from flightrec.cuda import driver as ctypes_driver

    try:
        ctypes_driver.load()
    except ctypes_driver.DriverError as exc:
        text = f"{why} and {exc}" if why else str(exc)
        raise DeviceError(
            "unavailable", text, hint="run on a machine with an NVIDIA driver; pip install 'flightrec[gpu]' for pycuda"
        ) from exc
    return ctypes_driver, "ctypes"


def bytes_needed(params: ProofParams) -> int:
    """Device memory one proof needs: trace, extension, two digest levels, twiddles and scales."""
    n, m, w = params.n, params.m, params.width
    return 8 * w * n + 8 * w * m + 32 * m + 16 * m + 8 * (n // 2 + m // 2 + n)


class CudaProver:
    """A context and kernels on device 0, buffers sized for ``params``; use as a context manager.

    Guarantee: ``prove(seed)`` returns the same root as flightrec.cuda.proof.prove(seed, params).
    """

    backend = "cuda"

    def __init__(self, params: ProofParams, device_index: int = 0, driver: str = "auto") -> None:
        self.params = params
        self._facts: dict[str, str] = {}
        self._ctx: Any = None
        self._bufs: list[Any] = []
        drv, self.driver = _driver(driver)
        self._drv = drv
        try:
            drv.init()
        except Exception as exc:  # pycuda raises its own RuntimeError/LogicError types
            self._learn_driver()
            raise DeviceError(
                "init", str(exc), self._facts, hint="is the NVIDIA driver loaded and a GPU visible?"
            ) from exc
        self._learn_driver()
        self._facts["cuda_driver_api"] = self.driver
        try:
            count = drv.Device.count()
        except Exception as exc:
            raise DeviceError("init", str(exc), self._facts) from exc
        if count <= device_index:
            raise DeviceError(
                "no-device", f"{count} CUDA device(s) visible, device {device_index} asked for", self._facts
            )
        dev = drv.Device(device_index)
        major, minor = dev.compute_capability()
        self._facts.update(
            device=dev.name(), compute_capability=f"{major}.{minor}", memory_bytes=str(dev.total_memory())
        )
        self.arch = f"sm_{major}{minor}"
        try:
            self._ctx = dev.make_context()
        except Exception as exc:
            raise DeviceError("init", str(exc), self._facts) from exc
        try:
            self._setup()
        except BaseException:
            self.close()
            raise

    @property
    def facts(self) -> dict[str, str]:
        """device, compute_capability, driver_version (and memory_bytes) as strings."""
        return dict(self._facts)

    @property
    def device(self) -> str:
        return self._facts.get("device", "")

    def _learn_driver(self) -> None:
        try:
            v = self._drv.get_driver_version()
            self._facts["driver_version"] = f"{v // 1000}.{v % 1000 // 10}"
        except Exception as exc:  # no driver at all: keep what we have
            log.debug("driver version unknown: %s", exc)

    def _load_module(self) -> Any:
        if self.driver == "pycuda" and cc.nvcc_path():
            from pycuda.compiler import SourceModule

            try:
                return SourceModule(
                    cc.kernel_source(),
                    no_extern_c=True,
                    include_dirs=[str(cc.source_dir())],
                    arch=self.arch,
                    options=["-std=c++17"],
                )
            except Exception as exc:
                raise DeviceError(self._classify(exc, "compile"), str(exc), self._facts) from exc
        try:
            cubin, _ = cc.compile_cubin_any(self.arch)
        except ProveError as exc:
            raise DeviceError("compile", str(exc), self._facts, hint="install nvcc or nvidia-cuda-nvrtc-cu12") from exc
        try:
            return self._drv.module_from_buffer(cubin)
        except Exception as exc:
            raise DeviceError(self._classify(exc, "load"), str(exc), self._facts) from exc

    @staticmethod
    def _classify(exc: BaseException, default: str) -> str:
        text = str(exc).lower()
        if (
            "no kernel image" in text
            or "invalid_image" in text
            or "device kernel image is invalid" in text
            or "unsupported ptx" in text
            or "no_binary_for_gpu" in text
        ):
            return "no-kernel-image"
        if "out of memory" in text or type(exc).__name__ == "MemoryError":
            return "out-of-memory"
        return default

    def _setup(self) -> None:
        drv, p = self._drv, self.params
        free, total = drv.mem_get_info()
        need = bytes_needed(p)
        if need > free * MEMORY_HEADROOM:
            raise DeviceError(
                "out-of-memory",
                f"a proof at k={p.log_n}, width {p.width}, blowup {p.blowup} needs {need / 2**30:.2f} GiB; "
                f"{free / 2**30:.2f} of {total / 2**30:.2f} GiB free",
                self._facts,
                hint="lower --k or free the GPU",
            )
        mod = self._load_module()
        try:
            self._k = {name: mod.get_function(name) for name in cc.KERNELS}
            self._k["gen_trace"].prepare("PQQ")
            self._k["ntt_pass"].prepare("PPIIIII")
            self._k["coset_scatter"].prepare("PPPIIQ")
            self._k["merkle_leaves"].prepare("PPIQ")
            self._k["merkle_level"].prepare("PPQ")
            self._sm = drv.Context.get_device().get_attribute(drv.device_attribute.MULTIPROCESSOR_COUNT)
            self.trace_buf = self._alloc(8 * p.width * p.n)
            self.ext_buf = self._alloc(8 * p.width * p.m)
            self.dig_a = self._alloc(32 * p.m)
            self.dig_b = self._alloc(16 * p.m)
            self.tw_inv_n = self._upload(ntt.twiddles(p.log_n, inverse=True))
            self.tw_m = self._upload(ntt.twiddles(p.log_m))
            self.scale = self._upload(coset_scale(p.log_n))
        except DeviceError:
            raise
        except Exception as exc:
            raise DeviceError(self._classify(exc, "setup"), str(exc), self._facts) from exc

    def _alloc(self, nbytes: int) -> Any:
        buf = self._drv.mem_alloc(nbytes)
        self._bufs.append(buf)
        return buf

    def _upload(self, arr: np.ndarray) -> Any:
        buf = self._alloc(arr.nbytes)
        self._drv.memcpy_htod(buf, np.ascontiguousarray(arr))
        return buf

    def _grid(self, count: int) -> tuple[int, int, int]:
        return (max(1, min((count + THREADS - 1) // THREADS, self._sm * 32)), 1, 1)

    def ntt(self, buf: Any, tw: Any, log_n: int, dif: bool) -> None:
        """Run a whole batched NTT (all columns) in place on ``buf``: one launch per pass."""
        for ps in plan.plan_passes(log_n, dif):
            self._k["ntt_pass"].prepared_call(
                (ps.blocks(log_n), self.params.width, 1),
                (THREADS, 1, 1),
                buf,
                tw,
                np.uint32(log_n),
                np.uint32(ps.lo),
                np.uint32(ps.t),
                np.uint32(ps.r_width),
                np.uint32(int(dif)),
            )

    def extend(self, seed: int) -> None:
        """Trace, inverse NTT, coset scatter and forward NTT, leaving the extension in ext_buf."""
        p = self.params
        count = p.width * p.n
        self._k["gen_trace"].prepared_call(
            self._grid(count), (THREADS, 1, 1), self.trace_buf, np.uint64(seed & (2**64 - 1)), np.uint64(count)
        )
        self.ntt(self.trace_buf, self.tw_inv_n, p.log_n, dif=True)
        total = p.width * p.m
        self._k["coset_scatter"].prepared_call(
            self._grid(total),
            (THREADS, 1, 1),
            self.trace_buf,
            self.scale,
            self.ext_buf,
            np.uint32(p.log_n),
            np.uint32(p.log_blowup),
            np.uint64(total),
        )
        self.ntt(self.ext_buf, self.tw_m, p.log_m, dif=False)

    def commit(self) -> bytes:
        """The Merkle root over ext_buf's rows, hashed on the device; 32 bytes come back."""
        p = self.params
        self._k["merkle_leaves"].prepared_call(
            self._grid(p.m), (THREADS, 1, 1), self.ext_buf, self.dig_a, np.uint32(p.width), np.uint64(p.m)
        )
        src, dst, count = self.dig_a, self.dig_b, p.m // 2
        while count >= 1:
            self._k["merkle_level"].prepared_call(self._grid(count), (THREADS, 1, 1), src, dst, np.uint64(count))
            src, dst, count = dst, src, count // 2
        words = np.empty(8, dtype=np.uint32)
        self._drv.memcpy_dtoh(words, src)
        return words.astype(">u4").tobytes()

    def prove(self, seed: int) -> bytes:
        """The proof's root for ``seed``; a kernel or memory error becomes a DeviceError."""
        try:
            self.extend(seed)
            root = self.commit()
            self._ctx.synchronize()
            return root
        except Exception as exc:
            raise DeviceError(self._classify(exc, "kernel"), str(exc), self._facts) from exc

    def forward_ntt(self) -> None:
        """The proof's forward NTT of the extension, in place on ext_buf (what the benchmark times)."""
        self.ntt(self.ext_buf, self.tw_m, self.params.log_m, dif=False)

    def timed_ms(self, fn: Callable[[], object], repeats: int) -> float:
        """Median milliseconds of ``fn`` between two CUDA events on the default stream."""
        out = []
        for _ in range(max(1, repeats)):
            start, stop = self._drv.Event(), self._drv.Event()
            start.record()
            fn()
            stop.record()
            stop.synchronize()
            out.append(start.time_till(stop))
        return statistics.median(out)

    def peak_bandwidth_gbs(self) -> float:
        """Theoretical DRAM bandwidth from the driver: memory clock (kHz) x 2 (DDR) x bus width (0.0 if unknown)."""
        drv = self._drv
        try:
            dev = drv.Context.get_device()
            clock_khz = dev.get_attribute(drv.device_attribute.MEMORY_CLOCK_RATE)
            bus_bits = dev.get_attribute(drv.device_attribute.GLOBAL_MEMORY_BUS_WIDTH)
        except Exception as exc:  # an attribute this driver no longer reports
            log.warning("memory clock or bus width unknown: %s", exc)
            return 0.0
        return clock_khz * 1e3 * 2 * bus_bits / 8 / 1e9

    def copy_bandwidth_gbs(self, repeats: int = 5) -> float:
        """Measured device-to-device copy of the extension buffer into the digest buffers, bytes read + written."""
        nbytes = min(8 * self.params.width * self.params.m, 32 * self.params.m)
        ms = self.timed_ms(lambda: self._drv.memcpy_dtod(self.dig_a, self.ext_buf, nbytes), repeats)
        return 2 * nbytes / (ms * 1e6) if ms > 0 else 0.0

    def extension(self) -> np.ndarray:
        """ext_buf copied to the host as (W, m) (for checks against the CPU backend)."""
        out = np.empty((self.params.width, self.params.m), dtype=np.uint64)
        self._drv.memcpy_dtoh(out, self.ext_buf)
        return out

    def close(self) -> None:
        """Free every buffer and pop the context; safe to call twice."""
        for buf in self._bufs:
            try:
                buf.free()
            except Exception as exc:
                log.debug("free failed: %s", exc)
        self._bufs.clear()
        if self._ctx is not None:
            try:
                self._ctx.pop()
                self._ctx.detach()
            except Exception as exc:
                log.debug("context release failed: %s", exc)
            self._ctx = None

    def __enter__(self) -> CudaProver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
