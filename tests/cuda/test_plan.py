"""The CUDA NTT's pass plan and index arithmetic (modelled in NumPy) against ntt.dif / ntt.dit."""

from __future__ import annotations

import numpy as np
import pytest
from flightrec.cuda import ntt, plan
from flightrec.cuda.field import P


@pytest.mark.parametrize("log_n", list(range(1, 23)) + [26])
@pytest.mark.parametrize("dif", [True, False])
def test_plan_covers_every_stage_once_and_fits_a_tile(log_n: int, dif: bool) -> None:
    passes = plan.plan_passes(log_n, dif)
    stages = [p.lo + u for p in passes for u in (range(p.t - 1, -1, -1) if dif else range(p.t))]
    assert stages == (list(range(log_n - 1, -1, -1)) if dif else list(range(log_n)))
    for p in passes:
        assert (1 << p.t) * p.r_width <= plan.TILE
        assert p.blocks(log_n) * (1 << p.t) * p.r_width == 1 << log_n


def test_large_ntts_need_few_passes() -> None:
    # k = 20 and the 2^22 extension: three passes over memory each instead of 20 / 22.
    assert len(plan.plan_passes(20, dif=True)) == 3
    assert len(plan.plan_passes(22, dif=False)) == 3


@pytest.mark.parametrize("log_n", [1, 2, 5, 11, 12, 13, 15])
def test_kernel_model_matches_numpy_stages(log_n: int) -> None:
    rng = np.random.default_rng(log_n)
    x = rng.integers(0, P, size=(2, 1 << log_n), dtype=np.uint64)
    tw = ntt.twiddles(log_n)
    assert np.array_equal(plan.run_passes(x, tw, dif=True), ntt.dif(x, tw))
    assert np.array_equal(plan.run_passes(x, tw, dif=False), ntt.dit(x, tw))
