"""Floors for the agent benchmark: the least a Python process needs to ship FILE's lines to Kafka like the agent.

Run by `bench_agent.py` (not a benchmark of its own): ``python agent_floor.py MODE FILE TOPIC KEY`` with the
agent's settings in the environment (FLIGHTREC_BOOTSTRAP...), the same producer options as the agent (acks=all,
idempotent, ``producer_kwargs``). Modes, each adding to the one before:

- ``raw``: FILE's bytes in ~1 MB messages, nothing per line: what Python, asyncio and aiokafka cost.
- ``events``: FILE's lines as LogBatch events (lines split, one read time per read, the agent's encoder): what
  the event format costs on top.
- ``passthrough``: the lines read from `cat FILE`'s pipe (1 MiB reads, the agent's pipe size) and passed through
  to stdout byte for byte, as the agent reads its command's output.
- ``scrubbed``: each read scanned by the secret fast path (the built-in shapes; no line here needs masking).
- ``durable``: each batch written to a spool file as the agent frames it (length, crc32) and produced once
  fdatasync'd (in a thread, while the next batch is read): all the agent's guarantees, done the simplest way.

No line cut at 64 KiB, no seq kept on disk, no retention, no outage handling, no stage events, one thread: a
floor, not an agent.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import subprocess
import sys
import tempfile
import time
import uuid
import zlib
from collections.abc import Iterator
from typing import Any

from aiokafka import AIOKafkaProducer
from flightrec.producer.deliver import producer_kwargs

from flightrec.settings import Settings

READ = 1 << 20
BATCH_BYTES = 768 * 1024  # a batch's text, its Avro within the stock 1 MB message limit


MODES = ("raw", "events", "passthrough", "scrubbed", "durable")


async def ship(mode: str, path: str, topic: str, key: bytes) -> None:
    """FILE's content to ``topic`` under ``key``, every message acknowledged (acks=all) when it returns."""
    producer = AIOKafkaProducer(**producer_kwargs(Settings.from_env(os.environ)))
    await producer.start()
    try:
        if mode == "raw":
            pending = [await producer.send(topic, chunk, key=key) for chunk in _chunks(path)]
        else:
            pending = await _events(mode, path, topic, key, producer)
        await asyncio.gather(*pending)
    finally:
        await producer.stop()


def _chunks(path: str) -> Iterator[bytes]:
    with open(path, "rb", buffering=0) as f:
        while chunk := f.read(READ - 64 * 1024):
            yield chunk


async def _events(mode: str, path: str, topic: str, key: bytes, producer: AIOKafkaProducer) -> list[Any]:
    from flightrec.producer.redact import Redactor
    from flightrec.producer.shapes import builtin_shapes
    from flightrec.schemas import LogBatch
    from flightrec.schemas.fastlog import encode_fast

    level = MODES.index(mode)
    piped, scrubbed, durable = level >= 2, level >= 3, level >= 4
    redactor = Redactor(shapes=builtin_shapes()) if scrubbed else None  # built only where used: a floor does no more
    child = subprocess.Popen(["cat", path], stdout=subprocess.PIPE) if piped else None
    if child is not None and child.stdout is not None:
        src = child.stdout.fileno()
        fcntl.fcntl(src, 1031, READ)  # F_SETPIPE_SZ, as the agent sets it
    else:
        src = os.open(path, os.O_RDONLY)
    spool_dir = os.environ.get("FLIGHTREC_SPOOL") or None  # the agent's spool's disk
    if durable and spool_dir:
        os.makedirs(spool_dir, exist_ok=True)
    with contextlib.ExitStack() as stack:
        spool = None
        if durable:  # a file deleted once closed
            spool = stack.enter_context(tempfile.NamedTemporaryFile(prefix="floor-spool-", dir=spool_dir))
        loop = asyncio.get_running_loop()
        syncing: asyncio.Future | None = None
        inst, boot = key.decode(), str(uuid.uuid4())
        pending, rest, texts, encoded, seq, line_no = [], b"", [], [], 0, 0
        size = 0
        unsynced: list[bytes] = []

        async def settle() -> None:
            nonlocal syncing
            if syncing is not None:
                await syncing
                syncing = None
            for value in unsynced:
                pending.append(await producer.send(topic, value, key=key))
            unsynced.clear()

        async def flush() -> None:
            nonlocal texts, encoded, seq, line_no, size, syncing
            n = len(encoded)
            ts = time.time_ns() // 1000
            ev = LogBatch(
                event_id=str(uuid.uuid4()),
                instance_id=inst,
                boot_id=boot,
                seq=seq,
                ts_us=ts,
                stage="cat",
                source="stdout",
                pid=0,
                line_no=range(line_no, line_no + n),
                line_ts_us=[ts] * n,
                text=texts,
                truncated=[False] * n,
                invalid_utf8=[False] * n,
            )
            value = encode_fast(ev, encoded)
            if spool is not None:  # durable: written, produced once fdatasync'd (synced while the next batch is read)
                spool.write(len(value).to_bytes(4, "little") + zlib.crc32(value).to_bytes(4, "little") + value)
                spool.flush()
                await settle()
                unsynced.append(value)
                syncing = loop.run_in_executor(None, os.fdatasync, spool.fileno())
            else:
                pending.append(await producer.send(topic, value, key=key))
            seq, line_no, texts, encoded, size = seq + 1, line_no + n, [], [], 0

        while data := os.read(src, READ):
            if piped:
                view = memoryview(data)
                while view:
                    view = view[os.write(1, view) :]
            if redactor is not None:
                redactor.may_need(rest, data)  # no line here needs masking: the answer is the fast path's cost
            data = rest + data
            cut = data.rfind(b"\n") + 1
            rest, start = data[cut:], 0
            while start < cut:  # the read's lines in batches of at most BATCH_BYTES
                end = data.rfind(b"\n", start, start + BATCH_BYTES - size) + 1 or cut
                block = data[start:end]
                encoded.extend(block.split(b"\n")[:-1])
                texts.extend(block.decode().split("\n")[:-1])
                size += end - start
                start = end
                if size >= BATCH_BYTES // 2:
                    await flush()
        if encoded:
            await flush()
        await settle()
        if child is not None:
            child.wait()
        else:
            os.close(src)
        return pending


if __name__ == "__main__":
    mode, path, topic, key = sys.argv[1:5]
    if mode not in MODES:
        sys.exit(f"MODE must be one of {', '.join(MODES)}, not {mode!r}")
    asyncio.run(ship(mode, path, topic, key.encode()))
