"""`flightrec prove bench`: the proving core's benchmark (cuda/)."""

from __future__ import annotations

import argparse

from flightrec.settings import Settings


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("prove", help="the proving core")
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    b = actions.add_parser("bench", help="run the proving benchmark and emit its throughput")
    b.add_argument("--instance", default=None)
    b.add_argument("--backend", choices=["auto", "cuda", "cpu"], default="auto")
    b.add_argument("--k", type=int, default=20)
    b.add_argument("--warmup", type=int, default=1)
    b.add_argument("--proofs", type=int, default=3)
    b.add_argument("--min-rate", type=float, default=0.0)
    b.set_defaults(func=_todo)


def _todo(args: argparse.Namespace, settings: Settings) -> int:
    from flightrec.cli import not_built

    return not_built("prove bench", "issue 6")
