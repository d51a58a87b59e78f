"""Benchmark of the agent: lines/s vs kcat, overhead on the child, p99 line-to-Kafka latency, peak RSS."""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import NamedTuple

from flightrec.broker import LocalBroker
from flightrec.broker.local import free_port
from flightrec.schemas import MAGIC, decode_record

from flightrec.settings import TOPIC_LOGS, Settings

sys.path.insert(0, str(Path(__file__).resolve().parent))
import record  # noqa: E402 - benchmarks/ on the path first

FLIGHTREC = str(Path(sys.executable).parent / "flightrec")


def agent_run(instance: str, stage: str, *cmd: str) -> list[str]:
    """`flightrec agent run` of ``cmd`` as one stage of ``instance``, with no facts gathered."""
    return [FLIGHTREC, "agent", "run", "--instance", instance, "--stage", stage, "--no-facts", "--", *cmd]


LINES = 1_000_000
RUNS = 3
CAP_RUNS = 5  # capacity pairs (kcat, then the agent): the load of a shared machine varies from run to run
SCRATCH = "bench.kcat"
# The agent with no Kafka to deliver to (nothing listens at its bootstrap): its own pipeline alone - read, pass
# through, split, scrub, encode, spool (fsync'd) - what the agent costs before a byte is produced.
NULL_SINK = "null sink"
# the floors (agent_floor.py): the least one Python process needs for the same shipping, each mode adding to the one
# before - from aiokafka alone up to all the agent's guarantees done the simplest way
FLOOR = str(Path(__file__).with_name("agent_floor.py"))
FLOORS = ("raw", "events", "passthrough", "scrubbed", "durable")

# the child: prints LINES lines of ~60 bytes as fast as Python can, then reports its own time on stderr
CHILD = f"""
import sys, time
t0 = time.perf_counter()
w = sys.stdout.write
for i in range({LINES}):
    w(f"{{i:07d}} worker 3: batch done msm=ok ntt=ok elapsed_ms=12.5\\n")
sys.stdout.flush()
wall = time.perf_counter() - t0
try:  # the time it was ready to run but waited for a core (the kernel's schedstat: on-CPU ns, run-queue ns, slices)
    ready = int(open("/proc/self/schedstat").read().split()[1]) / 1e9
except (OSError, IndexError, ValueError):
    ready = float("nan")
print(f"child_s={{wall:.4f}} cpu_s={{time.process_time():.4f}} ready_s={{ready:.4f}}", file=sys.stderr)
"""

# the same child computing between its lines (~10 us a line on this machine: 100,000 lines/s, CPU-bound as a
# prover is), 200,000 lines: a child the agent keeps up with, where any time it takes from the child shows
BUSY_LINES = 200_000
CHILD_BUSY = CHILD.replace(f"range({LINES})", f"range({BUSY_LINES})").replace(
    "    w(f", "    sum(map(abs, range(700)))\n    w(f"
)
assert CHILD_BUSY.count("range(700)") == 1 and str(BUSY_LINES) in CHILD_BUSY

PACED = """
import sys, time
n, rate = int(sys.argv[1]), float(sys.argv[2])
t0 = time.time()
for i in range(n):
    due = t0 + i / rate
    d = due - time.time()
    if d > 0:
        time.sleep(d)
    print(f"lat {time.time_ns() // 1000} {i}", flush=True)
"""


class ChildTime(NamedTuple):
    """The child's own time: its wall time writing its lines; of which on a core, and ready but waiting for one
    (its start is not counted). The rest it was blocked: writing into a full pipe."""

    wall: float
    cpu: float
    ready: float

    @property
    def blocked(self) -> float:
        return max(0.0, self.wall - self.cpu - self.ready)


def child_seconds(stderr: bytes) -> ChildTime:
    for line in stderr.decode(errors="replace").splitlines():
        if line.startswith("child_s="):
            return ChildTime(*(float(part.split("=", 1)[1]) for part in line.split()))
    raise AssertionError(f"the child reported no time: {stderr[-500:]!r}")


