"""The NumPy NTTs against a naive O(n^2) DFT on Python integers, and their round trips."""

from __future__ import annotations

import random

import numpy as np
import pytest
from flightrec.cuda import field, ntt
from flightrec.cuda.field import P


def naive_dft_at(x: list[int], w: int, i: int) -> int:
    """sum_j x_j w^(ij) with Python integers: the independent reference."""
    wi = pow(w, i, P)
    acc, wp = 0, 1
    for xj in x:
        acc = (acc + xj * wp) % P
        wp = wp * wi % P
    return acc


def random_elements(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(P) for _ in range(n)]


@pytest.mark.parametrize("log_n", range(1, 13))
def test_forward_ntt_matches_naive_dft(log_n: int) -> None:
    rng = random.Random(1000 + log_n)
    n = 1 << log_n
    x = random_elements(rng, n)
    y = ntt.ntt(np.array(x, dtype=np.uint64))
    w = field.root_of_unity(log_n)
    # Every output up to 2^9; above, 64 random outputs (the full O(n^2) in Python takes minutes).
    rows = range(n) if n <= 512 else rng.sample(range(n), 64)
    for i in rows:
        assert int(y[i]) == naive_dft_at(x, w, i), f"n={n}, output {i}"


@pytest.mark.parametrize("log_n", [1, 3, 8, 12])
def test_dif_gives_bit_reversed_dft_and_dit_takes_bit_reversed(log_n: int) -> None:
    rng = np.random.default_rng(log_n)
    x = rng.integers(0, P, size=(3, 1 << log_n), dtype=np.uint64)
    rev = ntt.bit_reverse_indices(log_n)
    natural = ntt.ntt(x)
    assert np.array_equal(ntt.dif(x, ntt.twiddles(log_n))[:, rev], natural)
    assert np.array_equal(ntt.dit(x[:, rev], ntt.twiddles(log_n)), natural)


@pytest.mark.parametrize("log_n", [1, 2, 7, 12, 14])
def test_inverse_of_forward_is_identity(log_n: int) -> None:
    rng = np.random.default_rng(7 * log_n)
    x = rng.integers(0, P, size=(2, 1 << log_n), dtype=np.uint64)
    assert np.array_equal(ntt.intt(ntt.ntt(x)), x)
    assert np.array_equal(ntt.ntt(ntt.intt(x)), x)


def test_inverse_matches_naive_inverse_dft() -> None:
    rng = random.Random(5)
    x = random_elements(rng, 32)
    got = ntt.intt(np.array(x, dtype=np.uint64))
    w_inv = field.inv_int(field.root_of_unity(5))
    n_inv = field.inv_int(32)
    assert [int(v) for v in got] == [naive_dft_at(x, w_inv, i) * n_inv % P for i in range(32)]


def test_bit_reverse_and_size_checks() -> None:
    assert list(ntt.bit_reverse_indices(3)) == [0, 4, 2, 6, 1, 5, 3, 7]
    with pytest.raises(ValueError):
        ntt.ntt(np.zeros(6, dtype=np.uint64))
