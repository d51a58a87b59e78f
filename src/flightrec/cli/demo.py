"""`flightrec demo`: the whole system on one machine with a simulated fleet."""

from __future__ import annotations

import argparse
from pathlib import Path

from flightrec.settings import Settings

DEMO_PORT = 9192  # = flightrec.demo.system.DEMO_PORT (not imported here: `flightrec --help` stays quick)


def register(sub: argparse._SubParsersAction) -> None:
    d = sub.add_parser("demo", help="broker, materializer, a simulated fleet and the dashboard")
    d.add_argument("--instances", type=int, default=12, help="fleet size (default 12; the first 6 meet failure fates)")
    d.add_argument("--fresh", action="store_true", help="start over: stop the demo broker and delete its data")
    d.add_argument(
        "--headless", action="store_true", help="no dashboard; exit once the fleet is materialized (for tests and CI)"
    )
    d.add_argument(
        "--port",
        type=int,
        default=DEMO_PORT,
        help=f"the demo broker's own port (default {DEMO_PORT}, not 9092: no other producer writes into the demo)",
    )
    d.add_argument("--dashboard-port", type=int, default=8501, help="the dashboard's port (default 8501)")
    d.add_argument("--home", default=None, help="the demo's folder (default $FLIGHTREC_HOME/demo)")
    d.add_argument(
        "--supervisor-seconds",
        type=float,
        default=6.0,
        help="how long each healthy instance proves in production before it ends (default 6)",
    )
    d.add_argument(
        "--security",
        choices=["plaintext", "sasl_ssl"],
        default="plaintext",
        help="sasl_ssl: the demo's broker requires SCRAM-SHA-512 over TLS and every process uses it",
    )
    d.set_defaults(func=_demo)


def _demo(args: argparse.Namespace, settings: Settings) -> int:
    from flightrec.demo.system import Demo

    home = Path(args.home) if args.home else Path(settings.home) / "demo"
    return Demo(
        settings=settings,
        instances=args.instances,
        fresh=args.fresh,
        headless=args.headless,
        port=args.port,
        dashboard_port=args.dashboard_port,
        home=home,
        supervisor_seconds=args.supervisor_seconds,
        security=args.security,
    ).run()
