"""`flightrec sql`: read-only SQL over the database, live or not (see flightrec.query)."""

from __future__ import annotations

import argparse

from flightrec.settings import Settings


def register(sub: argparse._SubParsersAction) -> None:
    s = sub.add_parser("sql", help="run read-only SQL and print the result")
    s.add_argument("query")
    s.add_argument("--db", default=None)
    s.set_defaults(func=_todo, what="sql")


def _todo(args: argparse.Namespace, settings: Settings) -> int:
    from flightrec.cli import not_built

    return not_built(args.what, "issue 4")
