"""Goldilocks field arithmetic (p = 2^64 - 2^32 + 1) on NumPy uint64 arrays, vectorized."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

P: int = 0xFFFF_FFFF_0000_0001
"""The Goldilocks prime 2^64 - 2^32 + 1."""
GENERATOR: int = 7
"""A generator of the multiplicative group; also the coset shift of the low-degree extension."""
TWO_ADICITY: int = 32
"""2^32 divides p - 1: NTTs of every size up to 2^32 exist."""

U64 = npt.NDArray[np.uint64]

_P = np.uint64(P)
_EPS = np.uint64(0xFFFF_FFFF)  # 2^64 mod p = 2^32 - 1
_S32 = np.uint64(32)
_LO32 = np.uint64(0xFFFF_FFFF)
_ONE = np.uint64(1)


def asfield(values: npt.ArrayLike) -> U64:
    """Values as a uint64 array; every value must already be canonical (0 <= v < p)."""
    arr = np.asarray(values, dtype=np.uint64)
    if arr.size and bool((arr >= _P).any()):
        raise ValueError("field elements must be < p = 2^64 - 2^32 + 1")
    return arr


def add(a: U64, b: U64) -> U64:
    """(a + b) mod p for canonical inputs; the result is canonical."""
    s = a + b  # wraps mod 2^64
    carry = s < a
    # With a carry, s + 2^64 = a + b and 2^64 = 2^32 - 1 (mod p); s + EPS cannot overflow.
    fixed = np.where(carry, s + _EPS, s)
    return np.where(fixed >= _P, fixed - _P, fixed)


def sub(a: U64, b: U64) -> U64:
    """(a - b) mod p for canonical inputs; the result is canonical."""
    d = a - b
    # With a borrow, d = a - b + 2^64 = a - b + EPS (mod p): take EPS back off.
    return np.where(a < b, d - _EPS, d)


def neg(a: U64) -> U64:
    """(-a) mod p for canonical input."""
    return sub(np.zeros_like(a), a)


def mul_wide(a: U64, b: U64) -> tuple[U64, U64]:
    """The 128-bit product a*b as (hi, lo) 64-bit halves, from four 32x32-bit products."""
    a0, a1 = a & _LO32, a >> _S32
    b0, b1 = b & _LO32, b >> _S32
    ll = a0 * b0
    lh = a0 * b1
    hl = a1 * b0
    hh = a1 * b1
    mid = lh + hl
    mid_carry = (mid < lh).astype(np.uint64)  # a carry here is worth 2^96 = 2^32 in hi
    lo = ll + (mid << _S32)
    lo_carry = (lo < ll).astype(np.uint64)
    hi = hh + (mid >> _S32) + (mid_carry << _S32) + lo_carry
    return hi, lo


def reduce128(hi: U64, lo: U64) -> U64:
    """(hi * 2^64 + lo) mod p, canonical, using 2^64 = 2^32 - 1 and 2^96 = -1 (mod p)."""
    hi_hi = hi >> _S32
    hi_lo = hi & _LO32
    t0 = lo - hi_hi
    t0 = np.where(lo < hi_hi, t0 - _EPS, t0)
    t1 = (hi_lo << _S32) - hi_lo  # hi_lo * (2^32 - 1) < 2^64
    s = t0 + t1
    s = np.where(s < t1, s + _EPS, s)
    return np.where(s >= _P, s - _P, s)


def mul(a: U64, b: U64) -> U64:
    """(a * b) mod p for canonical inputs; no 128-bit type needed."""
    hi, lo = mul_wide(a, b)
    return reduce128(hi, lo)


def pow_int(x: int, e: int) -> int:
    """x^e mod p on Python integers (for scalars such as roots of unity)."""
    return pow(x % P, e, P)


def inv_int(x: int) -> int:
    """The inverse of a nonzero scalar x mod p."""
    if x % P == 0:
        raise ZeroDivisionError("0 has no inverse in the Goldilocks field")
    return pow(x % P, P - 2, P)


def root_of_unity(log_n: int) -> int:
    """A primitive 2^log_n-th root of unity: GENERATOR^((p-1) / 2^log_n)."""
    if not 0 <= log_n <= TWO_ADICITY:
        raise ValueError(f"NTT sizes go up to 2^{TWO_ADICITY}; got 2^{log_n}")
    return pow_int(GENERATOR, (P - 1) >> log_n)


def powers(base: int, count: int, start: int = 1) -> U64:
    """[start, start*base, start*base^2, ...] (count values), built by doubling, not element loops."""
    out = np.empty(count, dtype=np.uint64)
    if count == 0:
        return out
    out[0] = start % P
    filled, step = 1, base % P  # step = base^filled
    while filled < count:
        take = min(filled, count - filled)
        out[filled : filled + take] = mul(out[:take], np.full(take, step, dtype=np.uint64))
        filled += take
        step = step * step % P
    return out
