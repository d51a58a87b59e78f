"""`flightrec prove bench`: the proving core's benchmark (cuda/), its events sent through the agent."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from flightrec.errors import ProveError
from flightrec.settings import Settings


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("prove", help="the proving core")
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    b = actions.add_parser(
        "bench",
        help="run the proving benchmark and emit its throughput",
        description="Warm-up proofs, then measured ones; emits a Throughput event per proof and a "
        "BenchmarkResult. Exit status: 0 pass, 1 below --min-rate, 2 the backend could not run.",
    )
    b.add_argument("--instance", default=None, help="instance id (default: FLIGHTREC_INSTANCE, then the host name)")
    b.add_argument(
        "--backend",
        choices=["auto", "cuda", "cpu"],
        default="auto",
        help="cuda, cpu, or auto: cuda where a GPU and pycuda exist (default auto)",
    )
    b.add_argument("--k", type=int, default=20, help="log2 of the trace's rows (default 20)")
    b.add_argument("--width", type=int, default=8, help="trace columns (default 8)")
    b.add_argument("--blowup", type=int, default=4, help="extension factor, a power of two (default 4)")
    b.add_argument("--warmup", type=int, default=1, help="warm-up proofs, not counted (default 1)")
    b.add_argument("--proofs", type=int, default=3, help="measured proofs (default 3)")
    b.add_argument("--min-rate", type=float, default=0.0, help="minimum proofs/hour to pass (default 0)")
    b.add_argument("--seed", type=int, default=1, help="seed of the first proof's trace; proof i uses seed+i")
    b.add_argument(
        "--print",
        dest="print_events",
        action="store_true",
        help="print the events as JSON lines on stdout instead of sending them",
    )
    b.set_defaults(func=_bench)


@contextmanager
def _printer(instance: str) -> Iterator[Callable[..., Any]]:
    from flightrec.schemas import Event, new_event_id, now_us

    boot = new_event_id()
    seq = iter(range(1 << 62))

    def emit(cls: type[Event], **fields: Any) -> Any:
        event = cls(
            event_id=new_event_id(), instance_id=instance, boot_id=boot, seq=next(seq), ts_us=now_us(), **fields
        )
        print(json.dumps({"name": cls.name, **event.to_record()}, default=dict), flush=True)
        return event

    yield emit


@contextmanager
def _agent(instance: str, settings: Settings) -> Iterator[Callable[..., Any]]:
    try:
        from flightrec.producer import open_agent
    except ImportError as exc:
        raise ProveError(f"the agent library is missing ({exc}); use --print to write the events to stdout") from exc
    with open_agent(instance_id=instance, settings=settings) as agent:
        yield agent.emit


def _bench(args: argparse.Namespace, settings: Settings) -> int:
    from flightrec.cuda.bench import run_benchmark
    from flightrec.cuda.proof import ProofParams

    blowup = args.blowup
    if blowup < 2 or blowup & (blowup - 1):
        raise ProveError(f"--blowup must be a power of two >= 2; got {blowup}")
    try:
        params = ProofParams(width=args.width, log_n=args.k, log_blowup=blowup.bit_length() - 1)
    except ValueError as exc:
        raise ProveError(f"{exc}; choose another --k, --width or --blowup") from exc
    if args.proofs < 1 or args.warmup < 0:
        raise ProveError("--proofs must be >= 1 and --warmup >= 0")
    instance = args.instance or settings.instance
    sink = _printer(instance) if args.print_events else _agent(instance, settings)
    with sink as emit:
        outcome = run_benchmark(
            params,
            backend=args.backend,
            warmup=args.warmup,
            proofs=args.proofs,
            min_rate=args.min_rate,
            seed=args.seed,
            emit=emit,
        )
    stream = sys.stderr
    print(
        f"flightrec prove bench: {outcome.verdict} on {outcome.backend} ({outcome.device}): {outcome.detail}",
        file=stream,
    )
    return outcome.exit_code
