"""A raw producer for the tests: Kafka record batches (v2) written byte for byte and sent in a Produce request.

What any client holding a write credential can put on a topic, without a client library choosing for it: header
names and values as arbitrary bytes (a name that is not UTF-8 included), null keys and values, any timestamp, any
partition, and every compression codec Kafka allows (none, gzip, snappy, lz4, zstd). The codecs are written in
their simplest valid form (gzip by zlib; snappy literals in xerial framing; lz4 frames of uncompressed blocks; zstd
frames of raw blocks), so no compression library is needed here and the broker (Java) decodes every one of them,
while a consumer without the codec's library (aiokafka without cramjam) cannot read the batch.

Independent of aiokafka's record code on purpose: its own CRC-32C, varints and layout (the Kafka protocol's
"Record Batch" and "Record" definitions).
"""

from __future__ import annotations

import asyncio
import gzip
import struct
from collections.abc import Sequence
from dataclasses import dataclass

CODECS = {"none": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}
LOG_APPEND_TIME_ATTR = 0x08  # attributes bit 3 (the broker sets it on a LogAppendTime topic)

# -- CRC-32C (Castagnoli), table driven -----------------------------------------------------------------------------

_CRC_TABLE: list[int] = []
for _n in range(256):
    _c = _n
    for _ in range(8):
        _c = (_c >> 1) ^ 0x82F63B78 if _c & 1 else _c >> 1
    _CRC_TABLE.append(_c)


def crc32c(data: bytes) -> int:
    crc = 0xFFFFFFFF
    table = _CRC_TABLE
    for b in data:
        crc = table[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


# -- varints (zigzag) -----------------------------------------------------------------------------------------------


def varint(n: int) -> bytes:
    """A zigzag varint (Kafka's varint and varlong alike)."""
    z = (n << 1) ^ (n >> 63)
    z &= (1 << 64) - 1
    out = bytearray()
    while z >= 0x80:
        out.append((z & 0x7F) | 0x80)
        z >>= 7
    out.append(z)
    return bytes(out)


def _sized(data: bytes | None) -> bytes:
    return varint(-1) if data is None else varint(len(data)) + data


# -- records and batches --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RawRecord:
    """One record as a producer writes it: every field any bytes."""

    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[bytes, bytes | None], ...] = ()
    timestamp_delta: int = 0


def record_bytes(rec: RawRecord, offset_delta: int) -> bytes:
    body = (
        b"\x00"
        + varint(rec.timestamp_delta)
        + varint(offset_delta)
        + _sized(rec.key)
        + _sized(rec.value)
        + varint(len(rec.headers))
        + b"".join(varint(len(name)) + name + _sized(value) for name, value in rec.headers)
    )
    return varint(len(body)) + body


def record_batch(records: Sequence[RawRecord], codec: str = "none", base_timestamp: int = 0) -> bytes:
    """One record batch (magic 2) of ``records`` compressed with ``codec``; base offset 0 (the broker assigns)."""
    if not records:
        raise ValueError("a record batch holds at least one record")
    body = b"".join(record_bytes(r, i) for i, r in enumerate(records))
    body = COMPRESS[codec](body)
    max_ts = base_timestamp + max(r.timestamp_delta for r in records)
    after_crc = (
        struct.pack(">hiqqqhi", CODECS[codec], len(records) - 1, base_timestamp, max_ts, -1, -1, -1)
        + struct.pack(">i", len(records))
        + body
    )
    tail = struct.pack(">ibI", -1, 2, crc32c(after_crc)) + after_crc  # partition leader epoch, magic, crc
    return struct.pack(">qi", 0, len(tail)) + tail


# -- the codecs in their simplest valid form -------------------------------------------------------------------------


def _gzip(data: bytes) -> bytes:
    return gzip.compress(data, mtime=0)


def _snappy_raw(data: bytes) -> bytes:
    """A raw snappy block of literals only."""
    out = bytearray(varint_unsigned(len(data)))
    for i in range(0, len(data), 65536):
        chunk = data[i : i + 65536]
        n = len(chunk) - 1
        if n < 60:
            out.append(n << 2)
        elif n < 256:
            out += bytes([60 << 2, n])
        else:
            out += bytes([61 << 2]) + struct.pack("<H", n)
        out += chunk
    return bytes(out)


def varint_unsigned(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _snappy(data: bytes) -> bytes:
    """Xerial framing (Kafka's Java producer and consumer use it): a header, then (length, raw snappy block)s."""
    out = bytearray(b"\x82SNAPPY\x00" + struct.pack(">ii", 1, 1))
    for i in range(0, max(len(data), 1), 32768):
        block = _snappy_raw(data[i : i + 32768])
        out += struct.pack(">i", len(block)) + block
    return bytes(out)


_P1, _P2, _P3, _P4, _P5 = 2654435761, 2246822519, 3266489917, 668265263, 374761393
_M32 = 0xFFFFFFFF


def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (32 - r))) & _M32


