"""Turning the .cu sources into a loadable module: PyCUDA's SourceModule (nvcc), or a cubin from NVRTC or nvcc.

NVRTC (PyPI: nvidia-cuda-nvrtc-cu12) compiles without a GPU or a driver, so the
tests compile the kernels for sm_80 and sm_90 on machines that have neither.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import hashlib
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from flightrec.errors import ProveError

log = logging.getLogger(__name__)

SOURCE = "prove.cu"
HEADERS = ("goldilocks.cuh", "sha256.cuh")
KERNELS = ("gen_trace", "ntt_pass", "coset_scatter", "merkle_leaves", "merkle_level")


class CompileError(ProveError):
    """The kernels could not be compiled; ``log`` holds the compiler's own output."""

    def __init__(self, message: str, log_text: str = "") -> None:
        super().__init__(message if not log_text else f"{message}\n{log_text}")
        self.log = log_text


def source_dir() -> Path:
    """The folder holding the .cu/.cuh files (package data of flightrec.cuda)."""
    return Path(str(resources.files("flightrec.cuda")))


def kernel_source() -> str:
    """The text of cuda/prove.cu."""
    return (source_dir() / SOURCE).read_text()


def nvcc_path() -> str | None:
    """nvcc on PATH, if any (PyCUDA's SourceModule needs it)."""
    return shutil.which("nvcc")


def cuda_homes() -> list[Path]:
    """Folders that may hold a CUDA toolkit: $CUDA_HOME, $CUDA_PATH, nvcc's parent, /usr/local/cuda*."""
    found: list[Path] = []
    for var in ("CUDA_HOME", "CUDA_PATH", "CUDA_ROOT"):
        if os.environ.get(var):
            found.append(Path(os.environ[var]))
    nvcc = nvcc_path()
    if nvcc:
        found.append(Path(nvcc).resolve().parent.parent)
    found += sorted(Path("/usr/local").glob("cuda*"))
    out: list[Path] = []
    for p in found:
        if p.is_dir() and p not in out:
            out.append(p)
    return out


def _nvrtc_candidates() -> list[str]:
    """libnvrtc paths, most specific first: the pip wheels (CUDA 12 and 13 layouts), the toolkits, the loader."""
    found: list[str] = []
    for base in map(Path, sys.path):
        for lib_dir in (base / "nvidia" / "cuda_nvrtc" / "lib", *sorted((base / "nvidia").glob("cu1*/lib"))):
            found += sorted(
                str(p) for p in lib_dir.glob("libnvrtc.so*") if "alt" not in p.name and "builtins" not in p.name
            )
    for home in cuda_homes():
        for lib_dir in (home / "lib64", home / "lib", home / "targets" / "x86_64-linux" / "lib"):
            found += sorted(
                str(p) for p in lib_dir.glob("libnvrtc.so*") if "alt" not in p.name and "builtins" not in p.name
            )
    name = ctypes.util.find_library("nvrtc")
    if name:
        found.append(name)
    return list(dict.fromkeys(found))


@dataclass(frozen=True)
class Nvrtc:
    """A loaded libnvrtc; ``version`` as (major, minor)."""

    lib: ctypes.CDLL
    path: str
    version: tuple[int, int]

    def _check(self, result: int, what: str) -> None:
        if result != 0:
            self.lib.nvrtcGetErrorString.restype = ctypes.c_char_p
            text = self.lib.nvrtcGetErrorString(result).decode()
            raise CompileError(f"NVRTC {what} failed: {text}")

    def compile_cubin(self, source: str, arch: str, include_dir: Path, name: str = SOURCE) -> tuple[bytes, str]:
        """Compile CUDA C++ to a cubin for ``arch`` (e.g. "sm_90"): (cubin, the compiler's log with
        ptxas' register and spill report). CompileError with the log on failure."""
        prog = ctypes.c_void_p()
        self._check(
            self.lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), name.encode(), 0, None, None),
            "create",
        )
        try:
            opts = [f"--gpu-architecture={arch}", f"-I{include_dir}", "-default-device", "--ptxas-options=-v"]
            arr = (ctypes.c_char_p * len(opts))(*(o.encode() for o in opts))
            result = self.lib.nvrtcCompileProgram(prog, len(opts), arr)
            size = ctypes.c_size_t()
            self.lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
            buf = ctypes.create_string_buffer(size.value)
            self.lib.nvrtcGetProgramLog(prog, buf)
            text = buf.value.decode(errors="replace").strip()
            if result != 0:
                raise CompileError(f"NVRTC could not compile {name} for {arch}", text)
            log.debug("NVRTC %s %s: %s", name, arch, text)
            self._check(self.lib.nvrtcGetCUBINSize(prog, ctypes.byref(size)), "cubin size")
            cubin = ctypes.create_string_buffer(size.value)
            self._check(self.lib.nvrtcGetCUBIN(prog, cubin), "get cubin")
            return cubin.raw, text
        finally:
            self.lib.nvrtcDestroyProgram(ctypes.byref(prog))


