"""Disk per log line, measured end to end: real agents print proving-daemon-like lines through Kafka into a new
database; bytes per line in the database file (checkpointed) and in Kafka's flightrec.logs segments. The figures
docs/operations.md ("Sizing") states, and its table is computed from.

Starts its own Kafka (LocalBroker, free port, temp data dir) and stops it. Run:
    PYTHONSAFEPATH=1 .venv/bin/python benchmarks/bench_sizing.py [--instances 4] [--lines 250000]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import duckdb
from flightrec.broker import LocalBroker
from flightrec.broker.local import free_port

from flightrec.settings import Settings

sys.path.insert(0, str(Path(__file__).resolve().parent))
import record  # noqa: E402 - benchmarks/ on the path first

# A proving daemon's lines: a time stamp, a level, a component and a message with numbers that change (so the
# columns do not compress to nothing, as real logs do not).
CHILD = r"""
import sys, random
random.seed(int(sys.argv[2]))
w = sys.stdout.write
for i in range(int(sys.argv[1])):
    s, ms = divmod(i * 37, 1000)
    kind = i % 10
    if kind < 6:
        w(f"2026-12-06T12:{(s // 60) % 60:02d}:{s % 60:02d}.{ms:03d}Z INFO prover::pipeline: proof {i} done in "
          f"{random.uniform(0.8, 1.4):.3f}s (batch {i // 64}, gpu 0, util {random.uniform(90, 99):.1f}%)\n")
    elif kind < 9:
        w(f"2026-12-06T12:{(s // 60) % 60:02d}:{s % 60:02d}.{ms:03d}Z DEBUG prover::msm: window {i % 23} "
          f"bucket {random.randrange(1 << 16)} carried {random.randrange(1000)}\n")
    else:
        w(f"2026-12-06T12:{(s // 60) % 60:02d}:{s % 60:02d}.{ms:03d}Z WARN prover::mem: pool at "
          f"{random.uniform(60, 95):.1f}% of {random.choice([24, 48, 80])} GiB\n")
"""


def flightrec(*args: str) -> list[str]:
    return [str(Path(sys.executable).with_name("flightrec")), *args]


def kafka_log_bytes(data: Path, topic: str) -> int:
    return sum(p.stat().st_size for p in data.rglob("*.log") if p.parent.name.startswith(topic + "-"))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--instances", type=int, default=4)
    ap.add_argument("--lines", type=int, default=250_000, help="lines per instance")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="flightrec-sizing-"))
    broker = LocalBroker(port=free_port(), data=work / "kafka", settings=Settings.from_env({}))
    broker.start()
    try:
        env = {
            **os.environ,
            "PYTHONSAFEPATH": "1",
            "FLIGHTREC_BOOTSTRAP": broker.bootstrap,
            "FLIGHTREC_SPOOL": str(work / "spool"),
            "FLIGHTREC_FACTS": "",
            "FLIGHTREC_FLUSH_TIMEOUT": "600",
        }
        t0 = time.monotonic()
        agents = [
            subprocess.Popen(
                flightrec(
                    "agent",
                    "run",
                    "--instance",
                    f"size-{n}",
                    "--stage",
                    "supervisor",
                    "--no-seal",
                    "--",
                    sys.executable,
                    "-c",
                    CHILD,
                    str(args.lines),
                    str(n),
                ),
                env=env,
                stdout=subprocess.DEVNULL,
            )
            for n in range(args.instances)
        ]
        for a in agents:
            assert a.wait() == 0
        produced = time.monotonic() - t0
        db = work / "fleet.duckdb"
        subprocess.run(
            flightrec("materialize", "--db", str(db), "--until-idle", "3", "--no-serve"),
            env=env,
            check=True,
            capture_output=True,
        )
        con = duckdb.connect(str(db), read_only=True)
        lines, text_bytes = con.execute("SELECT count(*), sum(strlen(text)) FROM log_lines").fetchall()[0]
        con.close()
        total = args.instances * args.lines
        assert lines == total, (lines, total)
        db_bytes = db.stat().st_size
        kafka_bytes = kafka_log_bytes(work / "kafka", "flightrec.logs")
        print(
            f"{lines:,} lines of {text_bytes / lines:.1f} bytes of text on average, {args.instances} instances "
            f"(agents {produced:.1f}s)"
        )
        print(f"DuckDB file: {db_bytes:,} bytes = {db_bytes / lines:.1f} bytes/line")
        print(f"Kafka flightrec.logs segments: {kafka_bytes:,} bytes = {kafka_bytes / lines:.1f} bytes/line")
        _record(args.instances, lines, text_bytes / lines, db_bytes, kafka_bytes)
    finally:
        broker.stop()


def _record(instances: int, lines: int, text: float, db_bytes: int, kafka_bytes: int) -> None:
    record.write(
        "bench_sizing",
        "Disk per line",
        f"{lines:,} proving-daemon-like lines of {text:.1f} bytes of text on average, printed by {instances} real "
        "agents, through Kafka into a new database, then closed (checkpointed); bytes do not depend on load. "
        'docs/operations.md ("Sizing") computes disk per day from these.',
        [
            record.Figure(
                "the database file, bytes per line",
                f"{db_bytes / lines:.1f} ({db_bytes:,} bytes)",
                f"the lines' text: {text:.1f}",
            ),
            record.Figure(
                "Kafka's `flightrec.logs` segments (one replica, uncompressed), bytes per line",
                f"{kafka_bytes / lines:.1f} ({kafka_bytes:,} bytes)",
                f"the lines' text: {text:.1f}",
            ),
        ],
    )


if __name__ == "__main__":
    main()
