"""schemas.logcolumns, the consumers' columnar LogBatch decoder, gives the codec's values or declines."""

from __future__ import annotations

import io
import json
from importlib import resources
from typing import Any

import fastavro
import numpy as np
import pyarrow as pa
import pytest
from flightrec.schemas import LogBatch, decode_record, default_codec, encode
from flightrec.schemas.codec import HEADER_LEN, MAGIC, schema_fingerprint
from flightrec.schemas.logcolumns import LINE_MIN_BYTES, MIN_BYTES, LogColumns
from hypothesis import given, settings
from hypothesis import strategies as st
from schema_strategies import batches

from flightrec.errors import CodecError

every_size = LogColumns(min_bytes=0)


def plain(rec: dict[str, Any]) -> dict[str, Any]:
    return {
        k: v.tolist() if isinstance(v, np.ndarray) else v.to_pylist() if isinstance(v, pa.Array) else v
        for k, v in rec.items()
    }


def small_values(b: LogBatch) -> bool:
    """Every per-line long fits 9 varint bytes (|v| < 2**62): the decoder takes those itself."""
    return all(-(2**62) <= v < 2**62 for v in [*b.line_no, *b.line_ts_us])


def in_blocks(b: LogBatch, data: Any) -> bytes:
    """``b`` as another Avro writer may write it: each array in several blocks, some with negative counts and sizes."""
    raw = json.loads((resources.files("flightrec.schemas") / "LogBatch.avsc").read_text("utf-8"))
    types = {f["name"]: f["type"] for f in raw["fields"]}
    rec = b.to_record()
    out = io.BytesIO()
    out.write(MAGIC + schema_fingerprint(raw))
    for f in raw["fields"]:
        t = types[f["name"]]
        if not isinstance(t, dict):
            fastavro.schemaless_writer(out, fastavro.parse_schema(t), rec[f["name"]])
            continue
        items = list(rec[f["name"]])
        item_schema = fastavro.parse_schema(t["items"])
        while items:
            k = data.draw(st.integers(min_value=1, max_value=len(items)))
            block, items = items[:k], items[k:]
            body = io.BytesIO()
            for v in block:
                fastavro.schemaless_writer(body, item_schema, v)
            if data.draw(st.booleans()):
                fastavro.schemaless_writer(out, "long", -len(block))
                fastavro.schemaless_writer(out, "long", len(body.getvalue()))
            else:
                fastavro.schemaless_writer(out, "long", len(block))
            out.write(body.getvalue())
        out.write(b"\x00")
    return out.getvalue()


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(batches())
def test_the_codec_s_messages_decode_to_the_codec_s_values(batch: LogBatch) -> None:
    msg = encode(batch)
    got = every_size(msg)
    if small_values(batch):
        assert got is not None
    if got is not None:
        assert plain(got) == decode_record(msg)[1]


@settings(max_examples=200, deadline=None)
@given(batches())
def test_a_message_s_line_count_is_read_from_its_head(batch: LogBatch) -> None:
    msg = encode(batch)
    assert LogColumns().lines(msg) == len(batch.text)
    # one it cannot count so (cut, or not this schema's) counts one line per LINE_MIN_BYTES of it: never fewer
    # than a message of that size can hold
    for odd in (msg[: HEADER_LEN + 3], b"\x00" + msg[1:]):
        assert LogColumns().lines(odd) == (len(odd) - HEADER_LEN) // LINE_MIN_BYTES


@pytest.mark.slow
@settings(max_examples=200, deadline=None)
@given(batches(), st.data())
def test_arrays_in_several_blocks_decode_to_the_codec_s_values(batch: LogBatch, data: Any) -> None:
    msg = in_blocks(batch, data)
    expected = decode_record(msg)[1]
    assert LogColumns().lines(msg) == len(batch.text)  # every block counted, as fastavro reads them
    got = every_size(msg)
    if small_values(batch):
        assert got is not None
    if got is not None:
        assert plain(got) == expected


