"""SHA-256 and Merkle roots against hashlib; the whole proof against a Python-integer reference."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
from flightrec.cuda import field
from flightrec.cuda.field import P
from flightrec.cuda.merkle import leaf_bytes, merkle_root
from flightrec.cuda.proof import ProofParams, extend, prove
from flightrec.cuda.sha256 import sha256_many
from flightrec.cuda.trace import splitmix64_int, trace


@pytest.mark.parametrize("length", [0, 1, 55, 56, 63, 64, 65, 119, 120, 128, 200])
def test_vectorized_sha256_matches_hashlib(length: int) -> None:
    rng = np.random.default_rng(length)
    msgs = rng.integers(0, 256, size=(37, length), dtype=np.uint8)
    got = sha256_many(msgs)
    for row, digest in zip(msgs, got, strict=True):
        assert digest.tobytes() == hashlib.sha256(row.tobytes()).digest()


def hashlib_merkle_root(columns: np.ndarray) -> bytes:
    """The reference: leaves and nodes hashed one by one with hashlib, rows packed with int.to_bytes."""
    width, m = columns.shape
    level = [
        hashlib.sha256(b"".join(int(columns[c, r]).to_bytes(8, "little") for c in range(width))).digest()
        for r in range(m)
    ]
    while len(level) > 1:
        level = [hashlib.sha256(level[i] + level[i + 1]).digest() for i in range(0, len(level), 2)]
    return level[0]


@pytest.mark.parametrize("width,log_m", [(1, 0), (1, 1), (3, 5), (8, 10)])
def test_merkle_root_matches_hashlib(width: int, log_m: int) -> None:
    rng = np.random.default_rng(width * 100 + log_m)
    cols = rng.integers(0, P, size=(width, 1 << log_m), dtype=np.uint64)
    assert merkle_root(cols) == hashlib_merkle_root(cols)


def test_leaf_bytes_are_little_endian_rows() -> None:
    cols = np.array([[1, 2], [0x0102030405060708, 3]], dtype=np.uint64)
    assert leaf_bytes(cols)[0].tobytes() == (1).to_bytes(8, "little") + (0x0102030405060708).to_bytes(8, "little")
    assert leaf_bytes(cols)[1].tobytes() == (2).to_bytes(8, "little") + (3).to_bytes(8, "little")


def test_trace_matches_scalar_splitmix() -> None:
    t = trace(seed=2**64 - 5, width=3, log_n=4)
    assert t.shape == (3, 16)
    assert [int(v) for v in t.ravel()] == [splitmix64_int(2**64 - 5, i) for i in range(48)]
    assert not np.array_equal(trace(1, 3, 4), trace(2, 3, 4))


def test_extension_evaluates_the_interpolant_on_the_coset() -> None:
    params = ProofParams(width=2, log_n=3, log_blowup=2)
    t = trace(11, params.width, params.log_n)
    ext = extend(t, params)
    w_n, w_m = field.root_of_unity(params.log_n), field.root_of_unity(params.log_m)
    n_inv = field.inv_int(params.n)
    for c in range(params.width):
        vals = [int(v) for v in t[c]]
        # Coefficients by a naive inverse DFT, then the polynomial evaluated at 7 * w_m^i by Horner.
        coeffs = [
            sum(v * pow(w_n, -i * j % (P - 1), P) for i, v in enumerate(vals)) * n_inv % P for j in range(params.n)
        ]
        for i in range(params.m):
            x = field.GENERATOR * pow(w_m, i, P) % P
            acc = 0
            for cj in reversed(coeffs):
                acc = (acc * x + cj) % P
            assert int(ext[c, i]) == acc, f"column {c}, row {i}"
        # On the subgroup itself the interpolant gives back the trace (a sanity check of the reference).
        assert [sum(cj * pow(w_n, i * j, P) for j, cj in enumerate(coeffs)) % P for i in range(params.n)] == vals


def test_proof_is_reproducible_and_seed_dependent() -> None:
    params = ProofParams(width=4, log_n=8, log_blowup=2)
    root = prove(3, params)
    assert len(root) == 32
    assert prove(3, params) == root
    assert prove(4, params) != root
    assert root == hashlib_merkle_root(extend(trace(3, 4, 8), params))


def test_params_validation() -> None:
    with pytest.raises(ValueError):
        ProofParams(log_n=31, log_blowup=2)
    with pytest.raises(ValueError):
        ProofParams(width=0)
    assert ProofParams().as_strings() == {"k": "20", "width": "8", "blowup": "4"}
