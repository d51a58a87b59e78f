"""`flightrec kinds`: the failure kinds (the failure_kinds view, db/views.py): new and regressed first; and
`flightrec kinds mute|merge|split`: the operator's decisions on them, sent as manager events (db/kinds.py).

The decisions live here, not under `flightrec manager`, because they are about kinds, which this command shows
(one name per concept); they travel the manager's way (its spool, source, seq and key: cli/manager.py,
producer/manager.py), so a replay and every member of a lake group read the same ones."""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Mapping, Sequence
from typing import Any

from flightrec.cli.options import add_read_db
from flightrec.settings import Settings

# New and regressed first (what an operator has not seen), then by failures.
KINDS_SQL = """
SELECT kind, status, failures, instances, hosts, gpu_models, failure_class, first_us, last_us, first_seen, last_seen,
       example_failure_ids, template, merged_kinds
FROM failure_kinds
ORDER BY CASE status WHEN 'new' THEN 0 WHEN 'regressed' THEN 1 WHEN 'ongoing' THEN 2 WHEN 'explained' THEN 3 ELSE 4 END,
         failures DESC, kind
"""
TEMPLATE_WIDTH = 100  # characters of a template shown in the table (--json gives it whole)


def register(sub: argparse._SubParsersAction) -> None:
    k = sub.add_parser(
        "kinds",
        help="the failure kinds: each fingerprint, its template, status and counts; mute, merge or split them",
    )
    add_read_db(k)
    k.add_argument("--json", action="store_true", help="print one JSON object per kind, a line each")
    k.set_defaults(func=_kinds)
    actions = k.add_subparsers(dest="action", metavar="[mute|unmute|merge|unmerge|split]", help="none: list the kinds")
    mute = _decision(actions, "mute", "mute a kind: its status is muted (never new or regressed) until unmuted")
    mute.add_argument("kind", metavar="K", help="the kind (16 hex digits, as `flightrec kinds` shows it)")
    unmute = _decision(actions, "unmute", "take a mute back: the kind's status is what its failures say")
    unmute.add_argument("kind", metavar="K", help="the kind muted")
    merge = _decision(actions, "merge", "count the failures of kind K1 as kind K2's (K2 shows them; K1 is gone)")
    merge.add_argument("kind", metavar="K1", help="the kind merged away")
    merge.add_argument("into", metavar="K2", help="the kind that shows both")
    unmerge = _decision(actions, "unmerge", "take a merge back: kind K shows its own failures again")
    unmerge.add_argument("kind", metavar="K", help="the kind merged away (K1 of its merge)")
    split = _decision(
        actions, "split", "separate the failures of kind K whose decisive line matches RE into a new kind"
    )
    split.add_argument("kind", metavar="K", help="the kind to split")
    split.add_argument(
        "--pattern", required=True, metavar="RE", help="a regular expression (RE2, as DuckDB's regexp_matches)"
    )


def _decision(actions: argparse._SubParsersAction, name: str, help: str) -> argparse.ArgumentParser:
    from flightrec.cli.manager import delivery_flags

    p = actions.add_parser(name, help=help + "; a manager event, so a replay keeps it")
    p.add_argument("--detail", default="", help="why, in words (kept with the event)")
    delivery_flags(p)
    p.set_defaults(func=_decide)
    return p


def _kinds(args: argparse.Namespace, settings: Settings) -> int:
    from flightrec.db.kinds import KindWindows
    from flightrec.db.location import reader_location
    from flightrec.db.nopandas import keep_pandas_out
    from flightrec.db.query import run_query
    from flightrec.db.views import prelude_for
    from flightrec.errors import QueryError

    keep_pandas_out()
    loc = reader_location(settings.with_overrides(db=args.db).db, args.data_path)
    if not loc.exists():
        raise QueryError(f"no database at {loc.describe()}; start `flightrec materialize --db {loc.describe()}`")
    prelude = prelude_for(KINDS_SQL, windows=KindWindows.from_settings(settings))  # the statuses' windows: settings
    rows = run_query(loc, KINDS_SQL, prelude=prelude).to_pylist()
    if args.json:
        for row in rows:
            print(json.dumps(row, default=str))
    else:
        print(render(rows))
    return 0