def child_summary(times: list[ChildTime]) -> str:
    med = statistics.median
    return (
        f"{med(t.wall for t in times):.2f}s (on a core {med(t.cpu for t in times):.2f}s, waiting for a core "
        f"{med(t.ready for t in times):.2f}s, blocked writing {med(t.blocked for t in times):.2f}s)"
    )


def peak_rss_mib(pid: int, stop: threading.Event, out: list[int]) -> None:
    while not stop.is_set():
        try:
            with open(f"/proc/{pid}/status") as f:
                for line in f:
                    if line.startswith("VmHWM:"):
                        out.append(int(line.split()[1]) // 1024)
        except OSError:
            return
        time.sleep(0.02)


def create_scratch(bootstrap: str) -> None:
    async def go() -> None:
        from aiokafka.admin import AIOKafkaAdminClient, NewTopic

        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        await admin.start()
        try:
            await admin.create_topics([NewTopic(SCRATCH, 6, 1)])
        finally:
            await admin.close()

    asyncio.run(go())


def count_lines(
    bootstrap: str,
    instance: str,
    live: list[tuple[int, float]] | None = None,
    stop: threading.Event | None = None,
    topic: str = TOPIC_LOGS,
) -> int:
    """Lines of ``instance`` in ``topic`` (stdout's of LogBatch events; in other messages, their newlines); with
    ``live``, record (line ts, receipt time) until ``stop``."""

    async def go() -> int:
        from aiokafka import AIOKafkaConsumer, TopicPartition

        c = AIOKafkaConsumer(
            bootstrap_servers=bootstrap,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            fetch_max_wait_ms=10,
            max_partition_fetch_bytes=16 << 20,
        )
        await c.start()
        try:
            parts = [TopicPartition(topic, p) for p in (c.partitions_for_topic(topic) or range(6))]
            c.assign(parts)
            if live is None:
                await c.seek_to_beginning(*parts)
            else:  # live: only what comes now (not the millions of lines of the runs before, read first)
                await c.seek_to_end(*parts)
            key = instance.encode()
            n = 0
            while True:
                got = await c.getmany(timeout_ms=200)
                now = time.time()
                for msgs in got.values():
                    for m in msgs:
                        if m.key != key:
                            continue
                        if not m.value.startswith(MAGIC):  # a floor's raw bytes
                            n += m.value.count(b"\n")
                            continue
                        _, rec = decode_record(m.value)
                        if rec["source"] == "stdout":
                            n += len(rec["text"])
                        if live is not None:
                            for t in rec["text"]:
                                if t.startswith("lat "):
                                    live.append((int(t.split()[1]), now))
                if stop is None:
                    end = await c.end_offsets(parts)
                    if all([(await c.position(tp)) >= end[tp] for tp in parts]):
                        return n
                elif stop.is_set() and not got:
                    return n
        finally:
            await c.stop()

    return asyncio.run(go())


def variant(text: str) -> tuple[str, dict[str, str]]:
    """``LABEL:VAR=VALUE[,VAR=VALUE...]`` -> (label, environment)."""
    label, _, assigns = text.partition(":")
    env = dict(a.split("=", 1) for a in assigns.split(",") if "=" in a)
    if not label or not env:
        raise argparse.ArgumentTypeError(f"{text!r}: expected LABEL:VAR=VALUE[,VAR=VALUE...]")
    return label, env


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__ + " Starts its own Kafka broker (Kafka's jars from "
        "FLIGHTREC_CACHE) and needs kcat; results are printed, see BENCHMARKS.md."
    )
    p.add_argument(
        "--capacity-only",
        action="store_true",
        help="only the pipeline capacity pairs (kcat -P -l FILE vs agent run -- cat FILE, 1M lines)",
    )
    p.add_argument("--pairs", type=int, default=CAP_RUNS, help=f"capacity pairs to run (default {CAP_RUNS})")
    p.add_argument(
        "--variant",
        type=variant,
        action="append",
        default=[],
        metavar="LABEL:VAR=VALUE[,...]",
        help="one more agent in each capacity pair, with these environment variables set, its wall and "
        "CPU time shown next to the plain agent's; the order of the agents rotates from pair to pair. "
        "E.g. 'shapes off:FLIGHTREC_SECRET_SHAPES=off', 'before:PYTHONPATH=DIR' (DIR holding the "
        "flightrec package of older code); may be given several times",
    )
    args = p.parse_args()
    if not shutil.which("kcat"):
        print("kcat is not installed (make system-packages installs it); the baseline needs it", file=sys.stderr)
        return 1
    tmp = Path(tempfile.mkdtemp(prefix="bench-agent-"))
    broker = LocalBroker(port=free_port(), data=tmp / "kafka", settings=Settings.from_env({}))
    broker.start()
    try:
        return run(broker.bootstrap, tmp, args)
    finally:
        broker.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def compile_as_installed(env: dict[str, str]) -> None:
    """The agent's modules compiled to bytecode, as `pip install` leaves them: a checkout installed in editable mode
    under PYTHONDONTWRITEBYTECODE (as this machine's environment sets) compiles each module at every start (~40 ms
    of an agent's start). One run of the agent with bytecode writing on writes what it imports."""
    warm = {k: v for k, v in env.items() if k != "PYTHONDONTWRITEBYTECODE"}
    subprocess.run(
        agent_run(f"bench-warm-{uuid.uuid4()}", "s", "true"),
        env=warm,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        check=True,
    )


