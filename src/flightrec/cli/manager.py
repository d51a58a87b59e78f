"""`flightrec manager event`: events about an instance from the controller's side (never in its boot seq)."""

from __future__ import annotations

import argparse
import sys

from flightrec.cli.agent import parse_attrs
from flightrec.settings import Settings


def register(sub: argparse._SubParsersAction) -> None:
    from flightrec.schemas import MANAGER_KINDS

    p = sub.add_parser("manager", help="events about an instance from the manager's side")
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    ev = actions.add_parser("event", help="publish one manager event about an instance (rented, destroyed, ...)")
    ev.add_argument("--instance", required=True, help="the instance the event is about")
    ev.add_argument("--kind", required=True, choices=MANAGER_KINDS, help="what the manager did or says")
    ev.add_argument("--detail", default="", help="why, in words (shown in the timeline and the dashboard)")
    ev.add_argument("--attr", action="append", default=[], metavar="K=V", help="an attribute (repeatable)")
    ev.add_argument(
        "--source",
        default=None,
        help="this manager's source id (default manager@<host name>); it has its own spool and seq",
    )
    ev.add_argument("--spool", default=None, help="spool root (default $FLIGHTREC_SPOOL); events go under manager/")
    ev.add_argument("--bootstrap", default=None, help="Kafka bootstrap servers (default $FLIGHTREC_BOOTSTRAP)")
    ev.add_argument(
        "--flush-timeout",
        type=float,
        default=None,
        metavar="S",
        help="seconds to wait for Kafka (default $FLIGHTREC_FLUSH_TIMEOUT, 10)",
    )
    ev.set_defaults(func=_event)


def _event(args: argparse.Namespace, settings: Settings) -> int:
    from flightrec.producer.manager import send_manager_event

    attrs = parse_attrs(args.attr)
    s = settings.with_overrides(spool=args.spool, bootstrap=args.bootstrap, flush_timeout=args.flush_timeout)
    ev, ok = send_manager_event(s, args.instance, args.kind, args.detail, attrs, args.source)
    where = "delivered" if ok else "spooled, not yet delivered"
    print(f"{ev.kind} {ev.instance_id} by {ev.source_id}: {where}", file=sys.stdout if ok else sys.stderr)
    return 0
