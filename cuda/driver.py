"""A ctypes binding to the CUDA driver (libcuda) with the subset of pycuda.driver's API that gpu.py uses.

Where pycuda is not installed (it builds from source against the CUDA headers),
the backend still runs on any machine with an NVIDIA driver: libcuda.so.1 comes
with the driver, the kernels are compiled to a cubin by NVRTC (or nvcc), and this
module loads and launches them. It uses only C entry points that have kept their
ABI since CUDA 11 (the primary context, ``_v2`` memory calls, cuLaunchKernel), so
the same code serves drivers of CUDA 11, 12 and 13; cuda-python's Python API, by
contrast, changed between its 12 and 13 releases.

Names mirror pycuda.driver (``init``, ``Device``, ``Context``, ``mem_alloc``,
``memcpy_htod``, ``module_from_buffer``, ``Function.prepare``/``prepared_call``,
``Event``...), so gpu.py runs on either unchanged. Every failing call raises
DriverError whose text holds the CUDA error name (e.g. CUDA_ERROR_OUT_OF_MEMORY).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import logging
from collections.abc import Callable
from typing import Any

import numpy as np

from flightrec.errors import ProveError

log = logging.getLogger(__name__)

LIBRARY_NAMES = (
    "libcuda.so.1",
    "libcuda.so",
    "/usr/local/nvidia/lib64/libcuda.so.1",
    "/usr/lib/x86_64-linux-gnu/libcuda.so.1",
    "/usr/lib64/libcuda.so.1",
)
"""Where libcuda is looked for: the loader's path first, then where container runtimes mount the driver."""
_lib: ctypes.CDLL | None = None
_size = ctypes.c_size_t


class DriverError(ProveError):
    """A CUDA driver call failed, or libcuda could not be loaded; the text names the CUDA error."""


class device_attribute:  # noqa: N801 - the name pycuda.driver uses
    """The CUdevice_attribute values this project reads (cuda.h)."""

    MULTIPROCESSOR_COUNT = 16
    MEMORY_CLOCK_RATE = 36
    GLOBAL_MEMORY_BUS_WIDTH = 37
    L2_CACHE_SIZE = 38
    COMPUTE_CAPABILITY_MAJOR = 75
    COMPUTE_CAPABILITY_MINOR = 76


def load() -> ctypes.CDLL:
    """libcuda from the driver (cached); DriverError when no NVIDIA driver is installed."""
    global _lib
    if _lib is not None:
        return _lib
    errors = []
    for name in (*LIBRARY_NAMES, ctypes.util.find_library("cuda")):
        if not name:
            continue
        try:
            _lib = ctypes.CDLL(name)
            return _lib
        except OSError as exc:
            errors.append(str(exc))
    raise DriverError(
        f"libcuda could not be loaded ({'; '.join(errors)}): install the NVIDIA driver, or run where one is"
    )


def _fn(*names: str) -> Callable[..., int]:
    """The first of ``names`` that libcuda exports (newest ABI first)."""
    lib = load()
    for name in names:
        try:
            return getattr(lib, name)
        except AttributeError:
            continue
    raise DriverError(f"libcuda exports none of {', '.join(names)}: the driver is too old for this program")


def _error_text(code: int) -> str:
    lib = load()
    name, text = ctypes.c_char_p(), ctypes.c_char_p()
    lib.cuGetErrorName(code, ctypes.byref(name))
    lib.cuGetErrorString(code, ctypes.byref(text))
    return f"{(name.value or b'CUDA_ERROR_' + str(code).encode()).decode()}: {(text.value or b'').decode()}"


def _check(code: int, what: str) -> None:
    if code != 0:
        raise DriverError(f"{what} failed: {_error_text(code)}")


def _call(what: str, *args: Any, names: tuple[str, ...] = ()) -> None:
    _check(_fn(*(names or (what,)))(*args), what)


def init() -> None:
    """cuInit(0)."""
    _call("cuInit", ctypes.c_uint(0))


def get_driver_version() -> int:
    """The driver's CUDA version as 1000 * major + 10 * minor (e.g. 13000)."""
    v = ctypes.c_int()
    _call("cuDriverGetVersion", ctypes.byref(v))
    return v.value


