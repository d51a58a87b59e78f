"""Dashboard test data: boots of events folded and committed by the materializer's own fold() and FileStore.

Nothing here writes a derived table (instances, failures, boots) by hand: they come out of
db/derive.py exactly as in production, so these databases cannot drift from it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import duckdb
from flightrec.db.filestore import FileStore
from flightrec.db.fold import RawMessage, fold
from flightrec.schemas import (
    BenchmarkResult,
    Event,
    FileTail,
    InstanceFacts,
    Lifecycle,
    LogBatch,
    ManagerEvent,
    ProcessExit,
    Sealed,
    Throughput,
    encode,
)

BASE_US = 1_748_779_200_000_000  # 2025-06-01 12:00:00 UTC
MIN = 60_000_000
NO_KERNEL = "CUDA error: no kernel image is available for execution on the device"
DAEMON_LOG = "/var/log/prover/daemon.log"
STAGES = ("tunnel", "register", "fetch_params", "benchmark", "supervisor")


class Boot:
    """One boot of one instance as the agent numbers it (gap-free seq); each event at a time the test chooses."""

    def __init__(self, instance: str, start_us: int = BASE_US, boot: str | None = None) -> None:
        self.instance, self.boot, self.t = instance, boot or f"boot-{instance}", start_us
        self.prefix = boot or instance  # event ids stay unique across the boots of one instance
        self.events: list[Event] = []

    def add(self, cls: type, at_us: int | None = None, event_id: str | None = None, **fields: Any) -> Event:
        """Append one event at ``at_us`` (default: 1 ms after the previous one), its id ``event_id`` if given."""
        self.t = self.t + 1000 if at_us is None else at_us
        ev = cls(
            event_id=event_id or f"{self.prefix}-{len(self.events)}",
            instance_id=self.instance,
            boot_id=self.boot,
            seq=len(self.events),
            ts_us=self.t,
            **fields,
        )
        self.events.append(ev)
        return ev

    def lines(
        self,
        stage: str,
        source: str,
        texts: list[str],
        at_us: int | None = None,
        step_us: int = 1_000_000,
        first_line: int = 1,
    ) -> Event:
        """A LogBatch whose lines are ``step_us`` apart, the first at ``at_us``."""
        start = self.t + 1000 if at_us is None else at_us
        n = len(texts)
        ev = self.add(
            LogBatch,
            start + max(n - 1, 0) * step_us,
            stage=stage,
            source=source,
            pid=42,
            line_no=list(range(first_line, first_line + n)),
            line_ts_us=[start + i * step_us for i in range(n)],
            text=list(texts),
            truncated=[False] * n,
            invalid_utf8=[False] * n,
        )
        return ev

    def seal(self, at_us: int | None = None) -> Event:
        return self.add(Sealed, at_us, event_count=len(self.events) + 1, reason="entrypoint ended")


def commit(path: Path, boots: list[Boot]) -> None:
    """Encode every boot's events, fold them and commit them with the materializer's own FileStore."""
    events = [e for b in boots for e in b.events]
    msgs = [RawMessage(e.topic, 0, n, e.instance_id.encode(), encode(e)) for n, e in enumerate(events)]
    delta = fold(msgs)
    assert delta.dead.num_rows == 0, delta.dead.to_pylist()
    store = FileStore(path, group="dashboard-tests")
    try:
        store.commit(delta)
    finally:
        store.close()


def facts(b: Boot, gpu_model: str, cc: str, price: float) -> None:
    b.add(
        InstanceFacts,
        gpu_model=gpu_model,
        gpu_count=1,
        gpu_memory_mib=81920,
        driver_version="570.86",
        cuda_version="12.8",
        compute_capability=cc,
        host=f"host-{b.instance}",
        price_per_hour=price,
    )


def stages_ok(b: Boot, upto: str, at_us: int) -> int:
    """Run STAGES before ``upto`` successfully, one lifecycle event a minute from ``at_us``; returns the next minute."""
    t = at_us
    for stage in STAGES:
        if stage == upto:
            break
        b.add(Lifecycle, t, stage=stage, state="started")
        if stage == "fetch_params":
            b.lines(stage, "stdout", ["downloading params 100% done_ok"], t + 1000)
        b.add(Lifecycle, t + MIN, stage=stage, state="succeeded")
        t += 2 * MIN
    return t


def first_failure_id(path: Path, instance_id: str) -> str:
    con = duckdb.connect(str(path), read_only=True)
    try:
        row = con.execute(
            "SELECT failure_id FROM failures WHERE instance_id = ? ORDER BY ts_us DESC LIMIT 1", [instance_id]
        ).fetchone()
    finally:
        con.close()
    assert row, f"the fold recorded no failure for {instance_id}"
    return row[0]


def build_arrow_db(path: Path) -> dict[str, Any]:
    """Three instances: one proving (H100), the motivating no-kernel-image case (RTX 5090), one too slow (A100).

    Built from events through the materializer's fold() and FileStore, so the derived tables
    (instances, failures, boots) are exactly what the pipeline writes. Returns the ids the tests look for.
    """
    ok, nok, slow = "i-h100-ok", "i-5090-nokernel", "i-a100-slow"

    a = Boot(ok)
    facts(a, "NVIDIA H100 80GB HBM3", "9.0", 2.49)
    t = stages_ok(a, "benchmark", BASE_US)
    a.add(Lifecycle, t, stage="benchmark", state="started")
    a.lines("benchmark", "stdout", ["starting prover daemon", "warm-up proof 1/3"], t + 1000)
    for n in range(3):
        a.add(
            Throughput,
            t + (n + 1) * 20_000_000,
            stage="benchmark",
            backend="cuda",
            device="H100",
            proofs=25,
            seconds=60.0,
            proofs_per_hour=1400.0 + 50 * n,
            phase="measured",
        )
    a.add(
        BenchmarkResult,
        t + MIN - 1000,
        stage="benchmark",
        backend="cuda",
        device="H100",
        proofs=75,
        proofs_per_hour=1500.0,
        min_rate=1000.0,
        verdict="pass",
    )
    a.add(Lifecycle, t + MIN, stage="benchmark", state="succeeded")
    a.add(Lifecycle, t + 2 * MIN, stage="supervisor", state="started")
    a.lines("supervisor", "stdout", [f"proof {n} done" for n in range(50)], t + 2 * MIN + 1000)

    b = Boot(nok)
    facts(b, "NVIDIA GeForce RTX 5090", "12.0", 0.89)
    t = stages_ok(b, "benchmark", BASE_US)
    b.add(Lifecycle, t, stage="benchmark", state="started")
    b.lines("benchmark", "stdout", ["starting prover daemon", "warm-up proof 1/3"], t + 1000)
    daemon = ["daemon: device 0 NVIDIA GeForce RTX 5090 sm_120", NO_KERNEL, "daemon: shutting down"]
    b.lines("benchmark", DAEMON_LOG, daemon, t + 10_000_000)
    b.lines("benchmark", "stderr", ["benchmark exited with error"], t + 30_000_000)
    b.add(
        BenchmarkResult,
        t + 40_000_000,
        stage="benchmark",
        backend="cuda",
        device="gpu0",
        proofs=0,
        proofs_per_hour=0.0,
        min_rate=1000.0,
        verdict="error",
        detail="0 proofs completed",
    )
    b.add(
        ProcessExit,
        t + 50_000_000,
        stage="benchmark",
        argv=["bench.sh", "--min-rate", "1000"],
        pid=42,
        exit_code=1,
        started_us=t,
        ended_us=t + 50_000_000,
        duration_s=50.0,
        stderr_tail=["benchmark exited with error"],
        stdout_tail=["starting prover daemon", "warm-up proof 1/3"],
        file_tails=[FileTail(DAEMON_LOG, daemon)],
    )
    b.add(Lifecycle, t + MIN, stage="benchmark", state="failed", detail="benchmark exited with error")
    b.seal()

    c = Boot(slow)
    facts(c, "NVIDIA A100-SXM4-40GB", "8.0", 1.2)
    t = stages_ok(c, "benchmark", BASE_US)
    c.add(Lifecycle, t, stage="benchmark", state="started")
    c.lines(
        "benchmark", "stdout", ["starting prover daemon", "warm-up proof 1/3", "measured 640.0 proofs/hour"], t + 1000
    )
    c.add(
        BenchmarkResult,
        t + 50_000_000,
        stage="benchmark",
        backend="cuda",
        device="gpu0",
        proofs=10,
        proofs_per_hour=640.0,
        min_rate=1000.0,
        verdict="fail",
        detail="640.0 proofs/hour < MIN_RATE 1000",
    )
    c.add(Lifecycle, t + MIN, stage="benchmark", state="failed", detail="640.0 proofs/hour < MIN_RATE 1000")
    c.seal()

    commit(path, [a, b, c])
    return {
        "ok": ok,
        "no_kernel": nok,
        "slow": slow,
        "no_kernel_failure": first_failure_id(path, nok),
        "slow_failure": first_failure_id(path, slow),
    }


SEGV = "rtxpro4000-0a1b2c3d4e5f60718293"  # a long id: the table must not cut it
SEGV_GPU = "NVIDIA RTX PRO 4000 Blackwell Generation"
SEGV_LINE = "fatal error: unexpected signal during runtime execution [signal SIGSEGV: segmentation violation]"
SEGV_ARGV = [
    "python",
    "-m",
    "flightrec.demo.fleet",
    "benchmark",
    "--fate",
    "daemon_signal",
    "--log",
    "/tmp/flightrec-demo-4f2a/.flightrec/rtxpro4000-0/prover-daemon.log",
    "--k",
    "10",
    "--proofs",
    "2",
    "--min-rate",
    "1.0",
    "--end-marker",
    "END-OF-COMMAND",
]
SEGV_LOG = "/tmp/flightrec-demo-4f2a/.flightrec/rtxpro4000-0/prover-daemon.log"


def segv_boot(start_us: int = BASE_US + 40 * MIN) -> Boot:
    """The daemon dies of SIGSEGV; its wrapper (the stage's command) exits 1 and says so on stderr.

    The daemon's log tail is 90 lines, the fatal line in its middle.
    """
    b = Boot(SEGV, start_us)
    facts(b, SEGV_GPU, "12.0", 0.35)
    t = stages_ok(b, "benchmark", start_us)
    b.add(Lifecycle, t, stage="benchmark", state="started")
    daemon = (
        [f"proof {n} done in 0.8 s" for n in range(1, 60)]
        + [SEGV_LINE]
        + [f"goroutine {n} [running]: runtime.sigpanic()" for n in range(30)]
    )
    b.lines("benchmark", SEGV_LOG, daemon, t + 1000, step_us=100_000)
    stderr = ["prover daemon (pid 4242) was killed by signal SIGSEGV (core dumped)", "benchmark exited with error"]
    b.lines("benchmark", "stderr", stderr, t + 20_000_000)
    b.add(
        ProcessExit,
        t + 25_000_000,
        stage="benchmark",
        argv=SEGV_ARGV,
        pid=4241,
        exit_code=1,
        started_us=t,
        ended_us=t + 25_000_000,
        duration_s=25.0,
        stderr_tail=stderr,
        file_tails=[FileTail(SEGV_LOG, daemon)],
    )
    b.add(Lifecycle, t + 26_000_000, stage="benchmark", state="failed", detail="benchmark exited with error")
    b.seal()
    return b


def append_lines(
    path: Path, instance_id: str, stage: str, texts: list[str], ts_us: int, seq: int, boot_id: str | None = None
) -> None:
    """What the materializer does when more log lines of a running stage arrive: fold and commit one LogBatch."""
    n = len(texts)
    ev = LogBatch(
        event_id=f"{instance_id}-late-{seq}",
        instance_id=instance_id,
        boot_id=boot_id or f"boot-{instance_id}",
        seq=seq,
        ts_us=ts_us,
        stage=stage,
        source="stdout",
        pid=42,
        line_no=list(range(1000 + seq, 1000 + seq + n)),
        line_ts_us=[ts_us + i for i in range(n)],
        text=list(texts),
        truncated=[False] * n,
        invalid_utf8=[False] * n,
    )
    store = FileStore(path, group="dashboard-tests")
    try:
        store.commit(fold([RawMessage(ev.topic, 0, 10_000 + seq, instance_id.encode(), encode(ev))]))
    finally:
        store.close()


HOUR = 60 * MIN
RTX4090 = "NVIDIA GeForce RTX 4090"


def manager_events(instance: str, *events: tuple[str, int, dict[str, str]]) -> Boot:
    """(kind, at_us, attributes) about ``instance`` as `flightrec manager event` sends them: the manager's own
    source, boot and seq, never the instance's."""
    m = Boot(instance, boot=f"manager@ctl/{instance}")
    for kind, at_us, attributes in events:
        m.add(ManagerEvent, at_us, source_id="manager@ctl", kind=kind, attributes=attributes)
    return m


def _money_facts(b: Boot, gpu_model: str, host: str, driver: str, price: float) -> None:
    b.add(
        InstanceFacts,
        BASE_US,
        gpu_model=gpu_model,
        gpu_count=1,
        gpu_memory_mib=24564,
        driver_version=driver,
        cuda_version="12.8",
        compute_capability="8.9",
        host=host,
        price_per_hour=price,
    )


def money_boots() -> list[Boot]:
    """Three instances with known prices, paid time and failures, from BASE_US on.

    a: rented by the manager at $0.40/h (its facts say $0.50), host id 123; its benchmark fails with
       no kernel image after 1 h (failure ``fa``); sealed at 2 h.
    b: rented with host id 456 and no price (the facts' $0.50/h counts); its benchmark runs out of GPU
       memory at 0.5 h (``fb1``); after a reboot the benchmark is too slow at 1 h (``fb2``); the boot is
       never sealed, the manager destroys it at 3 h.
    c: a healthy H100 at $2/h (no manager events), sealed at 4 h.
    """
    a = Boot("a", BASE_US)
    _money_facts(a, RTX4090, "h-a", "570.86", 0.50)
    a.add(Lifecycle, BASE_US + MIN, stage="benchmark", state="started")
    a.lines("benchmark", "stderr", [NO_KERNEL], BASE_US + HOUR - MIN)
    a.add(
        Lifecycle,
        BASE_US + HOUR,
        event_id="fa",
        stage="benchmark",
        state="failed",
        detail="benchmark exited with error",
    )
    a.seal(BASE_US + 2 * HOUR)

    b1 = Boot("b", BASE_US, boot="boot-b-1")
    _money_facts(b1, RTX4090, "h-b", "570.86", 0.50)
    b1.add(Lifecycle, BASE_US + MIN, stage="benchmark", state="started")
    b1.lines(
        "benchmark",
        "stderr",
        ["RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB"],
        BASE_US + HOUR // 2 - MIN,
    )
    b1.add(
        Lifecycle,
        BASE_US + HOUR // 2,
        event_id="fb1",
        stage="benchmark",
        state="failed",
        detail="benchmark exited with error",
    )
    b1.seal(BASE_US + HOUR // 2 + MIN)
    b2 = Boot("b", BASE_US + 40 * MIN, boot="boot-b-2")
    b2.add(Lifecycle, BASE_US + 40 * MIN, stage="benchmark", state="started")
    b2.add(
        BenchmarkResult,
        BASE_US + HOUR,
        event_id="fb2",
        stage="benchmark",
        backend="cuda",
        device="gpu0",
        proofs=10,
        proofs_per_hour=400.0,
        min_rate=1000.0,
        verdict="fail",
        detail="400.0 proofs/hour < MIN_RATE 1000",
    )

    c = Boot("c", BASE_US)
    _money_facts(c, "NVIDIA H100 80GB HBM3", "h-c", "550.54", 2.0)
    t = stages_ok(c, "supervisor", BASE_US + MIN)
    c.add(Lifecycle, t, stage="supervisor", state="started")
    c.seal(BASE_US + 4 * HOUR)

    return [
        a,
        b1,
        b2,
        c,
        manager_events("a", ("rented", BASE_US, {"price_per_hour": "0.40", "host_id": "123"})),
        manager_events("b", ("rented", BASE_US, {"host_id": "456"}), ("destroyed", BASE_US + 3 * HOUR, {})),
    ]


# An id a hostile or careless operator might use: quotes, %, markdown and LaTeX marks, unicode, a URL's own signs.
HOSTILE = "i-'q\"-100%_$5-$6-*x*-`t`-[l](u)-日本🚀-a&b=c#d?e/f"
LONG_LINE = "CUDA error: no kernel image is available for execution on the device " + "x" * 10_000
PRICED_DETAIL = "paid $1.20/h then $0.50/h <b>not bold</b> **not bold**"


def hostile_boot() -> Boot:
    """One instance whose id, stage detail and log lines would break markup, SQL or URLs if taken raw."""
    b = Boot(HOSTILE)
    facts(b, "NVIDIA 'GPU' $9 *9*", "9.0", 1.25)
    t = stages_ok(b, "benchmark", BASE_US)
    b.add(Lifecycle, t, stage="benchmark", state="started")
    b.lines(
        "benchmark",
        "stderr",
        ["ünïcødé ✓ \x1b[31mred\x1b[0m", LONG_LINE, "worker $5 *x* [l](u) was killed by signal SIGSEGV $6"],
        t + 1000,
    )
    b.lines("benchmark", "/tmp/it's 100%/dæmon $1.log", ["y" * 10_000], t + 5_000_000)
    b.add(Lifecycle, t + MIN, stage="benchmark", state="failed", detail=PRICED_DETAIL + " " + "z" * 10_000)
    return b


def kind_boots(now_us: int) -> list[Boot]:
    """Four instances whose benchmarks failed an hour ago with lines no rule knows: two new failure kinds.

    quorum: k1 ($1/h, rented 1 h before its failure: $1.00 lost), k2 ($2/h, 30 min: $1.00), k3 (no price);
    ledger: k4 (no price: what it lost is unknown). Their failure ids are kq1, kq2, kq3 and kl4.
    """
    spec = [
        ("k1", 1.0, HOUR, "zorblax quorum gone: peer 10.0.1.9:7001 answered 31 frames", "kq1"),
        ("k2", 2.0, HOUR // 2, "zorblax quorum gone: peer 10.0.2.9:7002 answered 977 frames", "kq2"),
        ("k3", None, HOUR, "zorblax quorum gone: peer 10.0.3.9:7003 answered 5 frames", "kq3"),
        ("k4", None, HOUR, "zorblax ledger 0x5dab turned away after 38ms", "kl4"),
    ]
    boots = []
    failed_us = now_us - HOUR
    for instance, price, paid_us, line, failure_id in spec:
        b = Boot(instance, failed_us - paid_us)
        if price is not None:
            facts(b, RTX4090, "8.9", price)
        b.add(Lifecycle, failed_us - paid_us + MIN // 2, stage="benchmark", state="started")
        b.lines("benchmark", "stderr", ["loading circuit", line], failed_us - 2 * MIN)
        b.add(Lifecycle, failed_us, event_id=failure_id, stage="benchmark", state="failed", detail="exit code 1")
        boots.append(b)
    return boots
