"""A vectorized Avro decoder for large LogBatch messages: the per-line arrays as numpy and Arrow columns, not lists."""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from importlib import resources
from typing import Any

import fastavro
import numpy as np
import pyarrow as pa
from fastavro import parse_schema
from flightrec.schemas.codec import HEADER_LEN, MAGIC, Codec, default_codec
from flightrec.schemas.events import LogBatch
from flightrec.schemas.fastlog import _FIELDS, _schema_matches

# the fields before the per-line arrays (the envelope, stage, source, pid), read by fastavro as a record of their own
_HEAD = 8
_LONGS = ("line_no", "line_ts_us")
_FLAGS = ("truncated", "invalid_utf8", "late")
# the fewest bytes a line takes in a LogBatch: a byte each for its number, time, text length and two flags
LINE_MIN_BYTES = 5
MIN_BYTES = 4096  # smaller messages (a few lines) decode faster through the codec: numpy's fixed cost a message


class _Unusual(Exception):
    """Something this decoder does not handle exactly as fastavro would: the caller uses the codec."""


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    """One zigzag long at ``pos``: (value, position after it)."""
    shift = z = 0
    while True:
        if pos >= len(data) or shift > 63:
            raise _Unusual
        b = data[pos]
        pos += 1
        z |= (b & 0x7F) << shift
        if b < 0x80:
            return (z >> 1) ^ -(z & 1), pos
        shift += 7


def _array(data: bytes, pos: int, items: Callable[[int, int], tuple[np.ndarray, int]]) -> tuple[list[np.ndarray], int]:
    """An Avro array at ``pos`` in blocks: (each block's items as ``items(start, count)`` reads them, position after).

    A negative count is followed by the block's size in bytes, which must match where its items end.
    """
    parts: list[np.ndarray] = []
    while True:
        n, pos = _varint(data, pos)
        if n == 0:
            return parts, pos
        size = -1
        if n < 0:
            n = -n
            size, pos = _varint(data, pos)
        values, after = items(pos, n)
        if size >= 0 and after != pos + size:
            raise _Unusual
        parts.append(values)
        pos = after


def _count(data: bytes, buf: np.ndarray, pos: int) -> int:
    """The items of the array of longs at ``pos``, block by block: each block's count, then that many varints skipped
    (a block's claimed size is not trusted: fastavro reads the count's items whatever it says)."""
    total = 0
    while True:
        n, pos = _varint(data, pos)
        if n == 0:
            return total
        if n < 0:
            n = -n
            _, pos = _varint(data, pos)
        term = np.flatnonzero(buf[pos : pos + 10 * n] < 0x80)
        if len(term) < n:
            raise _Unusual
        total += n
        pos += int(term[n - 1]) + 1


def _longs(buf: np.ndarray, pos: int, n: int) -> tuple[np.ndarray, int]:
    """``n`` zigzag varints from ``pos``: (int64 values, position after them)."""
    win = buf[pos : pos + 9 * n]  # 9 bytes carry 63 bits: longer varints (|v| >= 2**62) go to the codec
    term = np.flatnonzero(win < 0x80)
    if len(term) < n:
        raise _Unusual
    last = int(term[n - 1]) + 1
    w, rest = divmod(last, n)
    if w > 9:
        raise _Unusual
    if not rest and (w == 1 or bool((term[:n] == np.arange(w - 1, last, w)).all())):  # one width for all
        cols = win[:last].reshape(n, w).astype(np.uint64) & np.uint64(0x7F)
        z = cols[:, 0].copy()
        for j in range(1, w):
            z |= cols[:, j] << np.uint64(7 * j)
    else:
        ends = term[:n]
        starts = np.empty(n, dtype=np.int64)
        starts[0] = 0
        starts[1:] = ends[:-1] + 1
        widths = ends - starts + 1
        if int(widths.max()) > 9:
            raise _Unusual
        z = np.zeros(n, dtype=np.uint64)
        for j in range(int(widths.max())):
            sel = widths > j
            z[sel] |= (win[starts[sel] + j] & np.uint8(0x7F)).astype(np.uint64) << np.uint64(7 * j)
    values = (z >> np.uint64(1)).astype(np.int64) ^ -(z & np.uint64(1)).astype(np.int64)
    return values, pos + last


