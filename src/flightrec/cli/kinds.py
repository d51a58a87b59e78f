"""`flightrec kinds`: the failure kinds (the failure_kinds view, db/views.py): new and regressed first."""

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
       example_failure_ids, template
FROM failure_kinds
ORDER BY CASE status WHEN 'new' THEN 0 WHEN 'regressed' THEN 1 WHEN 'ongoing' THEN 2 ELSE 3 END,
         failures DESC, kind
"""
TEMPLATE_WIDTH = 100  # characters of a template shown in the table (--json gives it whole)


def register(sub: argparse._SubParsersAction) -> None:
    k = sub.add_parser("kinds", help="the failure kinds: each fingerprint, its template, status and counts")
    add_read_db(k)
    k.add_argument("--json", action="store_true", help="print one JSON object per kind, a line each")
    k.set_defaults(func=_kinds)


def _kinds(args: argparse.Namespace, settings: Settings) -> int:
    from flightrec.db.location import reader_location
    from flightrec.db.nopandas import keep_pandas_out
    from flightrec.db.query import run_query
    from flightrec.db.views import prelude_for
    from flightrec.errors import QueryError

    keep_pandas_out()
    loc = reader_location(settings.with_overrides(db=args.db).db, args.data_path)
    if not loc.exists():
        raise QueryError(f"no database at {loc.describe()}; start `flightrec materialize --db {loc.describe()}`")
    rows = run_query(loc, KINDS_SQL, prelude=prelude_for(KINDS_SQL)).to_pylist()
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