def run(bootstrap: str, tmp: Path, args: argparse.Namespace) -> int:
    create_scratch(bootstrap)
    env = dict(
        os.environ,
        FLIGHTREC_BOOTSTRAP=bootstrap,
        FLIGHTREC_SPOOL=str(tmp / "spool"),
        FLIGHTREC_FLUSH_TIMEOUT="120",
        FLIGHTREC_LOG_LEVEL="WARNING",
    )
    compile_as_installed(env)
    med = statistics.median
    if args.capacity_only:
        _record(report_capacity(*pipeline_capacity(bootstrap, tmp, env, args.pairs, args.variant)))
        return 0
    py = sys.executable
    to_file: list[tuple[float, ChildTime]] = []
    kcat_child: list[ChildTime] = []
    agent_child: list[ChildTime] = []
    busy_file: list[ChildTime] = []
    busy_agent: list[ChildTime] = []
    cat_child: list[ChildTime] = []  # piped into `cat > /dev/null`: the least any reader of a pipe costs it
    kcat, agent_total, rss = [], [], []
    instances = []
    for r in range(RUNS):
        # baseline 1: the child writing to a file
        with open(tmp / "out.txt", "wb") as f:
            t = time.perf_counter()
            p = subprocess.run([py, "-c", CHILD], stdout=f, stderr=subprocess.PIPE, check=True)
            to_file.append((time.perf_counter() - t, child_seconds(p.stderr)))
        # baseline 1b: piped into `cat > /dev/null`, a write per line into a pipe whose reader does nothing
        child = subprocess.Popen([py, "-c", CHILD], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        assert child.stdout is not None and child.stderr is not None
        sink = subprocess.Popen(["sh", "-c", "cat > /dev/null"], stdin=child.stdout)
        child.stdout.close()
        cat_child.append(child_seconds(child.stderr.read()))
        assert child.wait() == 0 and sink.wait() == 0
        # baseline 2: the same child piped into kcat (librdkafka), acks=all + idempotence, same broker
        t = time.perf_counter()
        child = subprocess.Popen([py, "-c", CHILD], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        k = subprocess.run(
            [
                "kcat",
                "-P",
                "-b",
                bootstrap,
                "-t",
                SCRATCH,
                "-X",
                "acks=all",
                "-X",
                "enable.idempotence=true",
                "-X",
                "linger.ms=5",
            ],
            stdin=child.stdout,
        )
        assert child.stderr is not None
        kcat_child.append(child_seconds(child.stderr.read()))
        child.wait()
        kcat.append(time.perf_counter() - t)
        assert k.returncode == 0, "kcat failed"
        # the agent wrapping the same child, its output going to a file, until every line is acknowledged
        inst = f"bench-{uuid.uuid4()}"
        instances.append(inst)
        with open(tmp / "out.txt", "wb") as f:
            t = time.perf_counter()
            p = subprocess.Popen(
                agent_run(inst, "bench", py, "-c", CHILD),
                stdout=f,
                stderr=subprocess.PIPE,
                env=env,
            )
            stop, peaks = threading.Event(), []
            th = threading.Thread(target=peak_rss_mib, args=(p.pid, stop, peaks), daemon=True)
            th.start()
            _, err = p.communicate()
            agent_total.append(time.perf_counter() - t)
            stop.set()
            th.join()
        assert p.returncode == 0, err[-2000:]
        agent_child.append(child_seconds(err))
        with open(tmp / "out.txt", "wb") as f:  # the busy child: to a file, then under the agent
            p = subprocess.run([py, "-c", CHILD_BUSY], stdout=f, stderr=subprocess.PIPE, check=True)
            busy_file.append(child_seconds(p.stderr))
            p = subprocess.run(
                agent_run(f"bench-busy-{uuid.uuid4()}", "busy", py, "-c", CHILD_BUSY),
                stdout=f,
                stderr=subprocess.PIPE,
                env=env,
            )
            assert p.returncode == 0, p.stderr[-2000:]
            busy_agent.append(child_seconds(p.stderr))
        rss.append(max(peaks) if peaks else 0)
        print(
            f"run {r + 1}: file {to_file[-1][0]:.2f}s  kcat {kcat[-1]:.2f}s  agent {agent_total[-1]:.2f}s "
            f"(child {agent_child[-1].wall:.2f}s)  rss {rss[-1]} MiB; busy child: to a file {busy_file[-1].wall:.2f}s, "
            f"under the agent {busy_agent[-1].wall:.2f}s",
            flush=True,
        )
    delivered = count_lines(bootstrap, instances[0])
    assert delivered == LINES, f"the agent delivered {delivered} lines, not {LINES}"
    capacity = pipeline_capacity(bootstrap, tmp, env, args.pairs, args.variant)

    # latency at 1,000 lines/s: a live consumer notes when each line's batch arrives
    inst = f"bench-lat-{uuid.uuid4()}"
    live: list[tuple[int, float]] = []
    stop = threading.Event()
    consumer = threading.Thread(target=count_lines, args=(bootstrap, inst, live, stop), daemon=True)
    consumer.start()
    time.sleep(1.0)
    n_lat = 10_000
    subprocess.run(
        agent_run(inst, "lat", py, "-c", PACED, str(n_lat), "1000"),
        stdout=subprocess.DEVNULL,
        env=env,
        check=True,
    )
    time.sleep(1.0)
    stop.set()
    consumer.join(30)
    lat_ms = sorted((recv - ts / 1e6) * 1000 for ts, recv in live)
    assert len(lat_ms) == n_lat, f"saw {len(lat_ms)} of {n_lat} paced lines"

    f_wall = med(w for w, _ in to_file)
    f_child = med(c.wall for _, c in to_file)
    a_child = med(c.wall for c in agent_child)
    print()
    print(
        f"machine: {os.cpu_count()} cores; broker on the same machine; {LINES:,} lines of ~60 bytes; median of {RUNS}"
    )
    print(f"child -> file:        wall {f_wall:.2f}s (child's own {f_child:.2f}s)")
    print(f"child | kcat -P:      {med(kcat):.2f}s  = {LINES / med(kcat):,.0f} lines/s")
    print(
        f"agent run -- child:   {med(agent_total):.2f}s  = {LINES / med(agent_total):,.0f} lines/s, "
        f"{med(agent_total) / med(kcat):.2f}x kcat's time (goal <= 2x)"
    )
    print(
        f"child's own time under the agent {a_child:.2f}s vs to a file {f_child:.2f}s: "
        f"+{(a_child / f_child - 1) * 100:.1f}% (#32: <= 5%); whole agent run vs child -> file: "
        f"+{(med(agent_total) / f_wall - 1) * 100:.0f}%"
    )
    print(
        f"for reference, the child's own time when piped into kcat: {med(c.wall for c in kcat_child):.2f}s "
        f"(+{(med(c.wall for c in kcat_child) / f_child - 1) * 100:.1f}% over a file); into `cat > /dev/null`, the "
        f"least any reader of a pipe costs it: {med(c.wall for c in cat_child):.2f}s "
        f"(+{(med(c.wall for c in cat_child) / f_child - 1) * 100:.1f}%)"
    )
    print(
        "  where the child's own time goes: to a file "
        + child_summary([c for _, c in to_file])
        + "; under the agent "
        + child_summary(agent_child)
        + "; into kcat "
        + child_summary(kcat_child)
        + "; into cat "
        + child_summary(cat_child)
    )
    b_file, b_agent = med(c.wall for c in busy_file), med(c.wall for c in busy_agent)
    print(
        f"a child computing between its lines ({BUSY_LINES:,} lines, ~{b_file / BUSY_LINES * 1e6:.0f} us a line): its "
        f"own time under the agent {b_agent:.2f}s vs to a file {b_file:.2f}s: {(b_agent / b_file - 1) * 100:+.1f}% "
        f"(#32: <= 5%; pairs' median "
        f"{(med(a.wall / f.wall for a, f in zip(busy_agent, busy_file, strict=True)) - 1) * 100:+.1f}%); "
        f"under the agent {child_summary(busy_agent)}"
    )
    print(
        f"latency line written -> batch received from Kafka at 1,000 lines/s ({n_lat:,} lines): "
        f"p50 {lat_ms[len(lat_ms) // 2]:.0f} ms, p99 {lat_ms[int(len(lat_ms) * 0.99)]:.0f} ms, "
        f"max {lat_ms[-1]:.0f} ms (goal p99 <= 250 ms)"
    )
    print(f"agent peak RSS: {max(rss)} MiB (goal <= 150 MiB)")
    kcat_own = med(c.wall for c in kcat_child)
    children = [
        record.Figure(
            "a child computing between its lines: its own time",
            f"{b_agent:.2f} s",
            f"to a file {b_file:.2f} s",
            f"{(b_agent / b_file - 1) * 100:+.1f}% (#32: <= 5%)",
        ),
        record.Figure(
            f"the fast child ({LINES:,} lines): its own time",
            f"{a_child:.2f} s",
            f"to a file {f_child:.2f} s; into kcat {kcat_own:.2f} s",
            f"{(a_child / f_child - 1) * 100:+.0f}% (kcat {(kcat_own / f_child - 1) * 100:+.0f}%)",
        ),
        record.Figure(
            "the fast child, whole run",
            f"{med(agent_total):.2f} s",
            f"`child | kcat -P` {med(kcat):.2f} s",
            f"{med(agent_total) / med(kcat):.2f}x kcat (goal <= 2x)",
        ),
        record.Figure(
            f"latency, line written -> its batch read back from Kafka, 1,000 lines/s ({n_lat:,} lines)",
            f"p50 {lat_ms[len(lat_ms) // 2]:.0f} ms, p99 {lat_ms[int(len(lat_ms) * 0.99)]:.0f} ms, "
            f"max {lat_ms[-1]:.0f} ms",
            note="p99 <= 250 ms",
        ),
        record.Figure("peak RSS", f"{max(rss)} MiB", note="<= 150 MiB"),
    ]
    _record(report_capacity(*capacity) + children)
    return 0


Runs = dict[str, list[tuple[float, float]]]  # agent label -> (wall s, CPU s of the agent process) per pair


def report_capacity(kc: list[float], agents: Runs) -> list[record.Figure]:
    """Print the capacity pairs; return their figures (the agent, its null sink, the floors; kcat the baseline)."""
    med = statistics.median
    wall, cpu = [w for w, _ in agents["agent"]], [c for _, c in agents["agent"]]
    print(
        f"pipeline capacity, {LINES:,} lines from a file: kcat -P -l FILE {med(kc):.2f}s, "
        f"agent run -- cat FILE {med(wall):.2f}s = {med(wall) / med(kc):.2f}x kcat's time "
        f"(goal <= 1.5x; #32: <= 1.25x; runs: kcat {', '.join(f'{x:.2f}' for x in kc)}; "
        f"agent {', '.join(f'{x:.2f}' for x in wall)}; median of the pairs' ratios "
        f"{med(a / k for a, k in zip(wall, kc, strict=True)):.2f}x); agent CPU (user+sys) median {med(cpu):.2f}s"
    )
    nw, nc = [w for w, _ in agents[NULL_SINK]], [c for _, c in agents[NULL_SINK]]
    print(
        f"  the agent's own pipeline, no Kafka ({NULL_SINK}: read, pass through, split, scrub, encode, spool): wall "
        f"median {med(nw):.2f}s = {med(nw) / med(kc):.2f}x kcat (pairs' ratios median "
        f"{med(a / k for a, k in zip(nw, kc, strict=True)):.2f}x), CPU {med(nc):.2f}s; delivery to Kafka adds "
        f"{med(wall) - med(nw):+.2f}s wall, {med(cpu) - med(nc):+.2f}s CPU (medians)"
    )
    kcat = f"`kcat -P -l FILE` {med(kc):.2f} s"
    figures = [
        record.Figure(
            f"capacity, {LINES:,} lines from a file, wall (CPU)",
            f"{med(wall):.2f} s ({med(cpu):.2f} s)",
            kcat,
            f"{med(wall) / med(kc):.2f}x kcat (#32: <= 1.25x)",
        ),
        record.Figure(
            "the agent with no Kafka (null sink), wall (CPU)",
            f"{med(nw):.2f} s ({med(nc):.2f} s)",
            kcat,
            f"{med(nw) / med(kc):.2f}x kcat",
        ),
    ]
    floors = {label: runs for label, runs in agents.items() if label.startswith("floor ")}
    figures += [
        record.Figure(
            f"floor `{label.split()[1]}` (benchmarks/agent_floor.py), wall (CPU)",
            f"{med(w for w, _ in runs):.2f} s ({med(c for _, c in runs):.2f} s)",
            kcat,
            f"{med(w for w, _ in runs) / med(kc):.2f}x kcat",
        )
        for label, runs in floors.items()
    ]
    if floors:
        print(
            "  floors (agent_floor.py: one Python process, aiokafka with the agent's options; each adds to the one "
            "before): "
            + "; ".join(
                f"{label.split()[1]} {med(w for w, _ in runs):.2f}s = {med(w for w, _ in runs) / med(kc):.2f}x kcat "
                f"(CPU {med(c for _, c in runs):.2f}s)"
                for label, runs in floors.items()
            )
        )
        fw = [w for w, _ in floors[f"floor {FLOORS[-1]}"]]
        print(
            f"  the agent / its floor with every guarantee ({FLOORS[-1]}): {med(wall) / med(fw):.2f}x "
            f"(pairs' ratios median {med(a / f for a, f in zip(wall, fw, strict=True)):.2f}x)"
        )
    for label, runs in agents.items():
        if label in ("agent", NULL_SINK) or label in floors:
            continue
        w, c = [x for x, _ in runs], [y for _, y in runs]
        print(
            f"  variant {label!r}: wall median {med(w):.2f}s = {med(w) / med(kc):.2f}x kcat "
            f"(pairs' ratios median {med(a / k for a, k in zip(w, kc, strict=True)):.2f}x; "
            f"runs {', '.join(f'{x:.2f}' for x in w)}), "
            f"CPU median {med(c):.2f}s (runs {', '.join(f'{x:.2f}' for x in c)}); the plain agent: wall "
            f"{med(wall):.2f}s, CPU {med(cpu):.2f}s (runs {', '.join(f'{x:.2f}' for x in cpu)}); "
            f"plain / variant CPU, median of the pairs: {med(a / b for a, b in zip(cpu, c, strict=True)):.2f}"
        )
    return figures


def _record(figures: list[record.Figure]) -> None:
    record.write(
        "bench_agent",
        "Agent",
        f"Capacity: one file of {LINES:,} lines (~60 bytes) sent by `flightrec agent run -- cat FILE` (acks=all, one "
        "partition) and by `kcat -P -l FILE` (acks=all, idempotent), in alternating pairs with the agent with no Kafka "
        "(the null sink) and the floors (`benchmarks/agent_floor.py`: the least one Python process needs, each adding "
        "to the one before); medians; CPU is the process's rusage. The children (unless --capacity-only): a Python "
        f"loop printing {LINES:,} lines as fast as it can, and one computing between its lines. Its own broker; needs "
        "`kcat`.",
        figures,
    )


def pipeline_capacity(
    bootstrap: str,
    tmp: Path,
    env: dict[str, str],
    pairs: int = CAP_RUNS,
    variants: list[tuple[str, dict[str, str]]] = (),
) -> tuple[list[float], Runs]:
    """The pipeline's own capacity: `agent run -- cat FILE` vs `kcat -P -l FILE`, same lines, same broker, acks=all;
    with ``variants``, more agents (other environment variables) in each pair; the null sink, and the floors of
    agent_floor.py (to the scratch topic); their order rotates from pair to pair."""
    data = tmp / "lines.txt"
    with open(data, "w") as f:
        for i in range(LINES):
            f.write(f"{i:07d} worker 3: batch done msm=ok ntt=ok elapsed_ms=12.5\n")
    closed = free_port()  # nothing listens there
    agents = [("agent", env)] + [(label, dict(env, **extra)) for label, extra in variants]
    agents.append((NULL_SINK, dict(env, FLIGHTREC_BOOTSTRAP=f"127.0.0.1:{closed}")))
    agents += [(f"floor {mode}", env) for mode in FLOORS]
    kc: list[float] = []
    runs: Runs = {label: [] for label, _ in agents}
    for r in range(pairs):
        t = time.perf_counter()
        k = subprocess.run(
            [
                "kcat",
                "-P",
                "-b",
                bootstrap,
                "-t",
                SCRATCH,
                "-l",
                "-X",
                "acks=all",
                "-X",
                "enable.idempotence=true",
                "-X",
                "linger.ms=5",
                str(data),
            ]
        )
        kc.append(time.perf_counter() - t)
        assert k.returncode == 0, "kcat failed"
        for label, agent_env in agents[r % len(agents) :] + agents[: r % len(agents)]:
            inst = f"bench-cat-{uuid.uuid4()}"
            if label == NULL_SINK:  # a spool of its own each time: what it keeps is thrown away after
                agent_env = dict(agent_env, FLIGHTREC_SPOOL=str(tmp / f"null-spool-{r}"))
            if label.startswith("floor "):
                cmd = [sys.executable, FLOOR, label.split()[1], str(data), SCRATCH, inst]
            else:
                cmd = agent_run(inst, "cat", "cat", str(data))
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            t = time.perf_counter()
            p = subprocess.run(
                cmd,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                env=agent_env,
            )
            wall = time.perf_counter() - t
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            runs[label].append((wall, after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime))
            assert p.returncode == 0, p.stderr[-2000:]
            if label == NULL_SINK:
                assert b"stay in" in p.stderr, p.stderr[-2000:]  # it kept them for a later delivery
                shutil.rmtree(tmp / f"null-spool-{r}")
            elif r < len(agents):  # each agent's and floor's first run: every line arrived
                delivered = count_lines(bootstrap, inst, topic=SCRATCH if label.startswith("floor ") else TOPIC_LOGS)
                assert delivered == LINES, f"{label} delivered {delivered} lines of cat, not {LINES}"
        print(
            f"capacity run {r + 1}: kcat -P -l {kc[-1]:.2f}s  "
            + "  ".join(f"{label} {runs[label][-1][0]:.2f}s (CPU {runs[label][-1][1]:.2f}s)" for label, _ in agents),
            flush=True,
        )
    return kc, runs


if __name__ == "__main__":
    sys.exit(main())
