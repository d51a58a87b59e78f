"""Micro-benchmark of secret masking on 1M log lines: the fast path's test, the masking pass, the line batcher."""

from __future__ import annotations

import argparse
import inspect
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

from flightrec.producer import open_agent
from flightrec.producer.batcher import SourceBatcher
from flightrec.producer.redact import Redactor

from flightrec.settings import Settings

sys.path.insert(0, str(Path(__file__).resolve().parent))
import record  # noqa: E402 - benchmarks/ on the path first

try:  # absent from the code before secret shapes: then only the configurations without shapes are measured
    from flightrec.producer.shapes import builtin_shapes
except ImportError:
    builtin_shapes = None

READ = 1 << 20  # what the agent reads from a pipe or a file at most at once (producer/run.py CHUNK)
NAMES = {"API_TOKEN": "tok-9f8e7d6c5b4a39281706", "DB_PASSWORD": "correct-horse-battery-staple"}


def bench_lines(n: int) -> list[str]:
    """The agent benchmark's line (benchmarks/bench_agent.py), numbered."""
    return [f"{i:07d} worker 3: batch done msm=ok ntt=ok elapsed_ms=12.5" for i in range(n)]


def mixed_lines(n: int, seed: int = 1) -> list[str]:
    """A proving machine's output: progress, structured and JSON logs, CUDA allocator lines, hashes, UUIDs,
    base64 blobs, a download bar; none holds a secret (so each read may take the fast path)."""
    rnd = random.Random(seed)

    def hexs(k: int) -> str:
        return "".join(rnd.choice("0123456789abcdef") for _ in range(k))

    out = []
    for i in range(n):
        k = rnd.random()
        ts = f"2026-12-03T10:{(i // 600) % 60:02d}:{(i // 10) % 60:02d}.{i % 1000000:06d}Z"
        if k < 0.35:
            out.append(f"{i:07d} worker {i % 8}: batch done msm=ok ntt=ok elapsed_ms={rnd.random() * 50:.1f}")
        elif k < 0.55:
            out.append(f"{ts} INFO  prover::gpu: proof {i} verified in {rnd.random() * 900:.1f}ms root=0x{hexs(64)}")
        elif k < 0.7:
            out.append(
                f'{{"ts":"{ts}","level":"info","msg":"proof done","proof_id":"{hexs(8)}-{hexs(4)}-{hexs(4)}-'
                f'{hexs(4)}-{hexs(12)}","gpu":{i % 8},"duration_ms":{rnd.random() * 90:.2f}}}'
            )
        elif k < 0.8:
            out.append(
                f"I1203 10:15:32.{i % 1000000:06d} {1000 + i % 50} cuda_alloc.cc:{100 + i % 400}] cudaMalloc "
                f"{rnd.randint(1, 1 << 30)} bytes on device {i % 8} (free {rnd.randint(1, 80)} GiB)"
            )
        elif k < 0.9:
            out.append(
                f"[{ts}] DEBUG scheduler: queue depth={rnd.randint(0, 500)} inflight={rnd.randint(0, 64)} "
                f"rate={rnd.random() * 400:.1f}/h commit {hexs(40)} blob={hexs(24)}"
            )
        else:
            out.append(
                f"Downloading params {rnd.randint(0, 100)}% |{'#' * rnd.randint(0, 30)}| "
                f"{rnd.random() * 3:.1f}G/2.7G eta {rnd.randint(0, 600)}s"
            )
    return out


# streams whose every line holds a needle (so every read takes the masking pass): the worst cases
HOT = [
    "step {i} token count: 512 of 4096",
    '{{"ts":1,"msg":"ok","token":"t-{i}"}}',
    "user {i}: password reset email sent",
    "GET https://u:p@example.com/api/v1/items/{i} 200 12ms",
    '{{"access_token":"abcdefgh{i}"}}',
]


def reads(data: bytes) -> list[bytes]:
    return [data[i : i + READ] for i in range(0, len(data), READ)]