def render(rows: Sequence[Mapping[str, Any]]) -> str:
    """The kinds as a table, one line each (the template cut at TEMPLATE_WIDTH)."""
    if not rows:
        return "no failure kinds (no failures, or none folded since failures.kind was added)"
    head = ("KIND", "STATUS", "FAILURES", "INSTANCES", "CLASS", "LAST SEEN", "TEMPLATE")
    lines = [_cells(r) for r in rows]
    widths = [max(len(h), *(len(c[i]) for c in lines)) for i, h in enumerate(head[:-1])]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(cells[:-1], widths, strict=True)) + "  " + cells[-1]
        for cells in [head, *lines]
    )


def _cells(r: Mapping[str, Any]) -> tuple[str, ...]:
    template = str(r.get("template") or "")
    if len(template) > TEMPLATE_WIDTH:
        template = template[: TEMPLATE_WIDTH - 1] + "…"
    last_us = r.get("last_us")
    return (
        str(r["kind"]),
        str(r["status"]),
        str(r["failures"]),
        str(r["instances"]),
        str(r.get("failure_class") or ""),
        time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(last_us / 1e6)) if last_us is not None else "",
        template.replace("\n", " "),
    )


def decision(args: argparse.Namespace, max_len: int) -> tuple[str, dict[str, str]]:
    """The manager event's kind and attributes of a `flightrec kinds ACTION`, checked (ConfigError)."""
    from flightrec.db import kinds as k
    from flightrec.errors import ConfigError

    into = getattr(args, "into", None)
    for kind in (args.kind, into) if into is not None else (args.kind,):
        if not k.KIND_PATTERN.fullmatch(kind):
            raise ConfigError(f"{kind!r} is not a kind: 16 hex digits, as `flightrec kinds` shows them")
    if args.action == "split":
        _check_pattern(args.pattern, max_len)
        return k.KIND_SPLIT, {"failure_kind": args.kind, "pattern": args.pattern}
    if into is None:
        event = {"mute": k.KIND_MUTED, "unmute": k.KIND_UNMUTED, "unmerge": k.KIND_UNMERGED}[args.action]
        return event, {"failure_kind": args.kind}
    if into == args.kind:
        raise ConfigError(f"merging {args.kind} into itself changes nothing: name two kinds")
    return k.KIND_MERGED, {"failure_kind": args.kind, "into": into}


def said_text(args: argparse.Namespace, attrs: dict[str, str]) -> str:
    """What a decision did, in words (a split names the kind it makes, from the pattern sent)."""
    from flightrec.db.kinds import split_kind

    if args.action == "split":
        return f"split {args.kind} by {args.pattern!r} into {split_kind(args.kind, attrs.get('pattern', ''))}"
    if args.action == "merge":
        return f"merged {args.kind} into {args.into}"
    return f"{args.action}d {args.kind}"  # muted, unmuted, unmerged


def _check_pattern(pattern: str, max_len: int) -> None:
    """A split's pattern must be one the view can run: RE2 (DuckDB's), not empty, not cut by the event's bounds."""
    import duckdb

    from flightrec.errors import ConfigError

    if not pattern or len(pattern) > max_len:
        raise ConfigError(f"--pattern must be 1 to {max_len} characters (FLIGHTREC_MAX_LINE)")
    try:
        duckdb.connect().execute("SELECT regexp_matches('', ?)", [pattern]).fetchall()
    except duckdb.Error as exc:
        raise ConfigError(
            f"--pattern {pattern!r} is not a regular expression DuckDB (RE2) runs: {exc}; RE2 has no look-around "
            "or back-references"
        ) from None


def _decide(args: argparse.Namespace, settings: Settings) -> int:
    import dataclasses
    import sys

    from flightrec.db.kinds import DECISIONS_INSTANCE
    from flightrec.producer.manager import send_manager_event

    kind, attrs = decision(args, settings.max_line)
    s = settings.with_overrides(spool=args.spool, bootstrap=args.bootstrap, flush_timeout=args.flush_timeout)
    s = dataclasses.replace(s, instance_key=None)  # the manager's events carry the manager's tag, never an instance's
    ev, ok = send_manager_event(s, DECISIONS_INSTANCE, kind, args.detail, attrs, args.source)
    said = dict(ev.attributes)
    if said != attrs:  # the agent's redaction masked a part of it: what was sent is what counts
        print(f"warning: sent as {said} (a part looked like a secret and was masked)", file=sys.stderr)
    what = said_text(args, said)
    where = "delivered" if ok else "spooled, not yet delivered"
    print(f"{what} by {ev.source_id}: {where}", file=sys.stdout if ok else sys.stderr)
    return 0
