"""Codec benchmark: log lines/s encoded and decoded, batched vs one message per line (baseline)."""

from __future__ import annotations

import random
import statistics
import sys
import time
from pathlib import Path

from flightrec.schemas import LogBatch, decode_record, default_codec, encode, new_event_id, now_us
from flightrec.schemas.logcolumns import LogColumns

sys.path.insert(0, str(Path(__file__).parent))
import record  # noqa: E402 - benchmarks/ on the path first

LINES = 200_000
BATCH = 256
REPEATS = 5


def make_lines(n: int) -> list[str]:
    rnd = random.Random(7)
    words = ["proof", "cuda", "warmup", "kernel", "ms", "ok", "gpu0", "sha256", "ntt", "batch", "queue", "daemon"]
    return [f"2026-12-02T13:{i % 60:02d}:00Z INFO prover: " + " ".join(rnd.choices(words, k=10)) for i in range(n)]


def batches(lines: list[str], size: int) -> list[LogBatch]:
    out = []
    ts = now_us()
    for start in range(0, len(lines), size):
        chunk = lines[start : start + size]
        n = len(chunk)
        out.append(
            LogBatch(
                event_id=new_event_id(),
                instance_id="bench-1",
                boot_id="boot",
                seq=len(out),
                ts_us=ts,
                stage="benchmark",
                source="stdout",
                pid=1,
                line_no=list(range(start + 1, start + n + 1)),
                line_ts_us=[ts] * n,
                text=chunk,
                truncated=[False] * n,
                invalid_utf8=[False] * n,
            )
        )
    return out


def rate(fn, items, lines: int) -> float:
    samples = []
    for _ in range(REPEATS):
        t = time.perf_counter()
        fn(items)
        samples.append(lines / (time.perf_counter() - t))
    return statistics.median(samples)


def main() -> None:
    default_codec()
    lines = make_lines(LINES)
    batched, single = batches(lines, BATCH), batches(lines[: LINES // 4], 1)
    enc_b = rate(lambda xs: [encode(x) for x in xs], batched, LINES)
    enc_s = rate(lambda xs: [encode(x) for x in xs], single, LINES // 4)
    msgs_b, msgs_s = [encode(x) for x in batched], [encode(x) for x in single]
    dec_b = rate(lambda ms: [decode_record(m) for m in ms], msgs_b, LINES)
    dec_s = rate(lambda ms: [decode_record(m) for m in ms], msgs_s, LINES // 4)
    print(f"codec, one core, {LINES} lines of ~{sum(map(len, lines)) // LINES} bytes, median of {REPEATS}")
    print(f"{'':28}{'batched (' + str(BATCH) + '/msg)':>22}{'baseline (1/msg)':>20}{'ratio':>8}")
    print(f"{'encode lines/s':28}{enc_b:22,.0f}{enc_s:20,.0f}{enc_b / enc_s:8.1f}x")
    print(f"{'decode lines/s':28}{dec_b:22,.0f}{dec_s:20,.0f}{dec_b / dec_s:8.1f}x")
    columns = LogColumns()
    assert all(columns(m) is not None for m in msgs_b)  # every batched message takes the columnar path
    dec_c = rate(lambda ms: [columns(m) for m in ms], msgs_b, LINES)
    print(f"{'decode to columns lines/s':28}{dec_c:22,.0f}{'':20}{dec_c / dec_b:8.1f}x decode_record (the consumers')")
    print(
        f"goal >= 300,000 lines/s each way: encode {'met' if enc_b >= 3e5 else 'NOT met'}, "
        f"decode {'met' if dec_b >= 3e5 else 'NOT met'}"
    )
    _record(sum(map(len, lines)) // LINES, enc_b, enc_s, dec_b, dec_s, dec_c)


def _record(size: int, enc_b: float, enc_s: float, dec_b: float, dec_s: float, dec_c: float) -> None:
    def goal(rate: float) -> str:
        return "goal >= 300,000 per core: " + ("met" if rate >= 3e5 else "not met")

    record.write(
        "bench_codec",
        "Codec",
        f"Avro single-object encoding (fastavro), {LINES:,} log lines of ~{size} bytes, one core, median of "
        f"{REPEATS} runs; batched: a LogBatch of {BATCH} lines per message; the baseline: one LogBatch per line.",
        [
            record.Figure(
                "encode, lines/s, batched",
                f"{enc_b:,.0f}",
                f"{enc_s:,.0f} (1 line/msg)",
                f"{enc_b / enc_s:.1f}x; {goal(enc_b)}",
            ),
            record.Figure(
                "decode (`decode_record`), lines/s, batched",
                f"{dec_b:,.0f}",
                f"{dec_s:,.0f} (1 line/msg)",
                f"{dec_b / dec_s:.1f}x; {goal(dec_b)}",
            ),
            record.Figure(
                "decode to columns (`schemas/logcolumns.py`, the consumers' fold), lines/s",
                f"{dec_c:,.0f}",
                f"`decode_record` {dec_b:,.0f}",
                f"{dec_c / dec_b:.1f}x",
            ),
        ],
    )


if __name__ == "__main__":
    main()