class Device:
    """A CUDA device by ordinal."""

    def __init__(self, ordinal: int) -> None:
        handle = ctypes.c_int()
        _call("cuDeviceGet", ctypes.byref(handle), ctypes.c_int(ordinal))
        self.handle = handle.value

    @staticmethod
    def count() -> int:
        n = ctypes.c_int()
        _call("cuDeviceGetCount", ctypes.byref(n))
        return n.value

    def name(self) -> str:
        buf = ctypes.create_string_buffer(256)
        _call("cuDeviceGetName", buf, ctypes.c_int(256), ctypes.c_int(self.handle))
        return buf.value.decode(errors="replace")

    def get_attribute(self, attribute: int) -> int:
        v = ctypes.c_int()
        _call("cuDeviceGetAttribute", ctypes.byref(v), ctypes.c_int(attribute), ctypes.c_int(self.handle))
        return v.value

    def compute_capability(self) -> tuple[int, int]:
        return (
            self.get_attribute(device_attribute.COMPUTE_CAPABILITY_MAJOR),
            self.get_attribute(device_attribute.COMPUTE_CAPABILITY_MINOR),
        )

    def total_memory(self) -> int:
        v = _size()
        _call(
            "cuDeviceTotalMem",
            ctypes.byref(v),
            ctypes.c_int(self.handle),
            names=("cuDeviceTotalMem_v2", "cuDeviceTotalMem"),
        )
        return v.value

    def make_context(self) -> Context:
        """The device's primary context, retained and made current (pop() then detach() release it)."""
        ctx = ctypes.c_void_p()
        _call("cuDevicePrimaryCtxRetain", ctypes.byref(ctx), ctypes.c_int(self.handle))
        _call("cuCtxPushCurrent", ctx, names=("cuCtxPushCurrent_v2", "cuCtxPushCurrent"))
        return Context(ctx, self.handle)


class Context:
    """A retained primary context, current on this thread until pop()."""

    def __init__(self, handle: ctypes.c_void_p, device: int) -> None:
        self.handle = handle
        self.device = device

    @staticmethod
    def get_device() -> Device:
        dev = ctypes.c_int()
        _call("cuCtxGetDevice", ctypes.byref(dev))
        out = Device.__new__(Device)
        out.handle = dev.value
        return out

    @staticmethod
    def synchronize() -> None:
        _call("cuCtxSynchronize")

    def pop(self) -> None:
        popped = ctypes.c_void_p()
        _call("cuCtxPopCurrent", ctypes.byref(popped), names=("cuCtxPopCurrent_v2", "cuCtxPopCurrent"))

    def detach(self) -> None:
        _call(
            "cuDevicePrimaryCtxRelease",
            ctypes.c_int(self.device),
            names=("cuDevicePrimaryCtxRelease_v2", "cuDevicePrimaryCtxRelease"),
        )


class DeviceAllocation:
    """Device memory from cuMemAlloc; ``int(a)`` is its address; free() is safe to call twice."""

    def __init__(self, ptr: int, nbytes: int) -> None:
        self.ptr = ptr
        self.nbytes = nbytes

    def __int__(self) -> int:
        return self.ptr

    def free(self) -> None:
        if self.ptr:
            _call("cuMemFree", ctypes.c_uint64(self.ptr), names=("cuMemFree_v2", "cuMemFree"))
            self.ptr = 0


def mem_alloc(nbytes: int) -> DeviceAllocation:
    ptr = ctypes.c_uint64()
    _call("cuMemAlloc", ctypes.byref(ptr), _size(nbytes), names=("cuMemAlloc_v2", "cuMemAlloc"))
    return DeviceAllocation(ptr.value, nbytes)


def mem_get_info() -> tuple[int, int]:
    """(free, total) bytes of the current context's device."""
    free, total = _size(), _size()
    _call("cuMemGetInfo", ctypes.byref(free), ctypes.byref(total), names=("cuMemGetInfo_v2", "cuMemGetInfo"))
    return free.value, total.value


def _host(arr: np.ndarray) -> np.ndarray:
    if not arr.flags.c_contiguous:
        raise DriverError("host arrays must be C-contiguous for a copy to or from the device")
    return arr


def memcpy_htod(dest: DeviceAllocation, src: np.ndarray) -> None:
    src = _host(src)
    _call(
        "cuMemcpyHtoD",
        ctypes.c_uint64(int(dest)),
        ctypes.c_void_p(src.ctypes.data),
        _size(src.nbytes),
        names=("cuMemcpyHtoD_v2", "cuMemcpyHtoD"),
    )


