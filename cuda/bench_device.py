"""The GPU run in one command: environment, GPU root = CPU root on fresh seeds, NTT and proof timings.

On the GPU machine: `sh scripts/device_run.sh` (which runs this module and the GPU tests),
or `PYTHONSAFEPATH=1 python -m flightrec.cuda.bench_device`. It uses pycuda where it is
installed, else the driver through ctypes (flightrec.cuda.driver) with the kernels compiled
by NVRTC or nvcc; it installs nothing. `--backend cpu` is the rehearsal: the same code path
with the NumPy backend standing in for the device.

Sections, each size started only while the time budget lasts (`--budget-s`, 240 s):
roots (k = 8, 10, 12, 16 on fresh random seeds, device vs the CPU backend), timings
(k = 20..24: forward NTT and whole proof, GB/s against the bandwidth floor, proofs/hour),
and the whole proof against the CPU backend (k = 20) in the same run. Whatever happens
midway, it prints every result it has, a summary and one `RESULT {json}` line.
Exit status: 0 every root equal, 1 a root differs, 2 the device could not serve or the run broke.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import secrets
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Protocol

import numpy as np
from flightrec.cuda import device_env, ntt, plan
from flightrec.cuda.backend import cpu_model
from flightrec.cuda.gpu import DRIVERS, DeviceError
from flightrec.cuda.merkle import merkle_root
from flightrec.cuda.proof import ProofParams, extend, prove
from flightrec.cuda.trace import trace

log = logging.getLogger(__name__)

WIDTH, LOG_BLOWUP = 8, 2
EXIT_OK, EXIT_MISMATCH, EXIT_ERROR = 0, 1, 2


class BenchDevice(Protocol):
    """What the run needs of a backend: CudaProver, or CpuStandIn for the rehearsal."""

    driver: str

    @property
    def facts(self) -> dict[str, str]: ...

    def prove(self, seed: int) -> bytes: ...

    def extension(self) -> np.ndarray: ...

    def forward_ntt(self) -> None: ...

    def timed_ms(self, fn: Callable[[], object], repeats: int) -> float: ...

    def peak_bandwidth_gbs(self) -> float: ...

    def copy_bandwidth_gbs(self, repeats: int = 5) -> float: ...

    def close(self) -> None: ...


class CpuStandIn:
    """The NumPy backend behind CudaProver's benchmark surface: the rehearsal's 'device'."""

    driver = "numpy (CPU stand-in)"

    def __init__(self, params: ProofParams) -> None:
        self.params = params
        self._ext = np.zeros((params.width, params.m), dtype=np.uint64)
        self._tw = ntt.twiddles(params.log_m)
        self._facts = {
            "device": f"{cpu_model()} x{os.cpu_count() or 1} (CPU stand-in)",
            "compute_capability": "",
            "driver_version": "",
            "cuda_driver_api": self.driver,
        }

    @property
    def facts(self) -> dict[str, str]:
        return dict(self._facts)

    def prove(self, seed: int) -> bytes:
        self._ext = extend(trace(seed, self.params.width, self.params.log_n), self.params)
        return merkle_root(self._ext)

    def extension(self) -> np.ndarray:
        return self._ext.copy()

    def forward_ntt(self) -> None:
        self._ext = ntt.dit(self._ext, self._tw)

    def timed_ms(self, fn: Callable[[], object], repeats: int) -> float:
        out = []
        for _ in range(max(1, repeats)):
            t0 = time.perf_counter()
            fn()
            out.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(out)

    def peak_bandwidth_gbs(self) -> float:
        return 0.0  # no datasheet figure here: the floor falls back to the measured copy

    def copy_bandwidth_gbs(self, repeats: int = 5) -> float:
        src = self._ext
        dst = np.empty_like(src)
        ms = self.timed_ms(lambda: np.copyto(dst, src), repeats)
        return 2 * src.nbytes / (ms * 1e6) if ms > 0 else 0.0

    def close(self) -> None:
        return None

    def __enter__(self) -> CpuStandIn:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_device(backend: str, params: ProofParams, driver: str = "auto") -> BenchDevice:
    """A CudaProver (``cuda``) or the CPU stand-in (``cpu``) sized for ``params``."""
    if backend == "cpu":
        return CpuStandIn(params)
    from flightrec.cuda.gpu import CudaProver

    return CudaProver(params, driver=driver)


@dataclass(frozen=True)
class RootCheck:
    k: int
    seed: int
    device_root: str
    cpu_root: str
    device_ms: float
    cpu_ms: float
    equal: bool
    extension_equal: bool | None = None


@dataclass(frozen=True)
class Timing:
    k: int
    ntt_ms: float
    bytes_moved: int
    gbs: float
    peak_gbs: float
    copy_gbs: float
    floor_ms: float
    floor_ratio: float
    proof_ms: float
    proofs_per_hour: float


@dataclass(frozen=True)
class CpuComparison:
    k: int
    seed: int
    device_ms: float
    cpu_ms: float
    speedup: float
    equal: bool


@dataclass(frozen=True)
class Results:
    """Everything measured so far (its lists and maps fill in as the run goes); printed in full whatever stops it."""

    backend: str
    facts: dict[str, str] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    roots: list[RootCheck] = field(default_factory=list)
    timings: list[Timing] = field(default_factory=list)
    cpu: list[CpuComparison] = field(default_factory=list)
    stopped: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    @property
    def error(self) -> str:
        return "; ".join(self.errors)

    def as_json(self) -> dict[str, Any]:
        return asdict(self) | {"roots_equal": self.roots_equal, "error": self.error}

    @property
    def roots_equal(self) -> bool:
        return all(r.equal for r in self.roots) and all(c.equal for c in self.cpu)

    def exit_code(self) -> int:
        if not self.roots_equal:
            return EXIT_MISMATCH
        return EXIT_ERROR if self.error else EXIT_OK


def say(text: str = "") -> None:
    print(text, flush=True)


def _ms(fn: Callable[[], object]) -> tuple[Any, float]:
    t0 = time.perf_counter()
    out = fn()
    return out, (time.perf_counter() - t0) * 1e3


class Budget:
    """Seconds since the start against a limit: no new size starts past it."""

    def __init__(self, limit_s: float) -> None:
        self.limit_s = limit_s
        self.t0 = time.monotonic()

    def spent(self) -> float:
        return time.monotonic() - self.t0

    def allows(self, what: str, results: Results) -> bool:
        if self.spent() <= self.limit_s:
            return True
        note = f"stopped before {what}: time budget of {self.limit_s:g} s spent ({self.spent():.0f} s)"
        results.stopped.append(note)
        say(f"({note})")
        return False


def check_roots(backend: str, driver: str, ks: list[int], seeds: int, budget: Budget, res: Results) -> None:
    """The device's root against the CPU backend's on fresh random seeds; where one differs, the extension too."""
    say(f"\n== roots: device vs CPU backend, width {WIDTH}, blowup {1 << LOG_BLOWUP}, {seeds} fresh seeds per k")
    for k in ks:
        if not budget.allows(f"roots k={k}", res):
            return
        params = ProofParams(width=WIDTH, log_n=k, log_blowup=LOG_BLOWUP)
        dev = open_device(backend, params, driver)
        try:
            res.facts.update({} if res.facts else dev.facts)
            for _ in range(seeds):
                seed = secrets.randbits(64)
                g, g_ms = _ms(partial(dev.prove, seed))
                c, c_ms = _ms(partial(prove, seed, params))
                ext_equal = None
                if g != c:
                    ext_equal = bool((dev.extension() == extend(trace(seed, WIDTH, k), params)).all())
                res.roots.append(RootCheck(k, seed, g.hex(), c.hex(), g_ms, c_ms, g == c, ext_equal))
                verdict = (
                    "OK"
                    if g == c
                    else (
                        "MISMATCH (extension equal: the Merkle part differs)"
                        if ext_equal
                        else "MISMATCH (extension differs: the NTT/LDE part)"
                    )
                )
                say(
                    f"k={k:2d} seed={seed:#018x}: device {g.hex()[:16]} cpu {c.hex()[:16]} {verdict} "
                    f"(device {g_ms:.1f} ms, cpu {c_ms:.1f} ms)"
                )
        finally:
            dev.close()


TIMING_HEADER = (
    f"{'k':>3} {'ntt ms':>9} {'bytes moved':>12} {'GB/s':>8} {'peak GB/s':>9} {'copy GB/s':>9} "
    f"{'floor ms':>9} {'floor/time':>10} {'proof ms':>9} {'proofs/h':>10}"
)


def timing_line(t: Timing) -> str:
    return (
        f"{t.k:>3} {t.ntt_ms:9.3f} {t.bytes_moved:12.3e} {t.gbs:8.1f} {t.peak_gbs:9.0f} {t.copy_gbs:9.0f} "
        f"{t.floor_ms:9.3f} {t.floor_ratio:10.1%} {t.proof_ms:9.3f} {t.proofs_per_hour:10.1f}"
    )


def measure(dev: BenchDevice, params: ProofParams, ntt_repeats: int, proof_repeats: int) -> Timing:
    """One size: the forward NTT against the floor (one read + one write of the data at peak), the whole proof."""
    dev.prove(1)  # warm-up: loads everything, fills the extension
    peak, copy = dev.peak_bandwidth_gbs(), dev.copy_bandwidth_gbs()
    bandwidth = peak if peak > 0 else copy
    passes = len(plan.plan_passes(params.log_m, dif=False))
    data = 8 * params.width * params.m
    moved = 2 * data * passes
    ntt_ms = dev.timed_ms(dev.forward_ntt, ntt_repeats)
    floor_ms = 2 * data / (bandwidth * 1e9) * 1e3 if bandwidth > 0 else 0.0
    proof_ms = dev.timed_ms(lambda: dev.prove(2), proof_repeats)
    return Timing(
        params.log_n,
        ntt_ms,
        moved,
        moved / ntt_ms / 1e6 if ntt_ms > 0 else 0.0,
        peak,
        copy,
        floor_ms,
        floor_ms / ntt_ms if ntt_ms > 0 else 0.0,
        proof_ms,
        3.6e6 / proof_ms if proof_ms > 0 else 0.0,
    )


def time_sizes(
    backend: str, driver: str, ks: list[int], repeats: tuple[int, int], budget: Budget, res: Results
) -> None:
    say(f"\n== timings: forward NTT of the extension and the whole proof, width {WIDTH}, blowup {1 << LOG_BLOWUP}")
    say(
        "(bytes moved = 2 x data x passes; floor = one read + one write of the data at peak, or at the measured "
        "copy rate where the peak is unknown)"
    )
    say(TIMING_HEADER)
    for k in ks:
        if not budget.allows(f"timing k={k}", res):
            return
        params = ProofParams(width=WIDTH, log_n=k, log_blowup=LOG_BLOWUP)
        dev = open_device(backend, params, driver)
        try:
            res.facts.update({} if res.facts else dev.facts)
            t = measure(dev, params, *repeats)
        finally:
            dev.close()
        res.timings.append(t)
        say(timing_line(t))


def compare_cpu(backend: str, driver: str, ks: list[int], budget: Budget, res: Results) -> None:
    say("\n== whole proof: device vs the CPU backend (NumPy), same seed, same run")
    for k in ks:
        if not budget.allows(f"CPU comparison k={k}", res):
            return
        params = ProofParams(width=WIDTH, log_n=k, log_blowup=LOG_BLOWUP)
        seed = secrets.randbits(64)
        dev = open_device(backend, params, driver)
        try:
            dev.prove(seed)  # warm-up
            g = dev.prove(seed)
            g_ms = dev.timed_ms(partial(dev.prove, seed), 3)
        finally:
            dev.close()
        c, c_ms = _ms(partial(prove, seed, params))
        row = CpuComparison(k, seed, g_ms, c_ms, c_ms / g_ms if g_ms > 0 else 0.0, g == c)
        res.cpu.append(row)
        say(
            f"k={k:2d} seed={seed:#018x}: device {g_ms:.3f} ms, cpu {c_ms:.1f} ms, x{row.speedup:.1f}; "
            f"roots {'equal' if row.equal else 'DIFFER'}"
        )


def summary(res: Results, budget: Budget) -> str:
    """The whole result as text, ending in one RESULT {json} line."""
    lines = [
        "",
        "== summary",
        f"backend: {res.backend}; elapsed {budget.spent():.1f} s of a {budget.limit_s:g} s budget",
    ]
    lines += [f"{k}: {v}" for k, v in res.facts.items()]
    ok = sum(r.equal for r in res.roots)
    by_k = sorted({r.k for r in res.roots})
    lines.append(
        f"roots: {ok}/{len(res.roots)} equal (k = {', '.join(map(str, by_k)) or 'none'})"
        + ("" if res.roots_equal else "; MISMATCH: fix the smallest k that differs first")
    )
    if res.timings:
        lines += [TIMING_HEADER, *map(timing_line, res.timings)]
    for c in res.cpu:
        lines.append(
            f"k={c.k}: device {c.device_ms:.3f} ms vs cpu {c.cpu_ms:.1f} ms (x{c.speedup:.1f}), "
            f"roots {'equal' if c.equal else 'DIFFER'}"
        )
    lines += res.stopped
    if res.error:
        lines.append(f"error: {res.error}")
    lines += ["", "== markdown (for BENCHMARKS.md)", markdown(res), "", f"exit status {res.exit_code()}"]
    lines.append("RESULT " + json.dumps(res.as_json(), sort_keys=True))
    return "\n".join(lines)


def markdown(res: Results) -> str:
    """The figures as Markdown tables, ready for BENCHMARKS.md."""
    f = res.facts
    smi = res.env.get("nvidia-smi --query-gpu", "").splitlines()
    lines = [
        f"Device: {f.get('device', '?')} (compute capability {f.get('compute_capability', '?')}), CUDA driver API "
        f"{f.get('driver_version', '?')}, through {f.get('cuda_driver_api', '?')}; NVRTC: {res.env.get('NVRTC', '?')}.",
        f"nvidia-smi: {smi[-1] if len(smi) > 1 else 'n/a'} ({smi[0] if smi else ''})",
        "",
        "| k | seed | device root | CPU root | equal |",
        "| ---: | --- | --- | --- | --- |",
    ]
    lines += [
        f"| {r.k} | `{r.seed:#018x}` | `{r.device_root[:16]}` | `{r.cpu_root[:16]}` | "
        f"{'yes' if r.equal else '**NO**'} |"
        for r in res.roots
    ]
    lines += [
        "",
        "| k | NTT ms | GB/s | peak GB/s | copy GB/s | floor/time | proof ms | proofs/hour |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    lines += [
        f"| {t.k} | {t.ntt_ms:.3f} | {t.gbs:,.0f} | {t.peak_gbs:,.0f} | {t.copy_gbs:,.0f} | {t.floor_ratio:.1%} | "
        f"{t.proof_ms:.3f} | {t.proofs_per_hour:,.0f} |"
        for t in res.timings
    ]
    lines += [
        "",
        "| k | device proof ms | CPU proof ms | device/CPU speed-up | roots |",
        "| ---: | ---: | ---: | ---: | --- |",
    ]
    lines += [
        f"| {c.k} | {c.device_ms:.3f} | {c.cpu_ms:,.1f} | {c.speedup:,.0f}x | {'equal' if c.equal else '**differ**'} |"
        for c in res.cpu
    ]
    return "\n".join(lines)


def _int_list(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"a comma-separated list of integers, e.g. 20,21,22; got {text!r}") from exc


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m flightrec.cuda.bench_device",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument(
        "--backend",
        choices=["cuda", "cpu"],
        default="cuda",
        help="cuda: the GPU; cpu: the rehearsal, the NumPy backend standing in for the device",
    )
    ap.add_argument(
        "--driver", choices=DRIVERS, default="auto", help="pycuda, ctypes (libcuda), or auto: pycuda if installed"
    )
    ap.add_argument("--roots-k", type=_int_list, default=[8, 10, 12, 16], help="sizes of the root check (8,10,12,16)")
    ap.add_argument("--seeds", type=int, default=3, help="fresh random seeds per size of the root check (3)")
    ap.add_argument("--ks", type=_int_list, default=None, help="timed sizes, overriding --kmin/--kmax")
    ap.add_argument("--kmin", type=int, default=20)
    ap.add_argument("--kmax", type=int, default=24)
    ap.add_argument(
        "--cpu-k", type=_int_list, default=[20], help="sizes of the whole-proof comparison with the CPU (20)"
    )
    ap.add_argument("--ntt-repeats", type=int, default=5)
    ap.add_argument("--proof-repeats", type=int, default=3)
    ap.add_argument("--budget-s", type=float, default=240.0, help="start no new size past this many seconds (240)")
    ap.add_argument("--json", type=Path, default=None, help="also write the results as JSON to this file")
    ap.add_argument("--no-smi", action="store_true", help="skip nvidia-smi in the environment report")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    budget = Budget(args.budget_s)
    res = Results(backend=args.backend)
    ks = args.ks if args.ks is not None else list(range(args.kmin, args.kmax + 1))
    say(f"== flightrec bench_device {' '.join(sys.argv[1:] if argv is None else argv)}")
    say(f"started {time.strftime('%Y-%m-%d %H:%M:%S %Z')}")
    try:
        found = device_env.probes(with_smi=not args.no_smi)
        res.env.update({p.label: p.text for p in found})
        say(device_env.render(found))
        check_roots(args.backend, args.driver, args.roots_k, args.seeds, budget, res)
        time_sizes(args.backend, args.driver, ks, (args.ntt_repeats, args.proof_repeats), budget, res)
        compare_cpu(args.backend, args.driver, args.cpu_k, budget, res)
    except DeviceError as exc:
        res.errors.append(f"CUDA cannot serve: {exc}; attributes {exc.attributes()}")
        say(res.error)
    except BaseException as exc:  # noqa: BLE001 - whatever breaks, what was measured is printed below
        res.errors.append("interrupted" if isinstance(exc, KeyboardInterrupt) else f"{type(exc).__name__}: {exc}")
        say(traceback.format_exc().rstrip())
    finally:
        text = summary(res, budget)
        say(text)
        if args.json is not None:
            args.json.write_text(json.dumps(res.as_json(), indent=2, sort_keys=True))
    return res.exit_code()


if __name__ == "__main__":
    sys.exit(main())
