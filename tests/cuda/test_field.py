"""Goldilocks arithmetic on NumPy uint64 against Python integers (hypothesis property tests)."""

from __future__ import annotations

import numpy as np
import pytest
from flightrec.cuda import field
from flightrec.cuda.field import P
from hypothesis import given, settings
from hypothesis import strategies as st

# Values near the edges (0, 1, p-1, 2^32 boundaries) find carry bugs; hypothesis mixes them in.
EDGES = [0, 1, 2, P - 1, P - 2, 2**32 - 1, 2**32, 2**32 + 1, 2**63, P - 2**32, 2**64 - 2**33]
elem = st.one_of(st.sampled_from(EDGES), st.integers(min_value=0, max_value=P - 1))
vectors = st.lists(st.tuples(elem, elem), min_size=1, max_size=64)


def _arrays(pairs: list[tuple[int, int]]) -> tuple[np.ndarray, np.ndarray]:
    a = np.array([x for x, _ in pairs], dtype=np.uint64)
    b = np.array([y for _, y in pairs], dtype=np.uint64)
    return a, b


@settings(max_examples=300, deadline=None)
@given(vectors)
def test_add_sub_mul_match_python_integers(pairs: list[tuple[int, int]]) -> None:
    a, b = _arrays(pairs)
    assert [int(v) for v in field.add(a, b)] == [(x + y) % P for x, y in pairs]
    assert [int(v) for v in field.sub(a, b)] == [(x - y) % P for x, y in pairs]
    assert [int(v) for v in field.mul(a, b)] == [(x * y) % P for x, y in pairs]
    assert [int(v) for v in field.neg(a)] == [(-x) % P for x, _ in pairs]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2**64 - 1), st.integers(0, 2**64 - 1)), min_size=1, max_size=32))
def test_wide_product_and_reduction_on_any_64_bit_words(pairs: list[tuple[int, int]]) -> None:
    a, b = _arrays(pairs)
    hi, lo = field.mul_wide(a, b)
    assert [(int(h) << 64) | int(l) for h, l in zip(hi, lo, strict=True)] == [x * y for x, y in pairs]
    assert [int(v) for v in field.reduce128(hi, lo)] == [(x * y) % P for x, y in pairs]


@settings(max_examples=50, deadline=None)
@given(st.integers(0, P - 1), st.integers(0, 300), st.integers(1, P - 1))
def test_powers_are_successive_products(base: int, count: int, start: int) -> None:
    got = field.powers(base, count, start=start)
    assert [int(v) for v in got] == [start * pow(base, i, P) % P for i in range(count)]


@pytest.mark.parametrize("log_n", [0, 1, 5, 20, 32])
def test_root_of_unity_has_exact_order(log_n: int) -> None:
    w = field.root_of_unity(log_n)
    assert pow(w, 1 << log_n, P) == 1
    if log_n:
        assert pow(w, 1 << (log_n - 1), P) == P - 1  # primitive: half the order gives -1


def test_inverse_and_validation() -> None:
    assert field.inv_int(12345) * 12345 % P == 1
    with pytest.raises(ZeroDivisionError):
        field.inv_int(P)
    with pytest.raises(ValueError):
        field.asfield([P])
    with pytest.raises(ValueError):
        field.root_of_unity(33)