def memcpy_dtoh(dest: np.ndarray, src: DeviceAllocation) -> None:
    dest = _host(dest)
    _call(
        "cuMemcpyDtoH",
        ctypes.c_void_p(dest.ctypes.data),
        ctypes.c_uint64(int(src)),
        _size(dest.nbytes),
        names=("cuMemcpyDtoH_v2", "cuMemcpyDtoH"),
    )


def memcpy_dtod(dest: DeviceAllocation, src: DeviceAllocation, nbytes: int) -> None:
    _call(
        "cuMemcpyDtoD",
        ctypes.c_uint64(int(dest)),
        ctypes.c_uint64(int(src)),
        _size(nbytes),
        names=("cuMemcpyDtoD_v2", "cuMemcpyDtoD"),
    )


_ARG_TYPES = {
    "P": ctypes.c_uint64,
    "Q": ctypes.c_uint64,
    "q": ctypes.c_int64,
    "I": ctypes.c_uint32,
    "i": ctypes.c_int32,
    "f": ctypes.c_float,
    "d": ctypes.c_double,
}


def _dim3(v: tuple[int, ...]) -> tuple[int, int, int]:
    x = tuple(int(a) for a in v) + (1, 1, 1)
    return x[0], x[1], x[2]


class Function:
    """A kernel of a loaded module; prepare(fmt) then prepared_call(grid, block, *args) as in pycuda."""

    def __init__(self, handle: ctypes.c_void_p, name: str) -> None:
        self.handle = handle
        self.name = name
        self._types: list[Any] | None = None

    def prepare(self, arg_types: str) -> Function:
        unknown = set(arg_types) - set(_ARG_TYPES)
        if unknown:
            raise DriverError(f"argument codes {sorted(unknown)} are not supported; use {''.join(_ARG_TYPES)}")
        self._types = [_ARG_TYPES[c] for c in arg_types]
        return self

    def prepared_call(self, grid: tuple[int, ...], block: tuple[int, ...], *args: Any) -> None:
        if self._types is None or len(args) != len(self._types):
            raise DriverError(f"{self.name}: prepare() the kernel with one code per argument first")
        values = [
            t(int(a) if t not in (ctypes.c_float, ctypes.c_double) else float(a))
            for t, a in zip(self._types, args, strict=True)
        ]
        params = (ctypes.c_void_p * len(values))(*(ctypes.cast(ctypes.byref(v), ctypes.c_void_p) for v in values))
        g, b = _dim3(grid), _dim3(block)
        _call(
            "cuLaunchKernel",
            self.handle,
            *(ctypes.c_uint(x) for x in g),
            *(ctypes.c_uint(x) for x in b),
            ctypes.c_uint(0),
            ctypes.c_void_p(0),
            params,
            ctypes.c_void_p(0),
        )


class Module:
    """A module loaded from a cubin (or PTX)."""

    def __init__(self, handle: ctypes.c_void_p) -> None:
        self.handle = handle

    def get_function(self, name: str) -> Function:
        fn = ctypes.c_void_p()
        _call("cuModuleGetFunction", ctypes.byref(fn), self.handle, name.encode())
        return Function(fn, name)


def module_from_buffer(image: bytes) -> Module:
    mod = ctypes.c_void_p()
    buf = ctypes.create_string_buffer(image, len(image) + 1)  # PTX must end in NUL; a cubin ignores it
    _call("cuModuleLoadData", ctypes.byref(mod), buf)
    return Module(mod)


class Event:
    """A CUDA event on the default stream: record(), synchronize(), time_till(later) in milliseconds."""

    def __init__(self) -> None:
        ev = ctypes.c_void_p()
        _call("cuEventCreate", ctypes.byref(ev), ctypes.c_uint(0))
        self.handle = ev

    def record(self) -> Event:
        _call("cuEventRecord", self.handle, ctypes.c_void_p(0))
        return self

    def synchronize(self) -> Event:
        _call("cuEventSynchronize", self.handle)
        return self

    def time_till(self, end: Event) -> float:
        ms = ctypes.c_float()
        _call(
            "cuEventElapsedTime",
            ctypes.byref(ms),
            self.handle,
            end.handle,
            names=("cuEventElapsedTime_v2", "cuEventElapsedTime"),
        )
        return float(ms.value)

    def __del__(self) -> None:
        if _lib is not None and getattr(self, "handle", None) is not None:
            with contextlib.suppress(Exception):  # interpreter shutdown, or a context already gone
                _lib.cuEventDestroy_v2(self.handle)
