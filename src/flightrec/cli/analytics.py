"""`flightrec dashboard`: the Streamlit app (analytics/)."""

from __future__ import annotations

import argparse

from flightrec.settings import Settings


def register(sub: argparse._SubParsersAction) -> None:
    d = sub.add_parser("dashboard", help="start the Streamlit app")
    d.add_argument("--db", default=None)
    d.add_argument("--port", type=int, default=8501)
    d.set_defaults(func=_todo, what="dashboard")


def _todo(args: argparse.Namespace, settings: Settings) -> int:
    from flightrec.cli import not_built

    return not_built(args.what, "issue 5")
