"""SHA-256 of many equal-length messages at once, vectorized over the messages with NumPy."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

U8 = npt.NDArray[np.uint8]

K = np.array(
    [
        0x428A2F98,
        0x71374491,
        0xB5C0FBCF,
        0xE9B5DBA5,
        0x3956C25B,
        0x59F111F1,
        0x923F82A4,
        0xAB1C5ED5,
        0xD807AA98,
        0x12835B01,
        0x243185BE,
        0x550C7DC3,
        0x72BE5D74,
        0x80DEB1FE,
        0x9BDC06A7,
        0xC19BF174,
        0xE49B69C1,
        0xEFBE4786,
        0x0FC19DC6,
        0x240CA1CC,
        0x2DE92C6F,
        0x4A7484AA,
        0x5CB0A9DC,
        0x76F988DA,
        0x983E5152,
        0xA831C66D,
        0xB00327C8,
        0xBF597FC7,
        0xC6E00BF3,
        0xD5A79147,
        0x06CA6351,
        0x14292967,
        0x27B70A85,
        0x2E1B2138,
        0x4D2C6DFC,
        0x53380D13,
        0x650A7354,
        0x766A0ABB,
        0x81C2C92E,
        0x92722C85,
        0xA2BFE8A1,
        0xA81A664B,
        0xC24B8B70,
        0xC76C51A3,
        0xD192E819,
        0xD6990624,
        0xF40E3585,
        0x106AA070,
        0x19A4C116,
        0x1E376C08,
        0x2748774C,
        0x34B0BCB5,
        0x391C0CB3,
        0x4ED8AA4A,
        0x5B9CCA4F,
        0x682E6FF3,
        0x748F82EE,
        0x78A5636F,
        0x84C87814,
        0x8CC70208,
        0x90BEFFFA,
        0xA4506CEB,
        0xBEF9A3F7,
        0xC67178F2,
    ],
    dtype=np.uint32,
)
H0 = np.array(
    [0x6A09E667, 0xBB67AE85, 0x3C6EF372, 0xA54FF53A, 0x510E527F, 0x9B05688C, 0x1F83D9AB, 0x5BE0CD19],
    dtype=np.uint32,
)

CHUNK = 1 << 15
"""Messages hashed per NumPy pass: large enough to amortise the per-op cost, small enough for cache."""


def _rotr(x: np.ndarray, r: int) -> np.ndarray:
    return (x >> np.uint32(r)) | (x << np.uint32(32 - r))


def pad(messages: U8) -> np.ndarray:
    """FIPS 180-4 padding of each row of an (n, L) uint8 array, as (n, blocks * 16) uint32 words."""
    n, length = messages.shape
    total = (length + 9 + 63) // 64 * 64
    buf = np.zeros((n, total), dtype=np.uint8)
    buf[:, :length] = messages
    buf[:, length] = 0x80
    buf[:, total - 8 :] = np.frombuffer((length * 8).to_bytes(8, "big"), dtype=np.uint8)
    return buf.view(">u4").astype(np.uint32)


def _compress(state: list[np.ndarray], block: np.ndarray) -> list[np.ndarray]:
    w = [block[:, i] for i in range(16)]
    for i in range(16, 64):
        s0 = _rotr(w[i - 15], 7) ^ _rotr(w[i - 15], 18) ^ (w[i - 15] >> np.uint32(3))
        s1 = _rotr(w[i - 2], 17) ^ _rotr(w[i - 2], 19) ^ (w[i - 2] >> np.uint32(10))
        w.append(w[i - 16] + s0 + w[i - 7] + s1)
    a, b, c, d, e, f, g, h = state
    for i in range(64):
        s1 = _rotr(e, 6) ^ _rotr(e, 11) ^ _rotr(e, 25)
        ch = (e & f) ^ (~e & g)
        t1 = h + s1 + ch + K[i] + w[i]
        s0 = _rotr(a, 2) ^ _rotr(a, 13) ^ _rotr(a, 22)
        maj = (a & b) ^ (a & c) ^ (b & c)
        t2 = s0 + maj
        a, b, c, d, e, f, g, h = t1 + t2, a, b, c, d + t1, e, f, g
    return [x + y for x, y in zip(state, (a, b, c, d, e, f, g, h), strict=True)]


def sha256_many(messages: U8) -> U8:
    """SHA-256 of each row of an (n, L) uint8 array: an (n, 32) uint8 array of digests.

    Guarantee: row i of the result equals hashlib.sha256(messages[i].tobytes()).digest().
    """
    messages = np.ascontiguousarray(messages, dtype=np.uint8)
    n = messages.shape[0]
    out = np.empty((n, 32), dtype=np.uint8)
    for start in range(0, n, CHUNK):
        words = pad(messages[start : start + CHUNK])
        m = words.shape[0]
        state = [np.full(m, h, dtype=np.uint32) for h in H0]
        for blk in range(words.shape[1] // 16):
            state = _compress(state, words[:, blk * 16 : (blk + 1) * 16])
        out[start : start + m] = np.stack(state, axis=1).astype(">u4").view(np.uint8)
    return out
