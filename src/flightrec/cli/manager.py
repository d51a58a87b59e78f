"""`flightrec manager event|enroll|fleet-key`: the controller's side: events about an instance, and its keys."""

from __future__ import annotations

import argparse
import dataclasses
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
    delivery_flags(ev)
    ev.set_defaults(func=_event)
    fo = actions.add_parser(
        "forget",
        help="say that an instance should never have existed (made by mistake): it leaves the fleet and its alerts; "
        "a manager event, so a replay forgets it too; it comes back if it is heard from again",
    )
    fo.add_argument("--instance", required=True, help="the instance to forget")
    fo.add_argument("--detail", default="", help="why, in words (kept with the event)")
    delivery_flags(fo)
    fo.set_defaults(func=_forget)
    en = actions.add_parser(
        "enroll",
        help="make an instance's key (needs FLIGHTREC_FLEET_KEY); prints the NAME=value lines for its environment",
    )
    en.add_argument("--instance", required=True, help="the instance being rented (its FLIGHTREC_INSTANCE)")
    en.set_defaults(func=_enroll)
    fk = actions.add_parser(
        "fleet-key",
        help="print a new fleet key (FLIGHTREC_FLEET_KEY=…) for the operator's side; never put it into an instance",
    )
    fk.set_defaults(func=_fleet_key)


def delivery_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--source",
        default=None,
        help="this manager's source id (default manager@<host name>); it has its own spool and seq",
    )
    p.add_argument("--spool", default=None, help="spool root (default $FLIGHTREC_SPOOL); events go under manager/")
    p.add_argument("--bootstrap", default=None, help="Kafka bootstrap servers (default $FLIGHTREC_BOOTSTRAP)")
    p.add_argument(
        "--flush-timeout",
        type=float,
        default=None,
        metavar="S",
        help="seconds to wait for Kafka (default $FLIGHTREC_FLUSH_TIMEOUT, 10)",
    )


def _forget(args: argparse.Namespace, settings: Settings) -> int:
    args.kind, args.attr = "forgotten", []
    return _event(args, settings)


def _event(args: argparse.Namespace, settings: Settings) -> int:
    from flightrec.producer.manager import send_manager_event

    attrs = parse_attrs(args.attr)
    s = settings.with_overrides(spool=args.spool, bootstrap=args.bootstrap, flush_timeout=args.flush_timeout)
    s = dataclasses.replace(s, instance_key=None)  # the manager's events carry the manager's tag, never an instance's
    ev, ok = send_manager_event(s, args.instance, args.kind, args.detail, attrs, args.source)
    where = "delivered" if ok else "spooled, not yet delivered"
    print(f"{ev.kind} {ev.instance_id} by {ev.source_id}: {where}", file=sys.stdout if ok else sys.stderr)
    return 0


def _fleet_key_bytes(settings: Settings) -> bytes:
    from flightrec.errors import ConfigError
    from flightrec.schemas.auth import parse_fleet_key

    if not settings.fleet_key:
        raise ConfigError(
            "FLIGHTREC_FLEET_KEY is not set: make one with `flightrec manager fleet-key`, keep it on the "
            "operator's side (beside client.env), and set it for the manager and the materializer"
        )
    return parse_fleet_key(settings.fleet_key)


def _enroll(args: argparse.Namespace, settings: Settings) -> int:
    from flightrec.schemas import now_us
    from flightrec.schemas.auth import enroll

    signer = enroll(_fleet_key_bytes(settings), args.instance, now_us())
    print(f"FLIGHTREC_INSTANCE={args.instance}")
    print(f"FLIGHTREC_INSTANCE_KEY={signer.token}")
    print(f"enrolled {args.instance}: key {signer.key_id}; put both lines into its environment", file=sys.stderr)
    return 0


def _fleet_key(args: argparse.Namespace, settings: Settings) -> int:
    from flightrec.schemas.auth import new_fleet_key

    print(f"FLIGHTREC_FLEET_KEY={new_fleet_key()}")
    return 0
