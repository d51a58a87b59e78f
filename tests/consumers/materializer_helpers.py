"""Helpers for the materializer tests: boots built from flightrec.schemas, published like the agent does."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flightrec.schemas import (
    BenchmarkResult,
    Event,
    FileTail,
    InstanceFacts,
    Lifecycle,
    LogBatch,
    ProcessExit,
    Sealed,
    Throughput,
    encode,
)

T0 = 1_750_000_000_000_000  # a fixed epoch (µs) so runs are reproducible


@dataclass
class Boot:
    """One boot of one instance: events with gap-free seq, as the agent numbers them."""

    instance: str = field(default_factory=lambda: f"i-{uuid.uuid4().hex[:12]}")
    boot: str = field(default_factory=lambda: f"b-{uuid.uuid4().hex[:8]}")
    t0: int = T0
    events: list[Event] = field(default_factory=list)

    def _env(self) -> dict[str, Any]:
        seq = len(self.events)
        return dict(
            event_id=str(uuid.uuid4()),
            instance_id=self.instance,
            boot_id=self.boot,
            seq=seq,
            ts_us=self.t0 + seq * 1000,
        )

    def add(self, cls: type, **fields: Any) -> Event:
        ev = cls(**self._env(), **fields)
        self.events.append(ev)
        return ev

    def facts(self, **fields: Any) -> Event:
        base = dict(
            gpu_model="NVIDIA RTX PRO 4000 Blackwell",
            gpu_count=1,
            gpu_memory_mib=24000,
            driver_version="570.86",
            cuda_version="12.8",
            compute_capability="12.0",
            host="host-1",
            price_per_hour=0.35,
        )
        return self.add(InstanceFacts, **{**base, **fields})

    def lines(self, stage: str, source: str, texts: list[str], first_line: int = 1, pid: int = 100) -> Event:
        n = len(texts)
        base = self.t0 + len(self.events) * 1000
        return self.add(
            LogBatch,
            stage=stage,
            source=source,
            pid=pid,
            line_no=list(range(first_line, first_line + n)),
            line_ts_us=[base + i for i in range(n)],
            text=texts,
            truncated=[False] * n,
            invalid_utf8=[False] * n,
        )

    def exit(
        self,
        stage: str,
        code: int | None = 0,
        signal: int | None = None,
        stderr: Iterable[str] = (),
        files: Iterable[FileTail] = (),
        **kw: Any,
    ) -> Event:
        return self.add(
            ProcessExit,
            stage=stage,
            argv=[stage, "--run"],
            pid=100,
            exit_code=code,
            signal=signal,
            started_us=self.t0,
            ended_us=self.t0 + 5_000_000,
            duration_s=5.0,
            stderr_tail=list(stderr),
            file_tails=list(files),
            **kw,
        )

    def stage_ok(self, stage: str, texts: list[str] | None = None) -> None:
        self.add(Lifecycle, stage=stage, state="started")
        if texts:
            self.lines(stage, "stdout", texts)
        self.exit(stage, 0)
        self.add(Lifecycle, stage=stage, state="succeeded")

    def seal(self) -> Event:
        return self.add(Sealed, event_count=len(self.events) + 1, reason="entrypoint ended")

    def benchmark(self, pph: float, min_rate: float, verdict: str, detail: str = "") -> Event:
        self.add(
            Throughput,
            stage="benchmark",
            backend="cuda",
            device="gpu0",
            proofs=3,
            seconds=10.0,
            proofs_per_hour=pph,
            phase="measured",
        )
        return self.add(
            BenchmarkResult,
            stage="benchmark",
            backend="cuda",
            device="gpu0",
            proofs=3,
            proofs_per_hour=pph,
            min_rate=min_rate,
            verdict=verdict,
            detail=detail,
        )


def motivating_boot() -> Boot:
    """The incident: the daemon logs 'no kernel image' only to its own file and exits 1."""
    b = Boot()
    log = "/var/log/prover-daemon.log"
    cuda = "CUDA error: no kernel image is available for execution on the device (cudaErrorNoKernelImageForDevice)"
    b.facts()
    b.stage_ok("tunnel", ["tunnel up"])
    b.stage_ok("register", ["registered as worker 7"])
    b.stage_ok("params", ["params ok"])
    b.add(Lifecycle, stage="benchmark", state="started")
    b.lines("benchmark", "stdout", ["starting prover daemon", "warming up 3 proofs"])
    b.lines("benchmark", log, ["daemon v1.4.2 starting", "loading params", cuda, "daemon exiting"])
    b.lines("benchmark", "stderr", ["benchmark exited with error"])
    b.benchmark(0.0, 10.0, "error", "0 proofs completed")
    b.exit(
        "benchmark",
        1,
        stderr=["benchmark exited with error"],
        files=[FileTail(log, ["loading params", cuda, "daemon exiting"])],
    )
    b.add(Lifecycle, stage="benchmark", state="failed", detail="benchmark exited with error")
    b.seal()
    return b


async def publish_async(
    bootstrap: str, events: Iterable[Event], raw: Iterable[tuple[str, bytes | None, bytes | None]] = ()
) -> None:
    """Publish like the agent: acks=all, idempotent, key = instance id, each event on its topic."""
    from aiokafka import AIOKafkaProducer

    p = AIOKafkaProducer(
        bootstrap_servers=bootstrap, acks="all", enable_idempotence=True, linger_ms=5, max_request_size=8 << 20
    )
    await p.start()
    try:
        futs = [await p.send(e.topic, encode(e), key=e.instance_id.encode()) for e in events]
        futs += [await p.send(topic, value, key=key) for topic, key, value in raw]
        await p.flush()
        for f in futs:
            await f
    finally:
        await p.stop()


def publish(
    bootstrap: str, events: Iterable[Event], raw: Iterable[tuple[str, bytes | None, bytes | None]] = ()
) -> None:
    asyncio.run(publish_async(bootstrap, list(events), list(raw)))


def flightrec(*args: str, env: dict[str, str], timeout: float = 240, check: bool = True) -> subprocess.CompletedProcess:
    """Run the real `flightrec` command in a subprocess."""
    exe = Path(sys.executable).with_name("flightrec")
    proc = subprocess.run(
        [str(exe), *args], env={**env, "PYTHONSAFEPATH": "1"}, capture_output=True, text=True, timeout=timeout
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"flightrec {' '.join(args)} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    return proc


def materialize(kafka: Any, db: Path, idle: float = 1.5, from_mark: bool = True, **opts: Any) -> Any:
    """Run the materializer in-process until it is caught up and idle; a new database starts at the test's
    mark of the topics (``Kafka.seed_at_mark``). ``from_mark=False`` (or a replay) reads them from the
    beginning, as a test that compares the live tables with a `flightrec replay` of the whole topics must."""
    from flightrec.consumers.materializer import Materializer, Options

    if from_mark and not opts.get("replay"):
        kafka.seed_at_mark(db, opts.get("group"))

    async def go() -> Any:
        async with Materializer(kafka.settings.kafka_kwargs(), Options(db=str(db), until_idle=idle, **opts)) as m:
            return await m.run()

    return asyncio.run(go())


def serving(db: Path) -> bool:
    """Whether a running materializer has published a snapshot of ``db`` for readers (flightrec.db.snapshot)."""
    from flightrec.db import snapshot

    published = snapshot.current(db)
    return published is not None and published.path is not None
