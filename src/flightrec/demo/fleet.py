"""Stand-ins for an instance's real stage commands, used by the demo's simulated fleet.

`python -m flightrec.demo.fleet STAGE --fate FATE ...` behaves like the real tunnel,
registration, parameter download, proving daemon, benchmark and supervisor of a
GPU proving container — including the ways real ones fail. The benchmark runs the
real proving core (`flightrec prove bench --backend cpu`) at a small size.
Nothing here talks to Kafka: the agent that wraps each stage does.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

FATES = ("healthy", "no_kernel_image", "cuda_oom", "params_download", "too_slow", "daemon_signal", "destroyed")
READY_S = 2.0  # the benchmark gives up on a daemon not ready this long after it began loading
LOADING_S = 3.0  # the no_kernel_image daemon loads this long, silent, before its CUDA error (after the script gave up)


@dataclass(frozen=True)
class Gpu:
    """A GPU model as `nvidia-smi` would describe it, with a typical hourly rental price."""

    model: str
    memory_mib: int
    compute_capability: str
    price_per_hour: float


GPUS = {
    "rtx4090": Gpu("NVIDIA GeForce RTX 4090", 24564, "8.9", 0.34),
    "rtxpro4000": Gpu("NVIDIA RTX PRO 4000 Blackwell", 24467, "12.0", 0.28),
    "a40": Gpu("NVIDIA A40", 46068, "8.6", 0.39),
    "l40s": Gpu("NVIDIA L40S", 46068, "8.9", 0.79),
    "h100": Gpu("NVIDIA H100 80GB HBM3", 81559, "9.0", 2.19),
    "a100": Gpu("NVIDIA A100-SXM4-80GB", 81920, "8.0", 1.29),
}

# Which GPU each fate runs on: the motivating case is a Blackwell card (sm_120)
# whose proving binary was built without sm_120 kernels.
FATE_GPU = {
    "healthy": ("rtx4090", "h100", "l40s", "a100", "a40"),
    "no_kernel_image": ("rtxpro4000",),
    "cuda_oom": ("rtx4090",),
    "params_download": ("a40",),
    "too_slow": ("a40",),
    "daemon_signal": ("l40s",),
    "destroyed": ("h100",),
}


def _say(*lines: str, err: bool = False) -> None:
    stream = sys.stderr if err else sys.stdout
    for line in lines:
        print(line, file=stream, flush=True)


def tunnel(args: argparse.Namespace) -> int:
    """Stays up for the instance's whole life, until the entrypoint stops it."""
    _say(f"opening reverse tunnel to {args.manager} ...")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    time.sleep(0.2)
    _say("tunnel up: remote port 40022 -> localhost:22")
    try:
        while True:
            time.sleep(1.0)
    except KeyboardInterrupt:
        return 0


def register(args: argparse.Namespace) -> int:
    instance = os.environ.get("FLIGHTREC_INSTANCE", "instance")
    _say(f'POST {args.manager}/v1/instances {{"id": "{instance}", "protocol": 3}}', "registered: 201 Created")
    return 0


def params(args: argparse.Namespace) -> int:
    url = f"{args.manager}/params/groth16-k22.params"
    _say(f"fetching {url}")
    if args.fate == "params_download":
        time.sleep(0.3)
        _say(f"curl: (22) The requested URL returned error: 404 Not Found: {url}", err=True)
        _say("parameter download failed after 3 attempts", err=True)
        return 22
    # A carriage-return progress bar, as curl and wget draw it.
    for pct in range(0, 101, 10):
        sys.stdout.write(f"\r  {pct:3d}% [{'#' * (pct // 5):<20}] {pct * 18 // 100} MiB/s")
        sys.stdout.flush()
        time.sleep(0.03)
    _say("", "parameters verified: sha256 ok")
    return 0


