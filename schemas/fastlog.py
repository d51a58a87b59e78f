"""A vectorized Avro encoder for LogBatch (wire knowledge of its field order), byte-identical to fastavro's."""

from __future__ import annotations

import json
from collections.abc import Sequence
from importlib import resources

from flightrec.schemas import MAGIC, Event, LogBatch, default_codec

_FIELDS = (
    "event_id",
    "instance_id",
    "boot_id",
    "seq",
    "ts_us",
    "stage",
    "source",
    "pid",
    "line_no",
    "line_ts_us",
    "text",
    "truncated",
    "invalid_utf8",
    "late",
)


def _schema_matches() -> bool:
    raw = json.loads((resources.files("flightrec.schemas") / "LogBatch.avsc").read_text("utf-8"))
    return tuple(f["name"] for f in raw["fields"]) == _FIELDS


def _long(n: int) -> bytes:
    z = (n << 1) ^ (n >> 63)
    out = bytearray()
    while z & ~0x7F:
        out.append((z & 0x7F) | 0x80)
        z >>= 7
    out.append(z)
    return bytes(out)


def _str(s: str) -> bytes:
    b = s.encode("utf-8")
    return _long(len(b)) + b


# the varints of 64 consecutive numbers from a multiple of 64 differ only in their first byte (zigzag 2i:
# 0x80|2k for k = 0..63); bytes 2..w are the same for all of them: placeholders 1..w-1, set by translate()
_BLOCK = {w: b"".join(bytes([0x80 | 2 * k, *range(1, w)]) for k in range(64)) for w in range(2, 11)}


