"""Radix-2 NTTs over the Goldilocks field on NumPy arrays: each stage is one vectorized butterfly.

Two stage orders, the same ones the CUDA kernels use (cuda/prove.cu):

* ``dif`` (Gentleman-Sande): natural-order input, bit-reversed output;
* ``dit`` (Cooley-Tukey): bit-reversed input, natural-order output.

Arrays have shape (..., n) with n a power of two; every leading axis is a batch
(for example the trace's columns). Inputs must be canonical field elements.
"""

from __future__ import annotations

import numpy as np
from flightrec.cuda import field
from flightrec.cuda.field import U64


def log2_exact(n: int) -> int:
    """log2(n) for a power of two n >= 1; ValueError otherwise."""
    if n < 1 or n & (n - 1):
        raise ValueError(f"NTT sizes are powers of two; got {n}")
    return n.bit_length() - 1


def twiddles(log_n: int, inverse: bool = False) -> U64:
    """tw[e] = w^e for e < n/2, w the primitive n-th root of unity (or its inverse)."""
    w = field.root_of_unity(log_n)
    if inverse:
        w = field.inv_int(w)
    return field.powers(w, max((1 << log_n) // 2, 1))


def bit_reverse_indices(log_n: int) -> np.ndarray:
    """The permutation i -> reverse of i's log_n low bits, as an int64 index array."""
    n = 1 << log_n
    idx = np.arange(n, dtype=np.int64)
    rev = np.zeros(n, dtype=np.int64)
    for bit in range(log_n):
        rev |= ((idx >> bit) & 1) << (log_n - 1 - bit)
    return rev


CHUNK = 1 << 15
"""Butterflies per NumPy call: keeps temporaries in cache and off the page-fault path."""


def _blocks(groups: int, h: int) -> list[tuple[slice, slice]]:
    """(group slice, offset slice) pieces of about CHUNK butterflies covering a (groups, 2, h) view."""
    if h >= CHUNK:
        return [(slice(g, g + 1), slice(o, o + CHUNK)) for g in range(groups) for o in range(0, h, CHUNK)]
    step = max(1, CHUNK // h)
    return [(slice(g, g + step), slice(0, h)) for g in range(0, groups, step)]


def dif(x: U64, tw: U64) -> U64:
    """Unnormalised DFT with the root whose powers are ``tw``: natural order in, bit-reversed out.

    Stage q (q = 0 .. log n - 1) pairs i and i + h, h = n >> (q + 1), and computes
    a' = a + b, b' = (a - b) * tw[(i mod h) << q]. Returns a new array.
    """
    n = x.shape[-1]
    log_n = log2_exact(n)
    out = np.array(x, dtype=np.uint64, order="C", copy=True)  # C order: reshape below must be a view
    for q in range(log_n):
        h = n >> (q + 1)
        v = out.reshape(-1, 2, h)  # every batch row's groups, one after the other
        w = tw[:: 1 << q][:h]
        for gs, os_ in _blocks(v.shape[0], h):
            a, b = v[gs, 0, os_], v[gs, 1, os_]
            s = field.add(a, b)
            d = field.mul(field.sub(a, b), np.broadcast_to(w[os_], b.shape))
            v[gs, 0, os_] = s
            v[gs, 1, os_] = d
    return out


def dit(x: U64, tw: U64) -> U64:
    """Unnormalised DFT with the root whose powers are ``tw``: bit-reversed in, natural order out.

    Stage with half-size h (h = 1, 2, .., n/2) pairs i and i + h, and computes
    t = b * tw[(i mod h) * n / (2h)], a' = a + t, b' = a - t. Returns a new array.
    """
    n = x.shape[-1]
    log_n = log2_exact(n)
    out = np.array(x, dtype=np.uint64, order="C", copy=True)  # C order: reshape below must be a view
    for s in range(log_n):
        h = 1 << s
        v = out.reshape(-1, 2, h)
        w = tw[:: n // (2 * h)][:h]
        for gs, os_ in _blocks(v.shape[0], h):
            a, b = v[gs, 0, os_], v[gs, 1, os_]
            t = field.mul(b, np.broadcast_to(w[os_], b.shape))
            s_, d_ = field.add(a, t), field.sub(a, t)  # both before writing: a is a view into out
            v[gs, 0, os_] = s_
            v[gs, 1, os_] = d_
    return out


def ntt(x: U64) -> U64:
    """Forward NTT, natural order in and out: y_i = sum_j x_j w^(ij), w the primitive n-th root."""
    log_n = log2_exact(x.shape[-1])
    return dit(np.asarray(x, dtype=np.uint64)[..., bit_reverse_indices(log_n)], twiddles(log_n))


def intt(y: U64) -> U64:
    """Inverse NTT, natural order in and out: intt(ntt(x)) == x."""
    n = y.shape[-1]
    log_n = log2_exact(n)
    raw = dit(np.asarray(y, dtype=np.uint64)[..., bit_reverse_indices(log_n)], twiddles(log_n, inverse=True))
    return field.mul(raw, np.full(raw.shape, field.inv_int(n), dtype=np.uint64))