def load_nvrtc() -> Nvrtc | None:
    """libnvrtc from the nvidia-cuda-nvrtc wheel or the system, or None where there is none."""
    for path in _nvrtc_candidates():
        try:
            lib = ctypes.CDLL(path)
        except OSError as exc:
            log.debug("cannot load %s: %s", path, exc)
            continue
        major, minor = ctypes.c_int(), ctypes.c_int()
        lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor))
        return Nvrtc(lib, path, (major.value, minor.value))
    return None


def compile_cubin(arch: str) -> tuple[bytes, str]:
    """cuda/prove.cu as a cubin for ``arch``, through NVRTC, with the compiler's log;
    CompileError names what to install."""
    nvrtc = load_nvrtc()
    if nvrtc is None:
        raise CompileError(
            "no NVRTC found: pip install nvidia-cuda-nvrtc-cu12 (or put the CUDA toolkit's lib64 on the loader path)"
        )
    return nvrtc.compile_cubin(kernel_source(), arch, source_dir())


def compile_cubin_nvcc(arch: str, nvcc: str | None = None) -> tuple[bytes, str]:
    """cuda/prove.cu as a cubin for ``arch`` through ``nvcc -cubin`` (with ptxas' report as the log)."""
    nvcc = nvcc or nvcc_path()
    if not nvcc:
        raise CompileError("no nvcc on PATH: install the CUDA toolkit, or pip install nvidia-cuda-nvrtc-cu12")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "prove.cubin"
        cmd = [
            nvcc,
            "-cubin",
            f"-arch={arch}",
            "-std=c++17",
            f"-I{source_dir()}",
            "-Xptxas=-v",
            "-o",
            str(out),
            str(source_dir() / SOURCE),
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        text = (proc.stdout + proc.stderr).strip()
        if proc.returncode != 0:
            raise CompileError(f"nvcc could not compile {SOURCE} for {arch} (exit {proc.returncode})", text)
        return out.read_bytes(), text


def _cache_file(arch: str) -> Path:
    """Where a compiled cubin is kept: $FLIGHTREC_CACHE/cubin/<arch>-<hash of the sources, arch and compiler>."""
    from flightrec.settings import Settings

    nvrtc = load_nvrtc()
    compiler = f"nvrtc {nvrtc.version}" if nvrtc is not None else f"nvcc {nvcc_path()}"
    h = hashlib.sha256(f"{arch}\0{compiler}\0".encode())
    for name in (SOURCE, *HEADERS):
        h.update(name.encode() + b"\0" + (source_dir() / name).read_bytes() + b"\0")
    h.update(Path(__file__).read_bytes())  # the compiler options are written here
    return Path(Settings.from_env().cache).expanduser() / "cubin" / f"{arch}-{h.hexdigest()[:32]}.cubin"


def _read_cached(path: Path) -> tuple[bytes, str] | None:
    try:
        cubin = path.read_bytes()
        text = path.with_suffix(".log").read_text()
    except OSError:
        return None
    return (cubin, text) if cubin.startswith(b"\x7fELF") else None  # a damaged file is compiled again


def _write_cached(path: Path, cubin: bytes, text: str) -> None:
    """Keep the cubin for the next process (atomically; a cache that cannot be written is only not kept)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        for target, data in ((path.with_suffix(".log"), text.encode()), (path, cubin)):
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, target)
    except OSError as exc:
        log.info("compiled kernels not kept in %s: %s", path.parent, exc)


@functools.cache
def compile_cubin_any(arch: str) -> tuple[bytes, str]:
    """The kernels as a cubin for ``arch``: NVRTC where it is found, else (or where NVRTC fails) nvcc;
    compiled once per process, and kept on disk ($FLIGHTREC_CACHE/cubin, keyed by the sources' bytes, the
    arch and the compiler) so the next process loads it instead of compiling (seconds).

    CompileError when neither is there (its message names what to install) or the
    compiler rejects the source (with its log).
    """
    path = _cache_file(arch)
    cached = _read_cached(path)
    if cached is not None:
        return cached
    cubin, text = _compile_any(arch)
    _write_cached(path, cubin, text)
    return cubin, text


def _compile_any(arch: str) -> tuple[bytes, str]:
    nvrtc_error: CompileError | None = None
    if load_nvrtc() is not None:
        try:
            return compile_cubin(arch)
        except CompileError as exc:
            if not nvcc_path():
                raise
            log.warning("NVRTC failed, trying nvcc: %s", exc)
            nvrtc_error = exc
    if nvcc_path():
        try:
            return compile_cubin_nvcc(arch)
        except CompileError as exc:
            if nvrtc_error is None:
                raise
            raise CompileError(f"NVRTC and nvcc both failed for {arch}", f"{nvrtc_error}\n---\n{exc}") from exc
    raise CompileError("neither NVRTC nor nvcc found: pip install nvidia-cuda-nvrtc-cu12, or install the CUDA toolkit")


def cubin_kernel_names(cubin: bytes) -> list[str]:
    """The kernel names an ELF cubin defines (its .text.<name> sections), without a driver."""
    return sorted({p[len(b".text.") :].decode() for p in cubin.split(b"\x00") if p.startswith(b".text.")})
