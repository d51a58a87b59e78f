"""The spool's segment format (pure): a header line, then framed records ``len | crc32 | seq flags topic value``."""

from __future__ import annotations

import json
import struct
import zlib
from pathlib import Path
from typing import Iterator

from flightrec.errors import SpoolError

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
        header = json.loads(data[len(SEG_MAGIC):nl])
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
        topic = data[body_start + BODY.size:body_start + BODY.size + tlen].decode("utf-8")
        yield end, seq, flags, topic, data[body_start + BODY.size + tlen:end]
        pos = end