def big_batch(n: int = 500) -> LogBatch:
    ts = 1_700_000_000_000_000
    return LogBatch(
        event_id="e",
        instance_id="i",
        boot_id="b",
        seq=3,
        ts_us=ts,
        stage="benchmark",
        source="stdout",
        pid=7,
        line_no=list(range(1, n + 1)),
        line_ts_us=[ts + i * 1000 for i in range(n)],  # several varint widths mixed: the general path
        text=[f"proof {i} done in 41.7s é" + "x" * (i % 150) for i in range(n)],
        truncated=[i % 5 == 0 for i in range(n)],
        invalid_utf8=[False] * n,
        late=[i > n - 3 for i in range(n)],
    )


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_damaged_messages_are_declined_where_the_codec_refuses_them(data: Any) -> None:
    msg = bytearray(encode(big_batch(60)))
    for _ in range(data.draw(st.integers(min_value=1, max_value=4))):
        at = data.draw(st.integers(min_value=HEADER_LEN, max_value=len(msg) - 1))
        msg[at] = data.draw(st.integers(min_value=0, max_value=255))
    cut = data.draw(st.integers(min_value=HEADER_LEN, max_value=len(msg)))
    msg = bytes(msg[:cut]) + data.draw(st.binary(max_size=3))
    got = every_size(msg)
    try:
        expected = decode_record(msg)[1]
    except CodecError:
        assert got is None
    else:
        assert got is None or plain(got) == expected


def test_large_messages_only_by_default_and_only_the_current_schema() -> None:
    decoder = LogColumns()
    big = encode(big_batch())
    assert len(big) >= MIN_BYTES and decoder(big) is not None
    assert decoder(encode(big_batch(3))) is None  # a few lines: the codec is faster
    codec = default_codec()
    older = [v for v in codec.versions if v.name == LogBatch.name and not v.current]
    assert older, "schemas/previous keeps an older LogBatch"
    rec = decode_record(big)[1]
    for version in older:
        body = io.BytesIO()
        fastavro.schemaless_writer(body, version.parsed, rec)
        assert decoder(MAGIC + version.fingerprint + body.getvalue()) is None


def test_a_ten_byte_varint_goes_to_the_codec() -> None:
    b = big_batch()
    b = LogBatch(**{**b.to_record(), "line_no": [2**62] + list(b.line_no[1:])})
    msg = encode(b)
    assert every_size(msg) is None
    assert decode_record(msg)[1]["line_no"][0] == 2**62


@pytest.mark.parametrize("flag", [2, 0xFF])
def test_a_flag_byte_other_than_0_or_1_goes_to_the_codec(flag: int) -> None:
    b = big_batch(20)
    msg = bytearray(encode(b))
    # the invalid_utf8 array is the last but one: count, 20 flag bytes, end; then late's count, 20 bytes, end
    at = len(msg) - 1 - 21 - 1 - 20
    assert msg[at] == 0
    msg[at] = flag
    assert every_size(bytes(msg)) is None


@pytest.mark.parametrize("extra", [b"\x00", b"\x02\x01"])
def test_trailing_bytes_go_to_the_codec(extra: bytes) -> None:
    msg = encode(big_batch()) + extra
    with pytest.raises(CodecError, match="trailing bytes"):
        decode_record(msg)
    assert LogColumns()(msg) is None


@pytest.mark.parametrize(
    "text",
    [
        b"\xed\xa0\x80Q",  # a surrogate
        b"\xc0\x80QQ",  # an overlong NUL
        b"\xf4\x90\x80\x80",  # beyond U+10FFFF
        b"\xe2\x82QQ",  # a cut sequence
        b"\xffQQQ",
        b"\xe2\x82\xacQ",  # valid: the euro sign
        b"\xf0\x9f\x98\x80",  # valid: four bytes
        b"Q\x00QQ",  # valid: NUL is a character
    ],
)
def test_texts_are_accepted_where_the_codec_reads_them_as_utf8(text: bytes) -> None:
    b = big_batch(40)
    b = LogBatch(**{**b.to_record(), "text": [*b.text[:-1], "QQQQ"]})
    msg = encode(b)
    assert msg.count(b"QQQQ") == 1
    msg = msg.replace(b"QQQQ", text)
    got = every_size(msg)
    try:
        expected = decode_record(msg)[1]
    except CodecError:
        assert got is None, text
    else:
        assert got is not None and plain(got) == expected, text
        assert expected["text"][-1] == text.decode()
