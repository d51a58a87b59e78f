"""`flightrec agent run|event|flush|seal`: the instance agent (producer/)."""

from __future__ import annotations

import argparse

from flightrec.settings import Settings


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("agent", help="the instance agent: wrap stages, publish events")
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    run = actions.add_parser("run", help="run CMD as a stage and publish its lines and exit")
    run.add_argument("--instance", default=None)
    run.add_argument("--stage", required=True)
    run.add_argument("--tail", action="append", default=[], metavar="PATH")
    run.add_argument("cmd", nargs=argparse.REMAINDER)
    run.set_defaults(func=_todo)
    ev = actions.add_parser("event", help="publish one lifecycle event")
    ev.add_argument("--instance", default=None)
    ev.add_argument("--stage", required=True)
    ev.add_argument("--state", required=True)
    ev.add_argument("--detail", default="")
    ev.add_argument("--attr", action="append", default=[], metavar="K=V")
    ev.set_defaults(func=_todo)
    for name in ("flush", "seal"):
        a = actions.add_parser(name)
        a.add_argument("--instance", default=None)
        a.set_defaults(func=_todo)


def _todo(args: argparse.Namespace, settings: Settings) -> int:
    from flightrec.cli import not_built

    return not_built(f"agent {args.action}", "issue 3")
