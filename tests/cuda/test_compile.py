"""The CUDA kernels compile for sm_80 (A100) and sm_90 (H100/H200) through NVRTC, without a GPU.

Skipped, with the reason, where no NVRTC is installed (`pip install -e '.[test]'` brings
nvidia-cuda-nvrtc-cu12 on Linux x86_64).
"""

from __future__ import annotations

import re

import pytest

from flightrec.cuda import compile as cc
from flightrec.cuda import plan

NVRTC = cc.load_nvrtc()
needs_nvrtc = pytest.mark.skipif(NVRTC is None, reason="no NVRTC here: pip install nvidia-cuda-nvrtc-cu12")


@needs_nvrtc
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_kernels_compile_to_cubin_without_spills(arch: str) -> None:
    cubin, log = cc.compile_cubin(arch)
    assert cubin[:4] == b"\x7fELF"
    assert cc.cubin_kernel_names(cubin) == sorted(cc.KERNELS)
    for kernel in cc.KERNELS:
        assert f"Compiling entry function '{kernel}' for '{arch}'" in log
    spills = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log)
    assert len(spills) == len(cc.KERNELS)
    assert all(s == ("0", "0") for s in spills), log
    smem = re.findall(r"(\d+) bytes smem", log)
    assert smem == [str(8 * plan.TILE)], "the NTT tile in prove.cu must match plan.TILE"


@needs_nvrtc
def test_a_compile_error_carries_the_compiler_log(tmp_path) -> None:
    assert NVRTC is not None
    with pytest.raises(cc.CompileError) as err:
        NVRTC.compile_cubin('extern "C" __global__ void k(int* x) { x[0] = undefined_name; }', "sm_90", tmp_path)
    assert "undefined_name" in str(err.value) and "undefined_name" in err.value.log


def test_sources_ship_with_the_package() -> None:
    src = cc.kernel_source()
    for name in cc.KERNELS:
        assert f'extern "C" __global__ void {name}(' in src
    for header in cc.HEADERS:
        assert (cc.source_dir() / header).is_file()
