"""The codec round-trips every schema, rejects bad bytes with CodecError, and resolves old schemas."""

from __future__ import annotations

import contextlib
import io
import json
from importlib import resources

import fastavro
import pytest
from flightrec.schemas import (
    EVENT_TYPES,
    MAGIC,
    BenchmarkResult,
    Codec,
    FileTail,
    InstanceFacts,
    Lifecycle,
    LogBatch,
    ProcessExit,
    Sealed,
    Throughput,
    decode,
    default_codec,
    encode,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flightrec.errors import CodecError, FlightrecError

# -- strategies --------------------------------------------------------------

text = st.text(max_size=40)
longs = st.integers(min_value=-(2**63), max_value=2**63 - 1)
ints = st.integers(min_value=-(2**31), max_value=2**31 - 1)
doubles = st.floats(allow_nan=False)
str_maps = st.dictionaries(text, text, max_size=4)
envelope = dict(
    event_id=st.uuids().map(str),
    instance_id=text,
    boot_id=text,
    seq=st.integers(min_value=0, max_value=2**63 - 1),
    ts_us=longs,
)


@st.composite
def log_batches(draw):
    n = draw(st.integers(min_value=0, max_value=30))
    return LogBatch(
        **{k: draw(v) for k, v in envelope.items()},
        stage=draw(text),
        source=draw(text),
        pid=draw(ints),
        line_no=draw(st.lists(longs, min_size=n, max_size=n)),
        line_ts_us=draw(st.lists(longs, min_size=n, max_size=n)),
        text=draw(st.lists(st.text(max_size=200), min_size=n, max_size=n)),
        truncated=draw(st.lists(st.booleans(), min_size=n, max_size=n)),
        invalid_utf8=draw(st.lists(st.booleans(), min_size=n, max_size=n)),
    )


def _b(cls, **fields):
    return st.builds(cls, **envelope, **fields)


EVENTS = st.one_of(
    _b(
        Lifecycle,
        stage=text,
        state=st.sampled_from(["started", "succeeded", "failed", "skipped", "info"]),
        detail=text,
        attributes=str_maps,
    ),
    _b(
        InstanceFacts,
        gpu_model=text,
        gpu_count=ints,
        gpu_memory_mib=longs,
        driver_version=text,
        cuda_version=text,
        compute_capability=text,
        gpu_probe_error=st.none() | text,
        host=text,
        cpu_model=text,
        cpu_count=ints,
        ram_mib=longs,
        image=text,
        price_per_hour=st.none() | doubles,
        attributes=str_maps,
    ),
    log_batches(),
    _b(
        ProcessExit,
        stage=text,
        argv=st.lists(text, max_size=5),
        pid=ints,
        exit_code=st.none() | ints,
        signal=st.none() | ints,
        signal_name=st.none() | text,
        start_error=st.none() | text,
        started_us=longs,
        ended_us=longs,
        duration_s=doubles,
        timed_out=st.booleans(),
        stdout_tail=st.lists(text, max_size=5),
        stderr_tail=st.lists(text, max_size=5),
        file_tails=st.lists(
            st.builds(FileTail, path=text, lines=st.lists(text, max_size=4), exists=st.booleans()), max_size=3
        ).map(tuple),
    ),
    _b(
        Throughput,
        stage=text,
        backend=text,
        device=text,
        proofs=ints,
        seconds=doubles,
        proofs_per_hour=doubles,
        phase=st.sampled_from(["warmup", "measured"]),
        params=str_maps,
    ),
    _b(
        BenchmarkResult,
        stage=text,
        backend=text,
        device=text,
        proofs=ints,
        proofs_per_hour=doubles,
        min_rate=doubles,
        verdict=st.sampled_from(["pass", "fail", "error"]),
        detail=text,
        params=str_maps,
    ),
    _b(Sealed, event_count=longs, reason=text),
)


def _normal(event):
    """Compare events by record, with sequences as lists."""
    rec = event.to_record()
    return json.loads(json.dumps(rec, default=list))


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(EVENTS)
def test_every_schema_round_trips(event):
    data = encode(event)
    assert data[:2] == MAGIC
    back = decode(data)
    assert type(back) is type(event)
    assert _normal(back) == _normal(event)


def test_every_event_type_has_a_strategy_and_a_schema():
    codec = default_codec()
    for cls in EVENT_TYPES:
        assert codec.current(cls.name).fingerprint  # a current .avsc exists for each


def _sample() -> bytes:
    return encode(Sealed(event_id="e", instance_id="i", boot_id="b", seq=3, ts_us=5, event_count=4))


@pytest.mark.parametrize(
    "bad, reason",
    [
        (b"", "empty message"),
        (None, "empty message"),
        (b"\xc3", "truncated header"),
        (b"\xc3\x01\x00\x01", "truncated header"),
        (b'{"json": true}', "not Avro single-object"),
        (b"\x00" * 32, "not Avro single-object"),
        (MAGIC + b"\x01" * 8 + b"\x02\x03", "unknown schema fingerprint"),
    ],
)
def test_bad_bytes_give_the_typed_error(bad, reason):
    with pytest.raises(CodecError) as info:
        decode(bad)
    assert reason in info.value.reason
    assert isinstance(info.value, FlightrecError)


def test_truncated_body_and_trailing_bytes_are_rejected():
    good = _sample()
    for cut in range(10, len(good)):
        with pytest.raises(CodecError):
            decode(good[:cut])
    with pytest.raises(CodecError, match="trailing bytes"):
        decode(good + b"\x00")


def test_the_reason_for_bad_bytes_is_the_same_every_time():
    """A dead letter's reason must not depend on the run (replay equals live): no object addresses."""
    good = encode(
        LogBatch(
            event_id="e",
            instance_id="i",
            boot_id="b",
            seq=0,
            ts_us=1,
            stage="s",
            source="stdout",
            line_no=[1],
            line_ts_us=[1],
            text=["x"],
            truncated=[False],
            invalid_utf8=[False],
        )
    )
    reasons = set()
    for cut in range(10, len(good)):
        with pytest.raises(CodecError) as err:
            decode(good[:cut])
        reasons.add(str(err.value))
    assert not [r for r in reasons if " at 0x" in r], reasons


@settings(max_examples=500)
@given(st.binary(max_size=200))
def test_random_bytes_never_raise_anything_but_codec_error(data):
    with contextlib.suppress(CodecError):
        decode(data)


@settings(max_examples=300)
@given(st.integers(min_value=10, max_value=200), st.binary(min_size=1, max_size=8))
def test_corrupt_bodies_of_a_known_schema_raise_codec_error(pos, junk):
    good = bytearray(_sample())
    pos = min(pos, len(good) - 1)
    good[pos : pos + len(junk)] = junk
    with contextlib.suppress(CodecError):
        decode(bytes(good))


def test_invalid_utf8_in_a_string_is_a_codec_error():
    codec = default_codec()
    version = codec.current(Lifecycle.name)
    buf = io.BytesIO()
    fastavro.schemaless_writer(
        buf,
        version.parsed,
        dict(
            event_id="e",
            instance_id="i",
            boot_id="b",
            seq=0,
            ts_us=0,
            stage="s",
            state="info",
            detail="XX",
            attributes={},
        ),
    )
    body = buf.getvalue().replace(b"XX", b"\xff\xfe")
    with pytest.raises(CodecError):
        decode(MAGIC + version.fingerprint + body)


# -- schema evolution: data written with the previous schema still decodes ------------


def _previous(name: str) -> dict:
    return json.loads((resources.files("flightrec.schemas") / "previous" / name).read_text())


@pytest.mark.parametrize(
    "file, cls, record, defaults",
    [
        (
            "Lifecycle.v0.avsc",
            Lifecycle,
            dict(
                event_id="e", instance_id="i", boot_id="b", seq=1, ts_us=2, stage="tunnel", state="started", detail="d"
            ),
            {"attributes": {}},
        ),
        (
            "InstanceFacts.v0.avsc",
            InstanceFacts,
            dict(
                event_id="e",
                instance_id="i",
                boot_id="b",
                seq=0,
                ts_us=2,
                gpu_model="NVIDIA H100",
                gpu_count=1,
                gpu_memory_mib=81559,
                driver_version="550",
                cuda_version="12.4",
                compute_capability="9.0",
                gpu_probe_error=None,
                host="h",
                cpu_model="c",
                cpu_count=8,
                ram_mib=1000,
            ),
            {"image": "", "price_per_hour": None, "attributes": {}},
        ),
        (
            "BenchmarkResult.v0.avsc",
            BenchmarkResult,
            dict(
                event_id="e",
                instance_id="i",
                boot_id="b",
                seq=9,
                ts_us=2,
                stage="benchmark",
                backend="cpu",
                device="",
                proofs_per_hour=10.0,
                min_rate=5.0,
                verdict="pass",
                detail="",
            ),
            {"proofs": 0, "params": {}},
        ),
        (
            "LogBatch.v0.avsc",
            LogBatch,
            dict(
                event_id="e",
                instance_id="i",
                boot_id="b",
                seq=3,
                ts_us=2,
                stage="benchmark",
                source="stdout",
                pid=7,
                line_no=(1, 2),
                line_ts_us=(5, 6),
                text=("a", "b"),
                truncated=(False, False),
                invalid_utf8=(False, True),
            ),
            {"late": ()},
        ),
    ],
)
def test_data_written_with_the_previous_schema_still_decodes(file, cls, record, defaults):
    from flightrec.schemas import schema_fingerprint

    old = _previous(file)
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, fastavro.parse_schema(old), record)
    old_fp = schema_fingerprint(old)
    assert old_fp != default_codec().current(cls.name).fingerprint
    event = decode(MAGIC + old_fp + buf.getvalue())
    assert isinstance(event, cls)
    for key, value in {**record, **defaults}.items():
        assert getattr(event, key) == value


def test_codec_refuses_two_current_schemas_of_one_name(monkeypatch):
    from flightrec.schemas import codec as codec_mod

    files = codec_mod._load_schema_files()
    dup = [f for f in files if f[0] == "Sealed.avsc"][0]
    changed = json.loads(json.dumps(dup[1]))
    changed["fields"].append({"name": "extra", "type": "int", "default": 0})
    monkeypatch.setattr(codec_mod, "_load_schema_files", lambda: files + [("Sealed2.avsc", changed, True)])
    with pytest.raises(CodecError, match="two current schemas"):
        Codec()


def test_log_batch_columns_must_have_equal_lengths():
    with pytest.raises(ValueError):
        LogBatch(
            event_id="e",
            instance_id="i",
            boot_id="b",
            seq=0,
            ts_us=0,
            stage="s",
            source="stdout",
            line_no=[1],
            line_ts_us=[],
            text=["a"],
            truncated=[False],
            invalid_utf8=[False],
        )
