"""`flightrec agent run|event|facts|flush|seal`: the instance agent (producer/)."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from pathlib import Path

from flightrec.errors import ConfigError
from flightrec.settings import Settings


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("agent", help="the instance agent: wrap stages, publish events")
    add_actions(p.add_subparsers(dest="action", metavar="ACTION", required=True), "flightrec agent")


def add_actions(actions: argparse._SubParsersAction, prog: str) -> None:
    """`run`, `event`, `facts`, `flush` and `seal` under ``actions`` (`flightrec agent …` or `flightrec-agent …`)."""

    def common(a: argparse.ArgumentParser) -> None:
        a.add_argument("--instance", default=None, help="instance id (default $FLIGHTREC_INSTANCE, else the host name)")
        a.add_argument("--spool", default=None, help="spool folder (default $FLIGHTREC_SPOOL)")
        a.add_argument("--bootstrap", default=None, help="Kafka bootstrap servers (default $FLIGHTREC_BOOTSTRAP)")
        a.add_argument(
            "--flush-timeout",
            type=float,
            default=None,
            metavar="S",
            help="seconds to wait for Kafka at exit (default $FLIGHTREC_FLUSH_TIMEOUT, 10)",
        )

    run = actions.add_parser(
        "run",
        help="run CMD as a stage and publish its lines and exit",
        usage=f"{prog} run --stage NAME [--tail PATH]... [--seal] -- CMD [ARGS]",
    )
    common(run)
    run.add_argument("--stage", required=True, help="the stage name this command runs as (tunnel, benchmark, ...)")
    run.add_argument("--tail", action="append", default=[], metavar="PATH", help="follow this file too (repeatable)")
    run.add_argument(
        "--seal", action="store_true", help="seal the boot when CMD exits 0 (implied for the stage named 'supervisor')"
    )
    run.add_argument("--no-seal", action="store_true", help="do not seal, even for the stage named 'supervisor'")
    run.add_argument(
        "--no-facts", action="store_true", help="do not send instance facts (sent once per boot otherwise)"
    )
    run.add_argument("cmd", nargs=argparse.REMAINDER, help="the command and its arguments, after --")
    run.set_defaults(func=_run, lenient_settings=True)
    ev = actions.add_parser("event", help="publish one lifecycle event")
    common(ev)
    ev.add_argument("--stage", required=True, help="the stage the event belongs to")
    ev.add_argument("--state", required=True, help="started, succeeded, failed, skipped or info")
    ev.add_argument("--detail", default="", help="free text shown with the event")
    ev.add_argument("--attr", action="append", default=[], metavar="K=V", help="an attribute (repeatable)")
    ev.add_argument("--no-facts", action="store_true", help="do not send instance facts (sent once per boot otherwise)")
    ev.set_defaults(func=_event)
    facts = actions.add_parser("facts", help="send this boot's instance facts (once per boot) and print them")
    common(facts)
    facts.add_argument("--force", action="store_true", help="send them even if this boot already has them")
    facts.set_defaults(func=_facts)
    fl = actions.add_parser("flush", help="deliver what an earlier agent left in the spool; exit 1 if some is left")
    common(fl)
    fl.add_argument("--all", action="store_true", help="every instance found in the spool folder")
    fl.add_argument(
        "--timeout",
        type=float,
        default=None,
        metavar="S",
        help="give up after S seconds (default 30; at once when Kafka does not answer)",
    )
    fl.set_defaults(func=_flush)
    se = actions.add_parser("seal", help="send the sealed event closing this boot")
    common(se)
    se.add_argument(
        "--reason", default="sealed by `flightrec agent seal`", help="why the boot ends, kept with the sealed event"
    )
    se.set_defaults(func=_seal)


def _settings(args: argparse.Namespace, settings: Settings) -> Settings:
    return settings.with_overrides(
        instance=args.instance, spool=args.spool, bootstrap=args.bootstrap, flush_timeout=args.flush_timeout
    )


def _run(args: argparse.Namespace, settings: Settings) -> int:
    import signal
    import threading

    from flightrec.producer import open_agent, run_stage
    from flightrec.producer.run import set_title
    from flightrec.producer.term import HANDLED
    from flightrec.producer.term import block as block_signals

    cmd = list(args.cmd)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        raise ConfigError("no command given: flightrec agent run --stage NAME -- CMD [ARGS]")
    s = _settings(args, settings)
    set_title(args.stage)
    old_mask = block_signals()  # before any thread starts: every thread leaves the stage's signals to run_stage
    try:
        with open_agent(settings=s) as agent:
            facts = None
            if not args.no_facts:  # the probe joins this boot now, so that a seal waits for it
                facts = threading.Thread(target=_facts_quietly, args=(agent, agent.join("facts")), daemon=True)
                facts.start()
            with agent.running_stage(args.stage):
                result = run_stage(
                    agent,
                    args.stage,
                    cmd,
                    args.tail,
                    seal_on_success=(args.seal or args.stage == "supervisor") and not args.no_seal,
                )
            if facts is not None:
                facts.join(20)
    finally:
        for sig in HANDLED:  # one that came during the final flush must not change CMD's exit status
            signal.signal(sig, signal.SIG_IGN)
        signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)
    _exit_now(result.exit_status)
    return result.exit_status


def _exit_now(status: int) -> None:
    """End the process at once with ``status``: everything is spooled and flushed, and the interpreter's own
    teardown (modules, the Kafka client's threads) would add a delay between CMD's exit and the agent's."""
    import logging
    import os
    import sys

    for stream in (sys.stdout, sys.stderr):  # None: the agent was started with it closed (`>&-`)
        if stream is not None:
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
    logging.shutdown()
    os._exit(status)


def _facts_quietly(agent: object, member: object = None) -> None:
    import logging

    try:
        agent.facts()  # type: ignore[attr-defined]  # a SyncAgent, typed object to keep this module light
    except Exception as exc:  # facts must never break a stage
        logging.getLogger(__name__).warning("instance facts not sent: %s", exc)
    finally:
        agent.leave(member)  # type: ignore[attr-defined]  # a SyncAgent, typed object to keep this module light


def parse_attrs(pairs: list[str]) -> dict[str, str]:
    """``--attr K=V`` flags as a mapping (a later K wins); ConfigError for one without ``=`` or a key."""
    attrs: dict[str, str] = {}
    for kv in pairs:
        k, sep, v = kv.partition("=")
        if not sep or not k:
            raise ConfigError(f"--attr {kv!r} is not K=V")
        attrs[k] = v
    return attrs


def _event(args: argparse.Namespace, settings: Settings) -> int:
    from flightrec.producer import open_agent
    from flightrec.schemas import STAGE_STATES

    if args.state not in STAGE_STATES:
        raise ConfigError(f"--state {args.state!r} is not one of {', '.join(STAGE_STATES)}")
    attrs = parse_attrs(args.attr)
    with open_agent(settings=_settings(args, settings)) as agent:
        if not args.no_facts:
            _facts_quietly(agent)
        agent.note_late_losses()
        agent.event(args.stage, args.state, detail=args.detail, attributes=attrs)
    return 0


def _facts(args: argparse.Namespace, settings: Settings) -> int:
    from flightrec.producer import open_agent

    with open_agent(settings=_settings(args, settings)) as agent:
        ev = agent.facts(force=args.force)
    if ev is None:
        print("this boot already has its instance facts (use --force to send them again)")
    else:
        rec = {k: v for k, v in ev.to_record().items() if k not in ("event_id",)}
        print(json.dumps(rec, indent=2, default=str))
    return 0


def _spooled(root: Path, depth: int = 2) -> list[tuple[Path, str]]:
    """(spool root, instance id) of every instance folder under ``root``: its own, and a manager's sources'
    (``<spool>/manager/<source>/<instance>``), however far down ``--spool`` points."""
    from urllib.parse import unquote

    from flightrec.producer.spoolfolder import SpoolFolder

    if not root.is_dir():
        return []
    out: list[tuple[Path, str]] = []
    for p in sorted(root.iterdir()):
        instance = SpoolFolder.holds_an_instance(p)
        if instance:
            out.append((root, unquote(p.name)))
        # the manager's sources live in <spool>/manager/, also when an instance is named "manager"
        if depth > 0 and p.is_dir() and not p.is_symlink() and (not instance or p.name == "manager"):
            out.extend(_spooled(p, depth - 1))
    return out


def _flush(args: argparse.Namespace, settings: Settings) -> int:
    s = _settings(args, settings)
    timeout = args.timeout if args.timeout is not None else max(30.0, s.flush_timeout)
    if args.all:
        instances = _spooled(Path(s.spool))
        if not instances:
            print(f"no spooled instances under {s.spool}")
    else:
        instances = [(Path(s.spool), s.instance)]
    left = sum(_flush_one(root, iid, s, timeout) for root, iid in instances)
    return 1 if left else 0


def _flush_one(root: Path, iid: str, s: Settings, timeout: float) -> int:
    """Deliver one instance's spool; the events left (said on stderr with why)."""
    from flightrec.producer import open_agent
    from flightrec.producer.manager import remove_if_ended

    with open_agent(instance_id=iid, settings=s, spool_dir=str(root)) as agent:
        deadline = time.monotonic() + timeout
        before = agent.pending()
        ok = agent.flush(timeout, unless_away=True)  # nothing answers: say so now, not after the timeout
        after = agent.pending()
        # no second wait at the exit: --timeout is all, and a Kafka found away is not waited for again
        agent.close(max(0.0, deadline - time.monotonic()), unless_away=True)
        d = agent.deliverer
        dropped = (
            f", {len(d.dropped)} refused by Kafka for good and replaced by Dropped markers ({'; '.join(d.dropped)})"
            if d is not None and d.dropped
            else ""
        )
        print(f"{iid}: {before - after} events delivered, {after} left in {agent.spool.dir}{dropped}")
    if ok:
        remove_if_ended(root, iid)  # a manager's folder of an instance it destroyed or forgot goes once delivered
        return 0
    if d is not None and d.denied is not None:
        print(f"flightrec agent flush: {iid}: {d.denied}", file=sys.stderr)
    else:
        print(
            f"{iid}: not everything was acknowledged within {timeout:g}s (last error: {d.last_error if d else None})",
            file=sys.stderr,
        )
    return after


def _seal(args: argparse.Namespace, settings: Settings) -> int:
    from flightrec.producer import open_agent

    with open_agent(settings=_settings(args, settings)) as agent:
        ev = agent.seal(args.reason)
        print(f"sealed boot {ev.boot_id} of {ev.instance_id}: {ev.event_count} events")
        if "still running when sealed" in ev.reason:  # what the seal could not wait for
            print(f"flightrec agent seal: {ev.reason}", file=sys.stderr)
    return 0
