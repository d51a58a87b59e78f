"""The proof: trace -> inverse NTT -> coset low-degree extension -> forward NTT -> Merkle root.

Everything here is pure NumPy (the CPU backend); cuda/gpu.py computes the same
function on the device, stage for stage, and must return the same root.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from flightrec.cuda import field, ntt
from flightrec.cuda.field import U64
from flightrec.cuda.merkle import merkle_root
from flightrec.cuda.trace import trace


@dataclass(frozen=True)
class ProofParams:
    """The shape of a proof: ``width`` columns of 2^``log_n`` rows, extended 2^``log_blowup`` times."""

    width: int = 8
    log_n: int = 20
    log_blowup: int = 2

    def __post_init__(self) -> None:
        if self.width < 1:
            raise ValueError("a trace has at least one column")
        if self.log_n < 1 or self.log_blowup < 1 or self.log_n + self.log_blowup > field.TWO_ADICITY:
            raise ValueError(
                f"need k >= 1, log2(blowup) >= 1 and k + log2(blowup) <= {field.TWO_ADICITY}; "
                f"got k={self.log_n}, log2(blowup)={self.log_blowup}"
            )

    @property
    def n(self) -> int:
        """Rows of the trace."""
        return 1 << self.log_n

    @property
    def blowup(self) -> int:
        """The extension factor."""
        return 1 << self.log_blowup

    @property
    def log_m(self) -> int:
        """log2 of the extended rows (the Merkle tree's leaves)."""
        return self.log_n + self.log_blowup

    @property
    def m(self) -> int:
        """Rows of the extension: leaves of the Merkle tree."""
        return 1 << self.log_m

    def as_strings(self) -> dict[str, str]:
        """The parameters as an event's ``params`` map."""
        return {"k": str(self.log_n), "width": str(self.width), "blowup": str(self.blowup)}


def coset_scale(log_n: int) -> U64:
    """s[p] = shift^bitrev(p) / n: turns the bit-reversed unnormalised inverse DIF output into
    the coefficients of the coset polynomial c_j * shift^j (shift = the field's generator 7)."""
    n = 1 << log_n
    pw = field.powers(field.GENERATOR, n, start=field.inv_int(n))
    return pw[ntt.bit_reverse_indices(log_n)]


def extend(trace_columns: U64, params: ProofParams) -> U64:
    """The (W, m) low-degree extension: row i holds each column's polynomial at 7 * w_m^i.

    The column polynomials are the ones that take the trace's values on the n-th roots of unity.
    """
    coeffs_bitrev = ntt.dif(trace_columns, ntt.twiddles(params.log_n, inverse=True))
    coeffs_bitrev = field.mul(coeffs_bitrev, np.broadcast_to(coset_scale(params.log_n), coeffs_bitrev.shape))
    ext = np.zeros((trace_columns.shape[0], params.m), dtype=np.uint64)
    # bitrev_m(j) = bitrev_n(j) << log_blowup for j < n: zero-padding in bit-reversed order.
    ext[:, :: params.blowup] = coeffs_bitrev
    return ntt.dit(ext, ntt.twiddles(params.log_m))


def prove(seed: int, params: ProofParams) -> bytes:
    """The proof's 32-byte Merkle root for ``seed``; the same inputs always give the same root."""
    return merkle_root(extend(trace(seed, params.width, params.log_n), params))
