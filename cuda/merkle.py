"""SHA-256 Merkle trees over the rows of a column-major field matrix (vectorized per level)."""

from __future__ import annotations

import numpy as np
from flightrec.cuda.field import U64
from flightrec.cuda.sha256 import U8, sha256_many


def leaf_bytes(columns: U64) -> U8:
    """Row i of a (W, M) matrix as 8*W bytes: its W field elements as little-endian 64-bit words."""
    rows = np.ascontiguousarray(np.asarray(columns, dtype=np.uint64).T).astype("<u8", copy=False)
    return rows.view(np.uint8).reshape(rows.shape[0], -1)


def merkle_levels_root(leaf_digests: U8) -> bytes:
    """The root over (M, 32) leaf digests, M a power of two: node = sha256(left || right)."""
    nodes = np.ascontiguousarray(leaf_digests, dtype=np.uint8)
    m = nodes.shape[0]
    if m < 1 or m & (m - 1):
        raise ValueError(f"a Merkle tree here has a power-of-two number of leaves; got {m}")
    while nodes.shape[0] > 1:
        nodes = sha256_many(nodes.reshape(nodes.shape[0] // 2, 64))
    return nodes[0].tobytes()


def merkle_root(columns: U64) -> bytes:
    """The 32-byte root of the tree whose leaves are sha256(leaf_bytes(row)) for each row."""
    return merkle_levels_root(sha256_many(leaf_bytes(columns)))