def _strings(items: list[bytes]) -> pa.StringArray:
    """Avro strings read as bytes, as one Arrow string array: no Python string per line. Text that is not UTF-8 (the
    codec refuses it) is unusual; Arrow's full validation rejects what Python's strict decoder rejects (surrogates,
    overlong forms, beyond U+10FFFF, cut sequences: tests/schemas/test_logcolumns.py)."""
    lengths = np.fromiter(map(len, items), dtype=np.int64, count=len(items))
    offsets = np.zeros(len(items) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    if offsets[-1] > np.iinfo(np.int32).max:
        raise _Unusual
    texts = pa.StringArray.from_buffers(
        len(items), pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(b"".join(items))
    )
    try:
        texts.validate(full=True)
    except pa.ArrowInvalid as exc:
        raise _Unusual from exc
    return texts


class LogColumns:
    """Decodes a LogBatch message to the record ``Codec.decode_record`` gives, its per-line arrays as numpy columns
    and its texts as an Arrow string array.

    Guarantees: for every message it accepts, the values equal the codec's, field by field (a property test checks
    it, including arrays split in blocks as other Avro writers write them); it accepts only messages of the current
    LogBatch schema of at least ``MIN_BYTES`` whose flags are 0/1 bytes and whose texts are UTF-8; for anything else
    (small, older schema, corrupt, unusual) it returns None and the caller decodes with the codec, which gives the
    canonical error.
    """

    def __init__(self, codec: Codec | None = None, min_bytes: int = MIN_BYTES) -> None:
        codec = codec or default_codec()
        self._min_bytes = min_bytes
        version = codec.current(LogBatch.name)
        self._ok = _schema_matches()
        self._header = MAGIC + version.fingerprint
        fields = json.loads((resources.files("flightrec.schemas") / "LogBatch.avsc").read_text("utf-8"))["fields"]
        self._head = parse_schema(
            {"type": "record", "name": "LogBatchHead", "namespace": "flightrec.columns", "fields": fields[:_HEAD]},
            named_schemas={},
        )
        # the texts read as bytes (the same bytes on the wire): Arrow takes them whole, then checks them for UTF-8
        self._texts = parse_schema({"type": "array", "items": "bytes"}, named_schemas={})
        self.name = version.name

    def __call__(self, data: bytes) -> dict[str, Any] | None:
        if not self._ok or len(data) < self._min_bytes or data[:HEADER_LEN] != self._header:
            return None
        try:
            return self._decode(data)
        except Exception:  # noqa: BLE001 - fastavro raises many kinds for corrupt bodies: the codec names the fault
            return None

    def lines(self, data: bytes) -> int:
        """How many lines a LogBatch message holds, as fastavro would read them (every block of its line numbers,
        whatever sizes the blocks claim), for a message of the current schema; for any other (an older schema, a
        damaged one) an upper bound, one line per LINE_MIN_BYTES. Reads the head and skips the line numbers."""
        if self._ok and data[:HEADER_LEN] == self._header:
            try:
                body = io.BytesIO(data)
                body.seek(HEADER_LEN)
                fastavro.schemaless_reader(body, self._head, None)
                return _count(data, np.frombuffer(data, dtype=np.uint8), body.tell())
            except Exception:  # noqa: BLE001 - damaged: counted by its size below (the fold makes it a dead letter)
                pass
        return max(0, len(data) - HEADER_LEN) // LINE_MIN_BYTES

    def _decode(self, data: bytes) -> dict[str, Any]:
        body = io.BytesIO(data)
        body.seek(HEADER_LEN)
        rec = fastavro.schemaless_reader(body, self._head, None)
        if not isinstance(rec, dict):
            raise _Unusual
        pos = body.tell()
        buf = np.frombuffer(data, dtype=np.uint8)

        def longs(start: int, n: int) -> tuple[np.ndarray, int]:
            return _longs(buf, start, n)

        def flags(start: int, n: int) -> tuple[np.ndarray, int]:
            raw = buf[start : start + n]
            if len(raw) < n or bool((raw > 1).any()):  # fastavro's reading of other bytes is its own business
                raise _Unusual
            return raw.astype(np.bool_), start + n

        for name in _LONGS:
            parts, pos = _array(data, pos, longs)
            rec[name] = _joined(parts, np.int64)
        body.seek(pos)
        items = fastavro.schemaless_reader(body, self._texts, None)
        if not isinstance(items, list):
            raise _Unusual
        rec["text"] = _strings(items)
        pos = body.tell()
        for name in _FLAGS:
            parts, pos = _array(data, pos, flags)
            rec[name] = _joined(parts, np.bool_)
        if pos != len(data):
            raise _Unusual
        return rec


def _joined(parts: list[np.ndarray], dtype: type) -> np.ndarray:
    if len(parts) == 1:
        return parts[0]
    return np.concatenate(parts) if parts else np.zeros(0, dtype=dtype)


assert _FIELDS[_HEAD:] == _LONGS + ("text",) + _FLAGS  # the wire order this decoder reads
