"""Benchmark of the proving core's CPU backend: proofs/hour at k = 16 and 18, NTT and Merkle vs plain Python.

Run: `make bench` (or `PYTHONSAFEPATH=1 .venv/bin/python benchmarks/bench_prove.py`).
Every figure is a median of repeats, printed next to its baseline measured in the same run.
"""

from __future__ import annotations

import hashlib
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from flightrec.cuda import field, ntt
from flightrec.cuda.backend import CpuProver
from flightrec.cuda.field import P
from flightrec.cuda.merkle import merkle_root
from flightrec.cuda.proof import ProofParams

sys.path.insert(0, str(Path(__file__).resolve().parent))
import record  # noqa: E402 - benchmarks/ on the path first


def median_s(fn: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def python_ntt(x: list[int], w: int) -> list[int]:
    """The plain-Python baseline: iterative radix-2 Cooley-Tukey on Python integers."""
    n = len(x)
    log_n = n.bit_length() - 1
    a = [x[int(f"{i:0{log_n}b}"[::-1], 2)] for i in range(n)]
    h = 1
    while h < n:
        wh = pow(w, n // (2 * h), P)
        for start in range(0, n, 2 * h):
            wj = 1
            for j in range(start, start + h):
                t = a[j + h] * wj % P
                a[j], a[j + h] = (a[j] + t) % P, (a[j] - t) % P
                wj = wj * wh % P
        h *= 2
    return a


def hashlib_merkle(columns: np.ndarray) -> bytes:
    rows = np.ascontiguousarray(columns.T).astype("<u8")
    level = [hashlib.sha256(r.tobytes()).digest() for r in rows]
    while len(level) > 1:
        level = [hashlib.sha256(level[i] + level[i + 1]).digest() for i in range(0, len(level), 2)]
    return level[0]


def main() -> None:
    rng = np.random.default_rng(0)
    print("proving core, CPU backend (NumPy); medians; baselines measured in this run")
    figures: list[record.Figure] = []

    print("\n-- NTT, one column, natural order in and out")
    for log_n in (12, 14):
        x = rng.integers(0, P, size=1 << log_n, dtype=np.uint64)
        ref = python_ntt([int(v) for v in x], field.root_of_unity(log_n))
        assert [int(v) for v in ntt.ntt(x)] == ref, "NumPy NTT disagrees with the Python reference"
        t_np = median_s(lambda x=x: ntt.ntt(x), 7)
        t_py = median_s(lambda x=x, log_n=log_n: python_ntt([int(v) for v in x], field.root_of_unity(log_n)), 3)
        print(
            f"n=2^{log_n}: numpy {t_np * 1e3:8.2f} ms   plain python {t_py * 1e3:8.1f} ms   speed-up x{t_py / t_np:.1f}"
        )
        figures.append(
            record.Figure(
                f"NTT, 1 column, n = 2^{log_n}",
                f"{t_np * 1e3:.2f} ms",
                f"plain-Python radix-2: {t_py * 1e3:.1f} ms",
                f"{t_py / t_np:.1f}x",
            )
        )
    x = rng.integers(0, P, size=(8, 1 << 20), dtype=np.uint64)
    t_big = median_s(lambda: ntt.ntt(x), 3)
    print(
        f"8 columns x 2^20 (the k=20 trace): numpy {t_big:.2f} s "
        f"({8 * 2**20 * 20 / 2 / t_big / 1e6:.1f} M butterflies/s)"
    )
    butterflies = f"{t_big:.2f} s ({8 * 2**20 * 20 / 2 / t_big / 1e6:.1f} M butterflies/s)"
    figures.append(record.Figure("NTT, 8 columns x 2^20 (the k=20 trace)", butterflies))

    print("\n-- Merkle root, 8 columns (64-byte leaves)")
    cols = rng.integers(0, P, size=(8, 1 << 14), dtype=np.uint64)
    assert merkle_root(cols) == hashlib_merkle(cols)
    t_np = median_s(lambda: merkle_root(cols), 5)
    t_hl = median_s(lambda: hashlib_merkle(cols), 5)
    print(
        f"2^14 leaves: numpy sha256 {t_np * 1e3:.1f} ms   hashlib loop {t_hl * 1e3:.1f} ms   ratio x{t_hl / t_np:.2f}"
    )
    figures.append(
        record.Figure(
            "Merkle root, 2^14 leaves of 64 bytes, vectorized SHA-256",
            f"{t_np * 1e3:.1f} ms",
            f"hashlib, one call per node: {t_hl * 1e3:.1f} ms",
            f"{t_hl / t_np:.2f}x",
        )
    )

    print("\n-- whole proof (W=8, blowup 4): 1 warm-up, then measured proofs")
    for k, repeats in ((16, 3), (18, 2)):
        prover = CpuProver(ProofParams(width=8, log_n=k, log_blowup=2))
        prover.prove(0)
        times = [median_s(lambda s=s, prover=prover: prover.prove(s), 1) for s in range(1, repeats + 1)]
        med = statistics.median(times)
        print(
            f"k={k}: median {med:.2f} s/proof  ->  {3600 / med:8.1f} proofs/hour  (runs: "
            + ", ".join(f"{t:.2f}" for t in times)
            + ")"
        )
        figures.append(record.Figure(f"whole proof, W=8, blowup 4, k = {k}", f"{3600 / med:,.0f} proofs/hour"))
    record.write(
        "bench_prove",
        "Proving core",
        "CPU backend (NumPy), medians; GPU: not measured yet (`sh scripts/device_run.sh`, docs/proving.md).",
        figures,
    )


if __name__ == "__main__":
    main()
