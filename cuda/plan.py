"""How the CUDA NTT groups radix-2 stages into shared-memory passes, and a NumPy model of a pass.

``plan_passes`` is what cuda/gpu.py launches; ``run_passes`` replays the same index
arithmetic as the ``ntt_pass`` kernel (cuda/prove.cu) on the CPU, so the tests check
the kernel's grouping against ntt.dif / ntt.dit without a GPU.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from flightrec.cuda import field
from flightrec.cuda.field import U64

TILE = 2048
"""Field elements a block holds in shared memory (must equal TILE in prove.cu)."""
R_MAX = 16
"""Consecutive r positions a block loads together: 16 x 8 bytes = one 128-byte line."""


@dataclass(frozen=True)
class Pass:
    """Stages with half-sizes 2^lo .. 2^(lo+t-1), each block holding 2^t x r_width elements."""

    lo: int
    t: int
    r_width: int

    def blocks(self, log_n: int) -> int:
        """Blocks per column (grid.x)."""
        return (1 << (log_n - self.lo - self.t)) * ((1 << self.lo) // self.r_width)


def _fits(lo: int, t: int) -> Pass | None:
    r_width = min(1 << lo, R_MAX)
    return Pass(lo, t, r_width) if (1 << t) * r_width <= TILE else None


def plan_passes(log_n: int, dif: bool) -> list[Pass]:
    """Passes covering every stage of a size-2^log_n NTT, in execution order.

    DIF runs half-sizes from largest to smallest, DIT from smallest to largest;
    each pass takes as many stages as fit in a TILE-element block.
    """
    passes: list[Pass] = []
    if dif:
        top = log_n - 1
        while top >= 0:
            chosen = next(p for t in range(top + 1, 0, -1) if (p := _fits(top - t + 1, t)) is not None)
            passes.append(chosen)
            top = chosen.lo - 1
    else:
        lo = 0
        while lo < log_n:
            chosen = next(p for t in range(log_n - lo, 0, -1) if (p := _fits(lo, t)) is not None)
            passes.append(chosen)
            lo += chosen.t
    return passes


def run_pass(data: U64, tw: U64, log_n: int, p: Pass, dif: bool) -> None:
    """Apply one pass to a (W, n) array in place, block by block as the kernel does (vectorized)."""
    blocks = p.blocks(log_n)
    r_chunks = (1 << p.lo) // p.r_width
    blk = np.arange(blocks, dtype=np.int64)
    base = (blk // r_chunks) << (p.lo + p.t)
    r0 = (blk % r_chunks) * p.r_width
    size = (1 << p.t) * p.r_width
    e = np.arange(size, dtype=np.int64)
    m, rr = e // p.r_width, e % p.r_width
    idx = base[:, None] + r0[:, None] + rr[None, :] + (m[None, :] << p.lo)  # (blocks, size)
    tile = data[:, idx]  # (W, blocks, size)
    b = np.arange(size // 2, dtype=np.int64)
    for k in range(p.t):
        u = p.t - 1 - k if dif else k
        log_h = p.lo + u
        rrb, bm = b % p.r_width, b // p.r_width
        ma = ((bm >> u) << (u + 1)) | (bm & ((1 << u) - 1))
        mb = ma + (1 << u)
        j = r0[:, None] + rrb[None, :] + ((ma & ((1 << u) - 1)) << p.lo)[None, :]
        w = tw[j << (log_n - 1 - log_h)]
        ia, ib = ma * p.r_width + rrb, mb * p.r_width + rrb
        a, x = tile[:, :, ia], tile[:, :, ib]
        wb = np.broadcast_to(w, x.shape)
        if dif:
            tile[:, :, ia], tile[:, :, ib] = field.add(a, x), field.mul(field.sub(a, x), wb)
        else:
            y = field.mul(x, wb)
            tile[:, :, ia], tile[:, :, ib] = field.add(a, y), field.sub(a, y)
    data[:, idx] = tile


def run_passes(data: U64, tw: U64, dif: bool) -> U64:
    """The whole NTT as the GPU runs it: plan_passes, then run_pass for each (returns a copy)."""
    out = np.array(data, dtype=np.uint64, copy=True)
    log_n = out.shape[-1].bit_length() - 1
    for p in plan_passes(log_n, dif):
        run_pass(out, tw, log_n, p, dif)
    return out
