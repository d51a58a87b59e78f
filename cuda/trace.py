"""The proof's input: a W x 2^k trace of field elements derived from a seed (SplitMix64)."""

from __future__ import annotations

import numpy as np
from flightrec.cuda.field import U64, P

GOLDEN = 0x9E37_79B9_7F4A_7C15
MIX1 = 0xBF58_476D_1CE4_E5B9
MIX2 = 0x94D0_49BB_1331_11EB
MASK64 = (1 << 64) - 1


def splitmix64_int(seed: int, index: int) -> int:
    """The reference definition on Python integers: element ``index`` of the stream for ``seed``."""
    z = (seed + (index + 1) * GOLDEN) & MASK64
    z = ((z ^ (z >> 30)) * MIX1) & MASK64
    z = ((z ^ (z >> 27)) * MIX2) & MASK64
    z ^= z >> 31
    return z - P if z >= P else z


def trace(seed: int, width: int, log_n: int) -> U64:
    """The (width, 2^log_n) trace: element (c, r) is splitmix64_int(seed, c * 2^log_n + r).

    Guarantee: the same seed and shape always give the same trace, on every backend
    (the CUDA kernel ``gen_trace`` computes the same function on the device).
    """
    n = 1 << log_n
    idx = np.arange(width * n, dtype=np.uint64)
    z = np.uint64(seed & MASK64) + (idx + np.uint64(1)) * np.uint64(GOLDEN)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(MIX1)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(MIX2)
    z ^= z >> np.uint64(31)
    z = np.where(z >= np.uint64(P), z - np.uint64(P), z)
    return z.reshape(width, n)
