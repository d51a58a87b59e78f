"""`flightrec catalog start|stop|status`: a private local PostgreSQL for a DuckLake store."""

from __future__ import annotations

import argparse

from flightrec.settings import Settings


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("catalog", help="run a private local PostgreSQL as the catalog of a DuckLake store")
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    for name, help_ in (
        ("start", "start PostgreSQL (idempotent); the last line printed is the --db string to use"),
        ("stop", "stop PostgreSQL cleanly and wait"),
        ("status", "say whether PostgreSQL runs and answers"),
    ):
        a = actions.add_parser(name, help=help_)
        a.add_argument("--port", type=int, default=5432, help="the TCP port on 127.0.0.1 (default 5432)")
        a.add_argument("--data", default=None, help="data folder (default $FLIGHTREC_HOME/catalog-PORT)")
        a.set_defaults(func=_catalog)


def _catalog(args: argparse.Namespace, settings: Settings) -> int:
    from flightrec.catalog import LocalCatalog

    c = LocalCatalog(port=args.port, data=args.data, settings=settings)
    if args.action == "start":
        print(c.start())
    elif args.action == "stop":
        print(c.stop())
    else:
        status = c.status()
        print(status.line())
        if status.answering:
            print(c.db)
        return 0 if status.answering else 3
    return 0