def cpu(fn: Callable[[], object], runs: int) -> float:
    """Median CPU seconds of ``fn`` (this process, user + system)."""
    times = []
    for _ in range(runs):
        t = time.process_time()
        fn()
        times.append(time.process_time() - t)
    return statistics.median(times)


def configurations(
    shapes_too: bool, baseline: str | None = None
) -> dict[str, tuple[list[str], dict[str, str], str | None]]:
    """name -> (FLIGHTREC_REDACT names, environment, FLIGHTREC_SECRET_SHAPES: None built-in, "off", or a file whose
    shapes replace the built-in list: --baseline-shapes, an earlier list measured in the same run)."""
    out = {"nothing named, no shapes": ([], {}, "off"), "2 named secrets, no shapes": (list(NAMES), NAMES, "off")}
    if shapes_too:
        out["built-in shapes (the default)"] = ([], {}, None)
        out["built-in shapes + 2 named secrets"] = (list(NAMES), NAMES, None)
    if baseline:
        out["baseline shapes (--baseline-shapes)"] = ([], {}, baseline)
    return out


def _shapes(shapes: str | None) -> tuple:
    if shapes is None:
        return builtin_shapes()
    if shapes == "off":
        return ()
    from pathlib import Path

    from flightrec.producer.shapes import parse_shapes

    return parse_shapes(Path(shapes).read_text("utf-8"), shapes).shapes


def redactor(names: list[str], env: dict[str, str], shapes: str | None) -> Redactor:
    if "shapes" in inspect.signature(Redactor).parameters:
        return Redactor(names, env, shapes=_shapes(shapes))
    return Redactor(names, env)


def may_need_all(r: Redactor, chunks: list[bytes]) -> int:
    carried = "carry" in inspect.signature(r.may_need).parameters
    n = 0
    for c in chunks:
        n += bool(r.may_need(b"", c, None) if carried else r.may_need(b"", c))
    return n


def stream_all(r: Redactor, lines: list[str]) -> None:
    step = 16384  # lines per call: about what one 1 MiB read holds
    if hasattr(r, "stream"):
        carry = None
        for i in range(0, len(lines), step):
            _, carry = (
                r.stream(lines[i : i + step], None, carry) if carry is not None else r.stream(lines[i : i + step])
            )
    else:
        for i in range(0, len(lines), step):
            r.lines(lines[i : i + step])


