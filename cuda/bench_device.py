"""GPU check and timing in one run (<= 5 minutes on one H200): roots vs the CPU, NTT and proof times.

Run on the GPU machine: `PYTHONSAFEPATH=1 python -m flightrec.cuda.bench_device` (needs pycuda,
and nvcc or nvidia-cuda-nvrtc-cu12; installs nothing). Prints a table: time, bytes moved,
achieved GB/s against the memory-bandwidth floor, proofs/hour.
"""

from __future__ import annotations

import argparse
import secrets
import statistics
import sys
import time

from flightrec.cuda import plan
from flightrec.cuda.gpu import CudaProver, DeviceError
from flightrec.cuda.proof import ProofParams, extend, prove
from flightrec.cuda.trace import trace


def peak_bandwidth_gbs(drv) -> float:
    """Theoretical DRAM bandwidth from the driver: memory clock (kHz) x bus width x 2 (DDR)."""
    dev = drv.Context.get_device()
    clock_khz = dev.get_attribute(drv.device_attribute.MEMORY_CLOCK_RATE)
    bus_bits = dev.get_attribute(drv.device_attribute.GLOBAL_MEMORY_BUS_WIDTH)
    return clock_khz * 1e3 * 2 * bus_bits / 8 / 1e9


def timed_ms(drv, fn, repeats: int) -> float:
    """Median milliseconds of ``fn`` between CUDA events."""
    out = []
    for _ in range(repeats):
        start, stop = drv.Event(), drv.Event()
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        out.append(start.time_till(stop))
    return statistics.median(out)


def check_roots(seeds: int) -> bool:
    ok = True
    for k in (8, 10, 12):
        params = ProofParams(width=8, log_n=k, log_blowup=2)
        with CudaProver(params) as gpu:
            for _ in range(seeds):
                seed = secrets.randbits(64)
                g, c = gpu.prove(seed), prove(seed, params)
                same = g == c
                if not same and k == 8:
                    ext_same = (gpu.extension() == extend(trace(seed, 8, k), params)).all()
                    print(f"   extension {'matches' if ext_same else 'DIFFERS'} (so the Merkle part {'differs' if ext_same else 'may be fine'})")
                ok &= same
                print(f"k={k:2d} seed={seed:#018x}: gpu {g.hex()[:16]} cpu {c.hex()[:16]} {'OK' if same else 'MISMATCH'}")
    return ok


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--kmin", type=int, default=20)
    ap.add_argument("--kmax", type=int, default=24)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--budget-s", type=float, default=270.0, help="stop timing larger k past this")
    args = ap.parse_args(argv)
    t_start = time.monotonic()
    try:
        ok = check_roots(args.seeds)
    except DeviceError as exc:
        print(f"CUDA cannot serve: {exc}\nattributes: {exc.attributes()}")
        return 2
    print("roots:", "all identical to the CPU backend" if ok else "MISMATCH")
    print(f"\n{'k':>3} {'what':>6} {'ms':>9} {'bytes moved':>12} {'GB/s':>8} {'peak GB/s':>9} "
          f"{'floor ms':>9} {'floor/time':>10} {'proofs/h':>10}")
    for k in range(args.kmin, args.kmax + 1):
        if time.monotonic() - t_start > args.budget_s:
            print(f"(stopped before k={k}: time budget)")
            break
        params = ProofParams(width=8, log_n=k, log_blowup=2)
        try:
            gpu = CudaProver(params)
        except DeviceError as exc:
            print(f"k={k}: {exc}")
            break
        with gpu:
            drv = gpu._drv
            peak = peak_bandwidth_gbs(drv)
            gpu.prove(1)  # warm-up, loads everything
            passes = len(plan.plan_passes(params.log_m, dif=False))
            data = 8 * params.width * params.m
            moved = 2 * data * passes
            ms = timed_ms(drv, lambda: gpu.ntt(gpu.ext_buf, gpu.tw_m, params.log_m, dif=False), 5)
            floor_ms = 2 * data / (peak * 1e9) * 1e3
            print(f"{k:>3} {'ntt':>6} {ms:9.3f} {moved:12.3e} {moved / ms / 1e6:8.1f} {peak:9.0f} "
                  f"{floor_ms:9.3f} {floor_ms / ms:10.1%} {'':>10}")
            proof_ms = timed_ms(drv, lambda: gpu.prove(2), 3)
            print(f"{k:>3} {'proof':>6} {proof_ms:9.3f} {'':>12} {'':>8} {'':>9} {'':>9} {'':>10} "
                  f"{3.6e6 / proof_ms:10.1f}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