def xxh32(data: bytes, seed: int = 0) -> int:
    """XXH32 (the LZ4 frame's header checksum)."""
    n, i = len(data), 0
    if n >= 16:
        v = [(seed + _P1 + _P2) & _M32, (seed + _P2) & _M32, seed & _M32, (seed - _P1) & _M32]
        while i + 16 <= n:
            for k in range(4):
                lane = struct.unpack_from("<I", data, i + 4 * k)[0]
                v[k] = (_rotl((v[k] + lane * _P2) & _M32, 13) * _P1) & _M32
            i += 16
        h = (_rotl(v[0], 1) + _rotl(v[1], 7) + _rotl(v[2], 12) + _rotl(v[3], 18)) & _M32
    else:
        h = (seed + _P5) & _M32
    h = (h + n) & _M32
    while i + 4 <= n:
        h = (_rotl((h + struct.unpack_from("<I", data, i)[0] * _P3) & _M32, 17) * _P4) & _M32
        i += 4
    while i < n:
        h = (_rotl((h + data[i] * _P5) & _M32, 11) * _P1) & _M32
        i += 1
    h ^= h >> 15
    h = (h * _P2) & _M32
    h ^= h >> 13
    h = (h * _P3) & _M32
    h ^= h >> 16
    return h


def _lz4(data: bytes) -> bytes:
    """An LZ4 frame of uncompressed blocks (no checksums): magic, FLG (version 1, independent blocks), BD (64 KiB
    blocks), the header checksum, blocks with the 'uncompressed' bit, the end mark."""
    flg, bd = 0x60, 0x40
    out = bytearray(struct.pack("<I", 0x184D2204) + bytes([flg, bd, (xxh32(bytes([flg, bd])) >> 8) & 0xFF]))
    for i in range(0, len(data), 65536):
        block = data[i : i + 65536]
        out += struct.pack("<I", len(block) | 0x80000000) + block
    return bytes(out + struct.pack("<I", 0))


def _zstd(data: bytes) -> bytes:
    """A zstd frame of raw blocks: magic, a single-segment header with an 8-byte content size, raw blocks."""
    out = bytearray(struct.pack("<I", 0xFD2FB528) + bytes([0xE0]) + struct.pack("<Q", len(data)))
    chunks = [data[i : i + 131072] for i in range(0, len(data), 131072)] or [b""]
    for k, chunk in enumerate(chunks):
        last = 1 if k == len(chunks) - 1 else 0
        header = last | (0 << 1) | (len(chunk) << 3)  # block type 0: raw
        out += struct.pack("<I", header)[:3] + chunk
    return bytes(out)


COMPRESS = {"none": lambda d: d, "gzip": _gzip, "snappy": _snappy, "lz4": _lz4, "zstd": _zstd}


# -- sending --------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Produced:
    """What the broker said of one batch: its error code (0: appended) and the offset of its first record."""

    error_code: int
    base_offset: int


async def send_batches(
    bootstrap: str, batches: Sequence[tuple[str, int, bytes]], timeout_s: float = 30.0
) -> list[Produced]:
    """Send each (topic, partition, batch bytes) in its own Produce request (acks=all) to the partition's leader, in
    order; the broker's answer for each."""
    from aiokafka import AIOKafkaClient, TopicPartition
    from aiokafka.protocol.produce import ProduceRequest

    client = AIOKafkaClient(bootstrap_servers=bootstrap, request_timeout_ms=int(timeout_s * 1000))
    out: list[Produced] = []
    try:
        await client.bootstrap()
        await client.force_metadata_update()
        for topic, partition, batch in batches:
            leader = client.cluster.leader_for_partition(TopicPartition(topic, partition))
            if leader is None or leader < 0:
                await client.force_metadata_update()
                leader = client.cluster.leader_for_partition(TopicPartition(topic, partition))
            request = ProduceRequest(None, -1, int(timeout_s * 1000), [(topic, [(partition, batch)])])
            response = await client.send(leader, request)
            for _topic, parts in response.topics:
                for part in parts:
                    out.append(Produced(int(part[1]), int(part[2])))
    finally:
        await client.close()
    return out


def produce(bootstrap: str, batches: Sequence[tuple[str, int, bytes]]) -> list[Produced]:
    """send_batches from synchronous code; asserts that the broker appended every batch."""
    got = asyncio.run(send_batches(bootstrap, batches))
    assert [p.error_code for p in got] == [0] * len(batches), got
    return got
