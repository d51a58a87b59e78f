"""Benchmark of the single-file agent (`make agent-binary`) against the pip-installed agent in the same run: file size,
`run -- true` start to exit, shipping 1M lines, what is left in its TMPDIR, and the newest glibc symbol it needs."""

from __future__ import annotations

import argparse
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from flightrec.broker import LocalBroker
from flightrec.broker.local import free_port

from flightrec.settings import Settings

sys.path.insert(0, str(Path(__file__).resolve().parent))
import record  # noqa: E402 - benchmarks/ on the path first

ROOT = Path(__file__).resolve().parents[1]
BINARY = ROOT / "dist" / "flightrec-agent"
PIP_AGENT = str(Path(sys.executable).parent / "flightrec-agent")  # the console script: the same argv
SIZE_MB, START_RATIO, SHIP_RATIO = 40.0, 1.5, 1.0  # the budgets of issue #25


CPU: dict[str, list[float]] = {}  # argv[0] -> CPU seconds (user + system) of each run, its children included


def timed(argv: list[str], env: dict[str, str]) -> float:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    p = subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    took = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    CPU.setdefault(argv[0], []).append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
    if p.returncode != 0:
        raise RuntimeError(f"{argv[0]} exited {p.returncode}: {p.stderr.decode()[-1500:]}")
    return took


def pairs(argv: list[str], runs: int, env: dict[str, str]) -> tuple[list[float], list[float]]:
    """``runs`` alternating runs of the single file and the pip agent (a shared machine's load varies)."""
    binary, pip = [], []
    for _ in range(runs):
        binary.append(timed([str(BINARY), *argv], env))
        pip.append(timed([PIP_AGENT, *argv], env))
    return binary, pip


def newest_glibc(binary: Path) -> tuple[str, str]:
    """The newest GLIBC_ symbol version the loader and every bundled library need, and which file needs it."""
    from PyInstaller.archive.readers import CArchiveReader

    def key(version: str) -> tuple[int, ...]:
        return tuple(int(x) for x in version.split("."))

    best = ("0", "")
    with tempfile.TemporaryDirectory() as tmp:
        files = [(binary.name, binary)]
        reader = CArchiveReader(str(binary))
        for name in reader.toc:
            if ".so" in name:
                out = Path(tmp) / name.replace("/", "_")
                out.write_bytes(reader.extract(name))
                files.append((name, out))
        for name, path in files:
            syms = subprocess.run(["objdump", "-T", str(path)], capture_output=True, text=True).stdout
            for v in set(re.findall(r"GLIBC_(\d+(?:\.\d+)+)", syms)):
                if key(v) > key(best[0]):
                    best = (v, name)
    return best


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=11, help="alternating pairs of `run -- true` (default 11)")
    ap.add_argument("--lines", type=int, default=1_000_000, help="lines shipped from a file (default 1,000,000)")
    ap.add_argument("--ship-runs", type=int, default=11, help="alternating pairs of the shipping run (default 11)")
    args = ap.parse_args()
    subprocess.run([sys.executable, str(ROOT / "scripts" / "agent_binary.py"), "--if-stale"], check=True)
    size = BINARY.stat().st_size / 1e6
    glibc, needs_it = newest_glibc(BINARY)
    with tempfile.TemporaryDirectory(prefix="flightrec-bench-binary-") as tmp_s:
        tmp = Path(tmp_s)
        unpack = tmp / "tmpdir"  # the single file unpacks here (TMPDIR): what is left after every run counts
        unpack.mkdir()
        broker = LocalBroker(port=free_port(), data=tmp / "kafka", settings=Settings.from_env({}))
        broker.start()
        try:
            env = dict(
                os.environ,
                TMPDIR=str(unpack),
                FLIGHTREC_BOOTSTRAP=broker.bootstrap,
                FLIGHTREC_SPOOL=str(tmp / "spool"),
                FLIGHTREC_FLUSH_TIMEOUT="60",
                FLIGHTREC_LOG_LEVEL="WARNING",
            )
            env["FLIGHTREC_INSTANCE"] = f"bench-warm-{uuid.uuid4().hex[:6]}"
            pairs(["run", "--stage", "warm", "--", "true"], 1, env)  # topics made, caches warm
            start_b, start_p = pairs(["run", "--stage", "s", "--", "true"], args.runs, env)
            data = tmp / "lines.txt"
            with data.open("w") as f:
                for i in range(args.lines):
                    f.write(f"{i:07d} worker 3: batch done msm=ok ntt=ok elapsed_ms=12.5\n")
            CPU.clear()
            ship_b, ship_p = pairs(["run", "--stage", "ship", "--", "cat", str(data)], args.ship_runs, env)
            left = sorted(p.name for p in unpack.iterdir())
        finally:
            broker.stop()
    sb, sp = statistics.median(start_b), statistics.median(start_p)
    hb, hp = statistics.median(ship_b), statistics.median(ship_p)
    cb, cp = statistics.median(CPU[str(BINARY)]), statistics.median(CPU[PIP_AGENT])
    rows = [
        ("file size", f"{size:.1f} MB", "-", f"<= {SIZE_MB:.0f} MB", size <= SIZE_MB),
        (
            f"`run --stage s -- true`, Kafka up, median of {args.runs} pairs",
            f"{sb:.3f} s ({min(start_b):.2f}-{max(start_b):.2f})",
            f"{sp:.3f} s ({min(start_p):.2f}-{max(start_p):.2f})",
            f"<= {START_RATIO}x: {sb / sp:.2f}x",
            sb <= START_RATIO * sp,
        ),
        (
            f"`run -- cat FILE`, {args.lines:,} lines to Kafka (acked), median of {args.ship_runs} pairs",
            f"{hb:.2f} s (fastest {min(ship_b):.2f})",
            f"{hp:.2f} s (fastest {min(ship_p):.2f})",
            f"<= {SHIP_RATIO}x: {hb / hp:.2f}x",
            hb <= SHIP_RATIO * hp * 1.05,  # 5%: the noise of a shared machine between two equal programs
        ),
        ("same, CPU (user + system) of the agent, median", f"{cb:.2f} s", f"{cp:.2f} s", f"{cb / cp:.2f}x", True),
        (f"left in TMPDIR after {2 + args.runs + args.ship_runs} runs", str(len(left)), "-", "0", not left),
        ("newest glibc symbol needed", f"GLIBC_{glibc} ({needs_it})", "-", "stated", True),
    ]
    print(f"single-file agent {BINARY.relative_to(ROOT)} vs the pip-installed agent ({PIP_AGENT}), same run")
    print("| figure | single file | pip agent | budget |")
    print("| --- | ---: | ---: | --- |")
    for name, b, p, budget, ok in rows:
        print(f"| {name} | {b} | {p} | {budget}: {'met' if ok else 'NOT met'} |")
    if left:
        print(f"left behind: {left}")
    record.write(
        "bench_agent_binary",
        "Single-file agent",
        "`dist/flightrec-agent` as `make agent-binary` builds it (PyInstaller onefile; docs/agent-binary.md) against "
        "the pip-installed `flightrec-agent`, alternating, one broker.",
        [
            record.Figure(
                name, b, f"pip agent {p}" if p != "-" else record.NO_BASELINE, f"{budget}: {'met' if ok else 'not met'}"
            )
            for name, b, p, budget, ok in rows
        ],
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