def batcher_all(names: list[str], env: dict[str, str], shapes: str | None, chunks: list[bytes]) -> None:
    fields = {"redact": tuple(names)}
    if "secret_shapes" in inspect.signature(Settings).parameters:
        fields["secret_shapes"] = shapes
    with tempfile.TemporaryDirectory(prefix="bench-redact-") as tmp:
        settings = Settings(instance="bench", spool=tmp, **fields)
        with open_agent("bench", settings, deliver=False, env=env) as agent:
            b = SourceBatcher(agent.line_sink(), "s", "stdout", 1, max_line=65536, tail_lines=100)
            for c in chunks:
                b.feed(c)
            b.close()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--lines", type=int, default=1_000_000, help="lines per corpus (default 1,000,000)")
    p.add_argument("--runs", type=int, default=5, help="runs of each figure; the median is shown (default 5)")
    p.add_argument("--no-batcher", action="store_true", help="skip the batcher figures (they write a spool)")
    p.add_argument(
        "--baseline-shapes",
        metavar="TOML",
        help="also measure this shapes file in place of the built-in list (an earlier list: `git show "
        "REV:producer/secret_shapes.toml > old.toml`), in the same run",
    )
    args = p.parse_args()
    corpora = {"bench_agent's line": bench_lines(args.lines), "mixed realistic lines": mixed_lines(args.lines)}
    configs = configurations(builtin_shapes is not None, args.baseline_shapes)
    print(
        f"{args.lines:,} lines per corpus, read {READ >> 20} MiB at a time; CPU seconds, median of {args.runs}; "
        f"{os.cpu_count()} cores; code: {os.path.dirname(inspect.getfile(Redactor))}",
        flush=True,
    )
    ms: dict[str, list[tuple[float, float, float]]] = {name: [] for name in configs}  # per corpus, ms per MiB
    for cname, lines in corpora.items():
        data = ("\n".join(lines) + "\n").encode()
        chunks = reads(data)
        mib = len(data) / (1 << 20)
        print(f"\n{cname}: {mib:.1f} MiB")
        print(
            f"{'configuration':36} {'may_need (fast test)':>22} {'reads slow':>10} {'stream (mask pass)':>20} "
            f"{'batcher feed+close':>20}"
        )
        for name, (names, env, shapes) in configs.items():
            r = redactor(names, env, shapes)
            slow = may_need_all(r, chunks)
            t_need = cpu(partial(may_need_all, r, chunks), args.runs)
            t_stream = cpu(partial(stream_all, r, lines), args.runs)
            # the batcher takes its shapes from the setting, which merges a file with the built-in list: not a baseline
            batcher = not args.no_batcher and shapes != args.baseline_shapes
            t_batch = cpu(partial(batcher_all, names, env, shapes, chunks), args.runs) if batcher else 0.0
            print(
                f"{name:36} {t_need:8.3f} s {t_need / mib * 1e3:6.2f} ms/MiB {slow:4d}/{len(chunks):<5d} "
                f"{t_stream:8.3f} s {t_stream / mib * 1e3:6.2f}/MiB {t_batch:8.3f} s {t_batch / mib * 1e3:6.2f}/MiB",
                flush=True,
            )
            ms[name].append((t_need / mib * 1e3, t_stream / mib * 1e3, t_batch / mib * 1e3))
    _record(args.lines, args.runs, ms)
    if builtin_shapes is not None:
        print(f"\nevery line holds a needle ({args.lines:,} lines each): the masking pass, CPU ms per MiB")
        for template in HOT:
            lines = [template.format(i=i) for i in range(args.lines)]
            mib = len("\n".join(lines)) / (1 << 20)
            with_shapes, without = redactor([], {}, None), redactor([], {}, "off")
            t_with = cpu(partial(stream_all, with_shapes, lines), args.runs)
            t_without = cpu(partial(stream_all, without, lines), args.runs)
            base = ""
            if args.baseline_shapes:
                t_base = cpu(partial(stream_all, redactor([], {}, args.baseline_shapes), lines), args.runs)
                base = f"   baseline {t_base / mib * 1e3:6.1f}"
            print(
                f"  {template[:44]:46} built-in shapes {t_with / mib * 1e3:6.1f}{base}   none "
                f"{t_without / mib * 1e3:6.1f}  (first line out: {with_shapes.lines(lines[:1])[0][:48]})",
                flush=True,
            )
    return 0


def _record(lines: int, runs: int, ms: dict[str, list[tuple[float, float, float]]]) -> None:
    """One row per configuration and pass (the fast test, the masking pass, the batcher): the two corpora's ms/MiB."""
    base = ms.pop("baseline shapes (--baseline-shapes)", None)
    figures = []
    for i, what in enumerate(("`may_need` (fast test)", "masking pass (`Redactor.stream`)", "batcher feed + close")):
        for name, per_corpus in ms.items():
            if not per_corpus[0][i] or (
                i and name not in ("nothing named, no shapes", "built-in shapes (the default)")
            ):
                continue  # not measured (--no-batcher); the passes after the fast test: the two ends only
            value = " / ".join(f"{c[i]:.2f}" for c in per_corpus)
            baseline = record.NO_BASELINE
            if base is not None and name == "built-in shapes (the default)" and base[0][i]:
                baseline = "the --baseline-shapes list: " + " / ".join(f"{c[i]:.2f}" for c in base)
            figures.append(record.Figure(f"{what}, {name}", value, baseline))
    record.write(
        "bench_redact",
        "Secret masking",
        f"{lines:,} lines per corpus in {READ >> 20} MiB reads: the agent benchmark's line / a realistic proving "
        f"machine's mix (no secret); CPU ms per MiB, median of {runs}. `--baseline-shapes`: an earlier shapes list, "
        "measured in the same run with the same code.",
        figures,
    )


if __name__ == "__main__":
    sys.exit(main())
