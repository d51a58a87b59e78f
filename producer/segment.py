"""The spool's segment format: a header line, then framed records ``len | crc32 | seq flags topic value``; and
the records read back from segment files."""

from __future__ import annotations

import json
import logging
import struct
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from flightrec.errors import SpoolError

log = logging.getLogger(__name__)

SEG_MAGIC = b"FRSPOOL1\n"
REC = struct.Struct("<II")  # body length, crc32(body)
BODY = struct.Struct("<qBH")  # seq, flags, topic length


def parse_header(data: bytes, path: Path) -> tuple[dict, int]:
    """The JSON header of a segment that starts ``data``, and its length; SpoolError if it is not one."""
    if not data.startswith(SEG_MAGIC):
        raise SpoolError(f"{path} is not a flightrec spool segment (bad magic); move it out of the spool folder")
    nl = data.find(b"\n", len(SEG_MAGIC))
    if nl < 0:
        raise SpoolError(f"{path} has a torn header; delete it if it holds no records")
    try:
        header = json.loads(data[len(SEG_MAGIC) : nl])
    except ValueError as exc:
        raise SpoolError(f"{path} has an unreadable header: {exc}; move it out of the spool folder") from exc
    return header, nl + 1


def iter_records(data: bytes, start: int) -> Iterator[tuple[int, int, int, str, bytes]]:
    """Yield (offset after, seq, flags, topic, value) of each whole, intact record from ``start``.

    Stops at the first torn or corrupt record (a crash mid-write leaves one at the end).
    """
    pos = start
    n = len(data)
    view = memoryview(data)
    while pos + REC.size <= n:
        length, crc = REC.unpack_from(data, pos)
        body_start = pos + REC.size
        end = body_start + length
        if length < BODY.size or end > n:
            return
        if zlib.crc32(view[body_start:end]) != crc:  # no copy of the body to check it
            return
        seq, flags, tlen = BODY.unpack_from(data, body_start)
        topic = data[body_start + BODY.size : body_start + BODY.size + tlen].decode("utf-8")
        yield end, seq, flags, topic, data[body_start + BODY.size + tlen : end]
        pos = end


@dataclass(frozen=True, order=True)
class Position:
    """A place in the spool: segment number and byte offset; later places compare greater."""

    seg: int
    offset: int


@dataclass(frozen=True)
class Record:
    """One spooled event as it will be sent: topic, key, value; ``end`` is the position after it."""

    seq: int
    flags: int
    topic: str
    key: bytes
    value: bytes
    end: Position


HEAD_READ = 64 * 1024  # a segment's header is read from this much of its start


def read_records(
    segments: Iterable[tuple[int, Path]], instance_id: str, cursor: Position, end: Position, max_bytes: int
) -> tuple[list[Record], Position]:
    """Records of the numbered segment files from ``cursor`` up to ``end``, about ``max_bytes`` of values; and the
    new cursor. A missing segment is skipped; damage inside an older one skips its rest, said in the log."""
    out: list[Record] = []
    total = 0
    pos = cursor
    for n, path in segments:
        if n < pos.seg or n > end.seg:
            continue
        try:
            with open(path, "rb") as f:
                data = f.read(HEAD_READ)
                if len(data) == HEAD_READ and b"\n" not in data[len(SEG_MAGIC) :]:
                    data += f.read()  # a header longer than that (a very long instance id)
                header, header_len = parse_header(data, path)
                # from the cursor on: what was sent before is not read again
                base = max(pos.offset, header_len) if n == pos.seg else header_len
                f.seek(base)
                data = f.read() if n < end.seg else f.read(max(0, end.offset - base))
        except FileNotFoundError:
            continue
        key = str(header.get("instance_id", instance_id)).encode("utf-8")
        last = 0
        for rec_end, seq, flags, topic, value in iter_records(data, 0):
            last = rec_end
            out.append(Record(seq, flags, topic, key, value, Position(n, base + rec_end)))
            total += len(value)
            if total >= max_bytes:
                return out, Position(n, base + rec_end)
        last += base
        if n < end.seg:
            if last < base + len(data):  # damage inside an older segment: skip the rest of it, loudly
                log.error("spool %s: %d unreadable bytes at offset %d skipped", path, base + len(data) - last, last)
            pos = Position(n + 1, 0)
        else:
            pos = Position(n, last)
    return out, max(pos, cursor)
