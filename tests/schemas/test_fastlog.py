"""schemas.fastlog, the agent's LogBatch encoder, gives exactly the bytes of the generic fastavro codec."""

from __future__ import annotations

import pytest
from flightrec.schemas import Lifecycle, LogBatch, decode, encode
from flightrec.schemas.fastlog import _long, encode_fast, varints
from hypothesis import given, settings
from hypothesis import strategies as st
from schema_strategies import batches


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(batches())
def test_fast_encoding_is_byte_identical(batch: LogBatch) -> None:
    assert encode_fast(batch) == encode(batch)
    assert decode(encode_fast(batch)) == batch


def test_big_batch_with_long_lines_and_newlines() -> None:
    texts = [f"line {i} " + "x" * (i % 300) for i in range(5000)] + ["has\nnewline", "é" * 100]
    n = len(texts)
    b = LogBatch(
        event_id="e",
        instance_id="i",
        boot_id="b",
        seq=7,
        ts_us=1_700_000_000_000_000,
        stage="s",
        source="stdout",
        pid=4242,
        line_no=range(1, n + 1),
        line_ts_us=[1_700_000_000_000_123] * n,
        text=texts,
        truncated=[i % 7 == 0 for i in range(n)],
        invalid_utf8=[False] * n,
    )
    assert encode_fast(b) == encode(b)


def test_other_events_go_through_the_codec() -> None:
    ev = Lifecycle(event_id="e", instance_id="i", boot_id="b", seq=0, ts_us=1, stage="s", state="info")
    assert encode_fast(ev) == encode(ev)


def test_varints_edges() -> None:
    from flightrec.schemas.fastlog import _long

    vals = [0, -1, 1, 63, 64, -64, -65, 2**62, -(2**63), 2**63 - 1]
    assert varints(vals) == b"".join(_long(v) for v in vals)


@settings(max_examples=200, deadline=None)
@given(batches())
def test_fast_encoding_with_the_lines_already_encoded_is_byte_identical(batch: LogBatch) -> None:
    # the line batcher hands over the UTF-8 it read, so the text is not joined, encoded and split again
    assert encode_fast(batch, [t.encode("utf-8") for t in batch.text]) == encode(batch)


def test_a_batch_of_several_reads_and_one_varint_width() -> None:
    n = 13_000
    texts = [f"{i:07d} worker 3: batch done" for i in range(n)]
    ts = [1_700_000_000_000_000 + (i // 5000) for i in range(n)]  # three reads: three read times
    for first in (1, 10_000, 2**20 - 5_000):  # all 2 bytes; all 3 bytes; 3 then 4 bytes
        b = LogBatch(
            event_id="e",
            instance_id="i",
            boot_id="b",
            seq=7,
            ts_us=1,
            stage="s",
            source="stdout",
            pid=1,
            line_no=range(first, first + n),
            line_ts_us=ts,
            text=texts,
            truncated=[False] * n,
            invalid_utf8=[False] * n,
        )
        assert encode_fast(b, [t.encode() for t in texts]) == encode(b) == encode_fast(b)
        assert varints(list(range(first, first + n))) == b"".join(_long(v) for v in range(first, first + n))


@settings(max_examples=300, deadline=None)
@given(st.integers(min_value=0, max_value=2**62), st.integers(min_value=0, max_value=600))
def test_consecutive_line_numbers_without_numpy(start: int, n: int) -> None:
    from flightrec.schemas.fastlog import consecutive

    assert consecutive(start, start + n) == b"".join(_long(v) for v in range(start, start + n))


def test_width_boundaries_of_consecutive_numbers() -> None:
    from flightrec.schemas.fastlog import consecutive

    for edge in (0, 64, 8192, 2**20, 2**27, 2**34, 2**62 - 64):
        lo = max(0, edge - 130)
        assert consecutive(lo, edge + 130) == b"".join(_long(v) for v in range(lo, edge + 130)), edge


def test_the_agent_starts_without_numpy() -> None:
    # numpy costs ~40 ms to import: the agent's start is on the critical path of every stage
    import subprocess
    import sys

    code = "import sys, flightrec.cli, flightrec.producer.run; print('numpy' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False", out.stderr
