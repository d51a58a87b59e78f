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


@pytest.mark.slow
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


@pytest.mark.slow
@needs_nvrtc
def test_a_compiled_cubin_is_kept_on_disk_for_the_next_process(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("FLIGHTREC_CACHE", str(tmp_path))
    calls: list[str] = []
    real = cc._compile_any
    monkeypatch.setattr(cc, "_compile_any", lambda arch: calls.append(arch) or real(arch))
    cc.compile_cubin_any.cache_clear()
    first = cc.compile_cubin_any("sm_90")
    (kept,) = (tmp_path / "cubin").glob("sm_90-*.cubin")
    assert kept.read_bytes() == first[0] and calls == ["sm_90"]
    cc.compile_cubin_any.cache_clear()  # as a new process
    assert cc.compile_cubin_any("sm_90") == first and calls == ["sm_90"], "compiled again despite the kept cubin"
    kept.write_bytes(b"half a file")  # damaged: compiled again and replaced
    cc.compile_cubin_any.cache_clear()
    assert cc.compile_cubin_any("sm_90")[0] == first[0] and calls == ["sm_90", "sm_90"]
    assert kept.read_bytes() == first[0]
    cc.compile_cubin_any.cache_clear()


@pytest.mark.slow
@needs_nvrtc
def test_the_kept_cubin_follows_the_sources_and_an_unwritable_cache_only_costs_time(tmp_path, monkeypatch) -> None:
    import shutil

    monkeypatch.setenv("FLIGHTREC_CACHE", str(tmp_path))
    before = cc._cache_file("sm_90")
    assert cc._cache_file("sm_80") != before
    src = tmp_path / "src"
    shutil.copytree(cc.source_dir(), src, ignore=shutil.ignore_patterns("*.py", "__pycache__"))
    (src / "goldilocks.cuh").write_text((src / "goldilocks.cuh").read_text() + "\n// changed\n")
    monkeypatch.setattr(cc, "source_dir", lambda: src)
    assert cc._cache_file("sm_90") != before, "a changed header must not load the old cubin"
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    monkeypatch.setenv("FLIGHTREC_CACHE", str(blocker))
    cc.compile_cubin_any.cache_clear()
    cubin, _log = cc.compile_cubin_any("sm_80")
    assert cubin[:4] == b"\x7fELF"
    cc.compile_cubin_any.cache_clear()