def consecutive(start: int, stop: int) -> bytes:
    """Zigzag varints of ``start .. stop-1`` (``0 <= start``), concatenated: a few C calls per 64 numbers."""
    out: list[bytes] = []
    i = start
    while i < stop:
        w = max(1, ((i << 1).bit_length() + 6) // 7)
        end = min(stop, 1 << (7 * w - 1))  # the numbers whose varint has w bytes
        if w == 1:
            out.append(bytes(range(2 * i, 2 * end, 2)))
            i = end
            continue
        template, holders = _BLOCK[w], bytes(range(1, w))
        while i < end:
            blk = i >> 6  # every number of the block has z >> 7 == blk
            upper = bytes(((blk >> (7 * j)) & 0x7F) | (0x80 if j < w - 2 else 0) for j in range(w - 1))
            data = template.translate(bytes.maketrans(holders, upper))
            nxt = min(end, (blk + 1) << 6)
            out.append(data[(i & 63) * w : (nxt - (blk << 6)) * w])
            i = nxt
    return b"".join(out)


def varints(values: Sequence[int]) -> bytes:
    """Zigzag varints of many longs at once (numpy where installed), concatenated."""
    try:
        import numpy as np  # only here: the agent's usual batches never need it, and its import slows the start
    except ModuleNotFoundError:  # `pip install flightrec` and the single file have no numpy: one at a time
        return b"".join(map(_long, values))

    v = np.asarray(values, dtype=np.int64)
    z = ((v << 1) ^ (v >> 63)).view(np.uint64)
    nb = np.ones(len(z), dtype=np.int64)
    t = z >> np.uint64(7)
    while t.any():
        nb += t > 0
        t = t >> np.uint64(7)
    width = int(nb[0]) if len(nb) else 0
    if width and (nb == width).all():  # one width for all (line numbers of a batch, mostly): column by column
        out = np.empty((len(z), width), dtype=np.uint8)
        for j in range(width):
            out[:, j] = (z >> np.uint64(7 * j)) & np.uint64(0x7F)
        if width > 1:
            out[:, :-1] |= np.uint8(0x80)
        return out.tobytes()
    g = np.arange(int(nb.max()), dtype=np.uint64)
    groups = ((z[:, None] >> (np.uint64(7) * g)[None, :]) & np.uint64(0x7F)).astype(np.uint8)
    gi = g.astype(np.int64)[None, :]
    groups |= (gi < nb[:, None] - 1).astype(np.uint8) << np.uint8(7)
    return groups[gi < nb[:, None]].tobytes()


def _long_array(values: Sequence[int]) -> bytes:
    n = len(values)
    if not n:
        return b"\x00"
    if isinstance(values, range) and values.step == 1 and values.start >= 0:  # line numbers
        return _long(n) + consecutive(values.start, values.stop) + b"\x00"
    if values.count(values[0]) == n:  # one read time for the whole batch (the usual case): one varint, repeated
        return _long(n) + _long(values[0]) * n + b"\x00"
    distinct = set(values)
    if len(distinct) <= 1024:  # a few read times (one per read): each encoded once
        heads = {v: _long(v) for v in distinct}
        return _long(n) + b"".join(map(heads.__getitem__, values)) + b"\x00"
    return _long(n) + varints(values) + b"\x00"


def _str_parts(texts: Sequence[str], encoded: Sequence[bytes] | None = None) -> list[bytes]:
    """The Avro array of strings as pieces to join (joined once, with the rest of the message)."""
    if not texts:
        return [b"\x00"]
    if encoded is not None and len(encoded) == len(texts):
        parts = encoded  # the caller's UTF-8 of each text: no join, encode and split again
    else:
        parts = "\n".join(texts).encode("utf-8").split(b"\n")
    if len(parts) != len(texts):  # a text held a newline: item by item
        return [_long(len(texts)), *map(_str, texts), b"\x00"]
    lens = list(map(len, parts))
    heads = {n: _long(n) for n in set(lens)}
    items: list[bytes] = [b""] * (2 * len(parts) + 2)  # count, length, text, length, text..., end
    items[0], items[-1] = _long(len(texts)), b"\x00"
    items[1:-1:2] = list(map(heads.__getitem__, lens))  # C-speed slices: no Python code per line
    items[2:-1:2] = parts
    return items


def _bool_array(flags: Sequence[bool]) -> bytes:
    if not flags:
        return b"\x00"
    try:
        raw = bytes(flags)  # bools are 0/1 already
    except (TypeError, ValueError):
        raw = b"\x02"
    if not raw.translate(None, b"\x00\x01"):
        return _long(len(flags)) + raw + b"\x00"
    return _long(len(flags)) + bytes(map(bool, flags)) + b"\x00"


class LogBatchEncoder:
    """Encodes LogBatch events as the codec does, but with C-speed loops over the per-line arrays.

    Guarantees: output is byte-for-byte what ``flightrec.schemas.encode`` gives (a
    property test checks it); other event types, or a LogBatch schema whose fields
    differ from the ones this was written for, go through the codec.
    """

    def __init__(self) -> None:
        self._codec = default_codec()
        self._ok = _schema_matches()
        self._header = MAGIC + self._codec.current(LogBatch.name).fingerprint

    def __call__(self, ev: Event, encoded: Sequence[bytes] | None = None) -> bytes:
        """``ev``'s Avro message; ``encoded``, where given, must be exactly ``[t.encode() for t in ev.text]``."""
        if not self._ok or type(ev) is not LogBatch:
            return self._codec.encode(ev)
        items = _str_parts(ev.text, encoded)  # a new list: the other fields go around it, one join in all
        items[0] = b"".join(
            (
                self._header,
                _str(ev.event_id),
                _str(ev.instance_id),
                _str(ev.boot_id),
                _long(ev.seq),
                _long(ev.ts_us),
                _str(ev.stage),
                _str(ev.source),
                _long(ev.pid),
                _long_array(ev.line_no),
                _long_array(ev.line_ts_us),
                items[0],
            )
        )
        items[-1] += _bool_array(ev.truncated) + _bool_array(ev.invalid_utf8) + _bool_array(ev.late)
        return b"".join(items)


encode_fast = LogBatchEncoder()
