"""`flightrec demo`: the whole system on one machine."""

from __future__ import annotations

import argparse

from flightrec.settings import Settings


def register(sub: argparse._SubParsersAction) -> None:
    d = sub.add_parser("demo", help="broker, materializer, a simulated fleet and the dashboard")
    d.add_argument("--instances", type=int, default=12)
    d.add_argument("--fresh", action="store_true")
    d.add_argument("--port", type=int, default=9092, help="the local broker's port")
    d.set_defaults(func=_demo)


def _demo(args: argparse.Namespace, settings: Settings) -> int:
    from flightrec.broker import LocalBroker

    broker = LocalBroker(port=args.port, settings=settings)
    print(broker.start(), flush=True)
    print("demo: started the local broker. The agent, materializer, fleet and dashboard"
          " are not built yet (issues 3-7); stop the broker with `flightrec broker stop`.")
    return 0