def daemon(args: argparse.Namespace) -> int:
    """The proving daemon: writes only to its own log file, as the real one does."""
    with open(args.log, "a", buffering=1) as log:

        def w(line: str) -> None:
            log.write(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} {line}\n")

        w(f"prover daemon starting, pid {os.getpid()}")
        w("loading parameters from /params/groth16-k22.params")
        time.sleep(0.3)
        if args.fate == "no_kernel_image":  # as in the field: seconds of loading, silent, after the benchmark gave up
            time.sleep(LOADING_S)
            w("initialising CUDA device 0")
            w("CUDA error: no kernel image is available for execution on the device (cudaErrorNoKernelImageForDevice)")
            w("fatal: GPU self-test failed, exiting")
            return 1
        if args.fate == "cuda_oom":
            w("allocating 23.50 GiB of device memory for the MSM tables")
            w("CUDA error: out of memory (cudaErrorMemoryAllocation) while allocating 23.50 GiB")
            return 1
        if args.fate == "daemon_signal":
            w("self-test proof 1 started")
            time.sleep(0.2)
            os.kill(os.getpid(), signal.SIGSEGV)
        w("ready: listening on 127.0.0.1:9500")
        n = 0
        while True:  # idle: the benchmark proves in its own process, so the daemon claims no proofs (its log would
            time.sleep(2.0)  # then disagree with the measured rate beside it, as "proof N done" every 0.5 s did)
            n += 1
            w(f"health check {n}: ok, no job queued")


def benchmark(args: argparse.Namespace) -> int:
    """Start the daemon, check it is up, then measure proofs/hour with the real proving core."""
    _say(f"starting prover daemon (log {args.log})")
    Path(args.log).parent.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen(
        [sys.executable, "-m", "flightrec.demo.fleet", "daemon", "--fate", args.fate, "--log", args.log],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 60
    log = Path(args.log)
    ready = False
    while proc.poll() is None and time.monotonic() < deadline:  # wait for "ready", or for the daemon's death
        text = log.read_text(errors="replace") if log.exists() else ""
        if "ready: listening" in text:
            ready = True
            break
        if "loading parameters" in text:  # started: now it has READY_S to be ready
            deadline = min(deadline, time.monotonic() + READY_S)
        time.sleep(0.1)
    if not ready and proc.poll() is None:  # the seed's failure: the script gives up, the daemon loads on and
        # writes why it failed to its own log seconds after the script exited (the seal waits for that line)
        _say(f"benchmark: prover daemon (pid {proc.pid}) not ready after {READY_S:g} s", err=True)
        _say("benchmark: 0 proofs (0 proofs/hour)", "benchmark exited with error", err=True)
        return 1
    if proc.poll() is not None:
        if proc.returncode < 0:
            name = signal.Signals(-proc.returncode).name
            _say(f"prover daemon (pid {proc.pid}) was killed by signal {name} (core dumped)", err=True)
        _say("benchmark: 0 proofs in 1.0 s (0 proofs/hour)", "benchmark exited with error", err=True)
        return 1
    try:
        cmd = [
            sys.executable,
            "-m",
            "flightrec",
            "prove",
            "bench",
            "--backend",
            "cpu",
            "--k",
            str(args.k),
            "--warmup",
            "1",
            "--proofs",
            str(args.proofs),
            "--min-rate",
            str(args.min_rate),
        ]
        return subprocess.call(cmd)
    finally:
        proc.terminate()
        proc.wait()


def supervisor(args: argparse.Namespace) -> int:
    _say("supervisor: production proving")
    for n in range(1, int(args.seconds / 0.5) + 1):
        time.sleep(0.5)
        _say(f"job {n}: proof submitted to manager")
    _say("supervisor: maintenance window, shutting down")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m flightrec.demo.fleet", description=__doc__.splitlines()[0])
    p.add_argument("stage", choices=["tunnel", "register", "params", "daemon", "benchmark", "supervisor"])
    p.add_argument("--fate", choices=FATES, default="healthy")
    p.add_argument("--manager", default="http://manager.internal:8080")
    p.add_argument("--log", default="/tmp/prover.log")
    p.add_argument("--k", type=int, default=10)
    p.add_argument("--proofs", type=int, default=2)
    p.add_argument("--min-rate", type=float, default=1.0)
    p.add_argument("--seconds", type=float, default=8.0)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return {
        "tunnel": tunnel,
        "register": register,
        "params": params,
        "daemon": daemon,
        "benchmark": benchmark,
        "supervisor": supervisor,
    }[args.stage](args)


if __name__ == "__main__":
    raise SystemExit(main())
