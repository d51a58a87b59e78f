"""The proving benchmark: warm-up proofs, measured proofs, a verdict, and the events that tell it.

It never imports the agent: the caller passes ``emit(EventClass, **fields)``,
which fills the envelope (event_id, instance_id, boot_id, seq, ts_us), sends the
event and returns it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from flightrec.cuda.backend import Prover, open_prover
from flightrec.cuda.gpu import DeviceError
from flightrec.cuda.proof import ProofParams
from flightrec.schemas import BenchmarkResult, Event, Lifecycle, Throughput

from flightrec.errors import ProveError

log = logging.getLogger(__name__)

Emit = Callable[..., Event]
STAGE = "benchmark"
EXIT_PASS, EXIT_FAIL, EXIT_ERROR = 0, 1, 2


@dataclass(frozen=True)
class Outcome:
    """What the benchmark concluded; ``exit_code`` is 0 pass, 1 below the minimum rate, 2 could not run."""

    verdict: str
    backend: str
    device: str
    proofs: int
    seconds: float
    proofs_per_hour: float
    detail: str = ""

    @property
    def exit_code(self) -> int:
        return {"pass": EXIT_PASS, "fail": EXIT_FAIL}.get(self.verdict, EXIT_ERROR)


def _fail(emit: Emit, backend: str, params: ProofParams, min_rate: float, exc: ProveError) -> Outcome:
    attrs = exc.attributes() if isinstance(exc, DeviceError) else {"cuda_error": "", "cause": "prove"}
    attrs["backend"] = backend
    text = exc.cuda_error if isinstance(exc, DeviceError) else str(exc)
    device = attrs.get("device", "")
    emit(Lifecycle, stage=STAGE, state="failed", detail=str(exc), attributes=attrs)
    emit(
        BenchmarkResult,
        stage=STAGE,
        backend=backend,
        device=device,
        proofs=0,
        proofs_per_hour=0.0,
        min_rate=min_rate,
        verdict="error",
        detail=text,
        params=params.as_strings(),
    )
    log.error("benchmark could not run: %s", exc)
    return Outcome("error", backend, device, 0, 0.0, 0.0, str(exc))


def run_benchmark(
    params: ProofParams,
    *,
    backend: str = "auto",
    warmup: int = 1,
    proofs: int = 3,
    min_rate: float = 0.0,
    seed: int = 1,
    emit: Emit,
    open_fn: Callable[[str, ProofParams], tuple[Prover, str]] = open_prover,
) -> Outcome:
    """Run ``warmup`` then ``proofs`` timed proofs (seeds seed, seed+1, ...) and emit what happened.

    Emits one Throughput per proof (phase warmup or measured), then one BenchmarkResult.
    When the backend cannot serve, emits a failed Lifecycle whose attributes carry
    the CUDA error, device, compute capability and driver version, and a BenchmarkResult
    with verdict "error". Never raises a ProveError: the Outcome says what happened.
    """
    if proofs < 1 or warmup < 0:
        raise ValueError("need at least one measured proof and a non-negative number of warm-up proofs")
    try:
        prover, fallback = open_fn(backend, params)
    except ProveError as exc:
        return _fail(emit, backend, params, min_rate, exc)
    if fallback:
        emit(
            Lifecycle,
            stage=STAGE,
            state="info",
            detail=f"CUDA cannot serve, proving on the CPU: {fallback}",
            attributes={"backend": "cpu", "cuda_error": fallback},
        )
    try:
        measured_s = 0.0
        for i in range(warmup + proofs):
            phase = "warmup" if i < warmup else "measured"
            t0 = time.perf_counter()
            root = prover.prove(seed + i)
            dt = time.perf_counter() - t0
            if phase == "measured":
                measured_s += dt
            emit(
                Throughput,
                stage=STAGE,
                backend=prover.backend,
                device=prover.device,
                proofs=1,
                seconds=dt,
                proofs_per_hour=3600.0 / dt if dt > 0 else 0.0,
                phase=phase,
                params={**params.as_strings(), "seed": str(seed + i), "root": root.hex()},
            )
            log.info("%s proof %d on %s: %.3f s, root %s", phase, i, prover.backend, dt, root.hex()[:16])
    except ProveError as exc:
        return _fail(emit, prover.backend, params, min_rate, exc)
    finally:
        prover.close()
    rate = 3600.0 * proofs / measured_s if measured_s > 0 else 0.0
    verdict = "pass" if rate >= min_rate else "fail"
    detail = f"{proofs} proofs in {measured_s:.3f} s: {rate:.1f} proofs/hour (minimum {min_rate:g})"
    emit(
        BenchmarkResult,
        stage=STAGE,
        backend=prover.backend,
        device=prover.device,
        proofs=proofs,
        proofs_per_hour=rate,
        min_rate=min_rate,
        verdict=verdict,
        detail=detail,
        params=params.as_strings(),
    )
    return Outcome(verdict, prover.backend, prover.device, proofs, measured_s, rate, detail)
