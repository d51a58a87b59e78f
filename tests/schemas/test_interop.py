"""Interop: messages we write decode with Apache Avro's own Python implementation.

The fingerprint is checked against the CRC-64-AVRO algorithm written out from the
Avro specification here, independently of fastavro.
"""

from __future__ import annotations

import io
from importlib import resources

import avro.io
import avro.schema
from flightrec.schemas import (
    MAGIC,
    FileTail,
    Lifecycle,
    LogBatch,
    ProcessExit,
    default_codec,
    encode,
)

EMPTY = 0xC15D213AA4D7A795
_TABLE = []
for i in range(256):
    fp = i
    for _ in range(8):
        fp = (fp >> 1) ^ (EMPTY & -(fp & 1))
    _TABLE.append(fp)


def crc64_avro(data: bytes) -> int:
    """CRC-64-AVRO exactly as the Avro specification's reference code computes it."""
    fp = EMPTY
    for byte in data:
        fp = (fp >> 8) ^ _TABLE[(fp ^ byte) & 0xFF]
    return fp


def _apache_schema(file: str) -> avro.schema.Schema:
    return avro.schema.parse((resources.files("flightrec.schemas") / file).read_text())


def _apache_decode(message: bytes, file: str) -> dict:
    schema = _apache_schema(file)
    assert message[:2] == MAGIC
    canonical = schema.canonical_form.encode()
    assert int.from_bytes(message[2:10], "little") == crc64_avro(canonical)
    reader = avro.io.DatumReader(schema)
    body = io.BytesIO(message[10:])
    record = reader.read(avro.io.BinaryDecoder(body))
    assert body.tell() == len(message) - 10
    return record


def test_log_batch_decodes_with_apache_avro():
    batch = LogBatch(
        event_id="7d0c3f6e-0000-4000-8000-000000000001",
        instance_id="gpu-7",
        boot_id="b1",
        seq=12,
        ts_us=1_700_000_000_000_000,
        stage="benchmark",
        source="/var/log/prover.log",
        pid=4242,
        line_no=[1, 2],
        line_ts_us=[1, 2],
        text=["CUDA error: no kernel image", "bye é"],
        truncated=[False, True],
        invalid_utf8=[False, False],
    )
    record = _apache_decode(encode(batch), "LogBatch.avsc")
    assert record["text"] == ["CUDA error: no kernel image", "bye é"]
    assert record["truncated"] == [False, True]
    assert record["seq"] == 12 and record["instance_id"] == "gpu-7"


def test_process_exit_and_lifecycle_decode_with_apache_avro():
    exit_ = ProcessExit(
        event_id="e",
        instance_id="i",
        boot_id="b",
        seq=1,
        ts_us=2,
        stage="benchmark",
        argv=["./bench.sh", "--min-rate", "30"],
        pid=10,
        exit_code=1,
        started_us=1,
        ended_us=2,
        duration_s=0.5,
        stderr_tail=["benchmark exited with error"],
        file_tails=(FileTail("/var/log/prover.log", ["no kernel image"]),),
    )
    record = _apache_decode(encode(exit_), "ProcessExit.avsc")
    assert record["exit_code"] == 1 and record["signal"] is None
    assert record["file_tails"] == [{"path": "/var/log/prover.log", "lines": ["no kernel image"], "exists": True}]
    life = Lifecycle(
        event_id="e",
        instance_id="i",
        boot_id="b",
        seq=0,
        ts_us=0,
        stage="tunnel",
        state="failed",
        detail="ssh: connection refused",
        attributes={"attempt": "3"},
    )
    record = _apache_decode(encode(life), "Lifecycle.avsc")
    assert record["state"] == "failed" and record["attributes"] == {"attempt": "3"}


def test_every_fingerprint_matches_the_spec_algorithm():
    codec = default_codec()
    for version in codec.versions:
        schema = _apache_schema(version.source)
        assert version.fingerprint == crc64_avro(schema.canonical_form.encode()).to_bytes(8, "little"), version.source


def test_apache_avro_writes_what_we_decode():
    """The other direction: a body written by Apache Avro, framed by the spec, decodes with our codec."""
    schema = _apache_schema("Lifecycle.avsc")
    buf = io.BytesIO()
    avro.io.DatumWriter(schema).write(
        {
            "event_id": "e",
            "instance_id": "i",
            "boot_id": "b",
            "seq": 5,
            "ts_us": 6,
            "stage": "params",
            "state": "succeeded",
            "detail": "",
            "attributes": {},
        },
        avro.io.BinaryEncoder(buf),
    )
    message = MAGIC + crc64_avro(schema.canonical_form.encode()).to_bytes(8, "little") + buf.getvalue()
    event = default_codec().decode(message)
    assert isinstance(event, Lifecycle) and event.seq == 5 and event.state == "succeeded"
