"""`flightrec materialize|replay|timeline|wait-sealed`: the materializer (consumers/)."""

from __future__ import annotations

import argparse

from flightrec.settings import Settings


def register(sub: argparse._SubParsersAction) -> None:
    m = sub.add_parser("materialize", help="consume all topics into DuckDB")
    m.add_argument("--db", default=None)
    m.add_argument("--until-idle", type=float, default=None, metavar="SECONDS")
    m.add_argument("--group", default=None)
    m.set_defaults(func=_todo, what="materialize")
    r = sub.add_parser("replay", help="rebuild a database from the topics")
    r.add_argument("--db", default=None)
    r.add_argument("--since", default=None)
    r.add_argument("--instance", default=None)
    r.set_defaults(func=_todo, what="replay")
    t = sub.add_parser("timeline", help="print one instance's life")
    t.add_argument("instance")
    t.add_argument("--db", default=None)
    t.set_defaults(func=_todo, what="timeline")
    w = sub.add_parser("wait-sealed", help="wait until an instance's evidence is complete")
    w.add_argument("instance")
    w.add_argument("--db", default=None)
    w.add_argument("--timeout", type=float, default=60.0)
    w.set_defaults(func=_todo, what="wait-sealed")


def _todo(args: argparse.Namespace, settings: Settings) -> int:
    from flightrec.cli import not_built

    return not_built(args.what, "issue 4")
