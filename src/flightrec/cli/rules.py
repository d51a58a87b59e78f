"""`flightrec rules propose --kind K`: a rule made from a failure kind's template, backtested over the whole history
(db/propose.py), refused when it would fire on a healthy line or change an explained failure, else (``--save``)
appended to the operator's rules file (FLIGHTREC_RULES_FILE), which a running materializer then applies."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from flightrec.cli.options import add_read_db
from flightrec.errors import ConfigError, QueryError
from flightrec.settings import Settings

if TYPE_CHECKING:
    from flightrec.db.location import Location
    from flightrec.db.propose import Backtest, ProposedRule

REFUSED = 3  # the exit status of a refused rule (1: an error, 2: a usage error)


def register(sub: argparse._SubParsersAction) -> None:
    r = sub.add_parser("rules", help="the failure rules: propose one from a failure kind")
    actions = r.add_subparsers(dest="action", metavar="ACTION", required=True)
    p = actions.add_parser(
        "propose",
        help="a rule from a failure kind's template, backtested over the whole history; --save writes it to "
        "the operator's rules file (FLIGHTREC_RULES_FILE)",
    )
    p.add_argument("--kind", required=True, help="the kind (failures.kind; a unique prefix will do)")
    p.add_argument("--class", dest="failure_class", default=None, help="the class it gives (default: kind_<K>)")
    p.add_argument("--hint", default=None, help="the hint it gives (default: one that names the kind)")
    p.add_argument("--save", action="store_true", help="append it to FLIGHTREC_RULES_FILE unless it is refused")
    add_read_db(p)
    p.set_defaults(func=_propose)


def _propose(args: argparse.Namespace, settings: Settings) -> int:
    from flightrec.db.location import reader_location
    from flightrec.db.nopandas import keep_pandas_out
    from flightrec.db.propose import propose

    keep_pandas_out()
    if args.save and not settings.rules_file:
        raise ConfigError("--save writes to the operator's rules file: set FLIGHTREC_RULES_FILE to its path")
    loc = reader_location(settings.with_overrides(db=args.db).db, args.data_path)
    if not loc.exists():
        raise QueryError(f"no database at {loc.describe()}; start `flightrec materialize --db {loc.describe()}`")
    kind, templated = _kind(loc, args.kind)
    rule = propose(kind, templated, args.failure_class, args.hint)
    if not rule.pattern:
        raise ConfigError(f"kind {kind} has no decisive line to make a pattern of; write its rule by hand")
    test = _backtest(loc, rule)
    print(render(rule, test))
    refusal = test.refusal()
    if refusal is not None:
        print(f"refused: {refusal}; nothing saved")
        return REFUSED
    if args.save and settings.rules_file:  # checked above: --save has a file
        from flightrec.db.rulesfile import save

        save(Path(settings.rules_file), rule)
        print(f"saved as rule {rule.rule_id} in {settings.rules_file}")
    return 0


def _kind(loc: Location, prefix: str) -> tuple[str, str]:
    """The kind a prefix names and its template, read as `flightrec kinds` reads."""
    from flightrec.db.propose import kind_sql
    from flightrec.db.query import run_query

    sql = kind_sql(prefix)
    rows = run_query(loc, sql).to_pylist()
    if not rows:
        raise QueryError(f"no failure of kind {prefix!r}; `flightrec kinds` lists them")
    if len(rows) > 1:
        raise QueryError(f"{prefix!r} starts more than one kind ({rows[0]['kind']}, {rows[1]['kind']}); give more")
    return str(rows[0]["kind"]), str(rows[0]["template"] or "")


def _backtest(loc: Location, rule: ProposedRule) -> Backtest:
    from flightrec.db.propose import Backtest, backtest_sql
    from flightrec.db.query import run_query

    row = run_query(loc, backtest_sql(rule)).to_pylist()[0]
    return Backtest(**{k: int(v or 0) for k, v in row.items()})


def render(rule: ProposedRule, test: Backtest) -> str:
    """The proposed rule and its backtest, as a small table."""
    r, t = rule, test
    rows = [
        ("failures of the kind", t.kind_failures),
        ("matched inside the kind", t.matched_in_kind),
        ("matched outside the kind", t.matched_outside_kind),
        ("healthy lines matched (must be 0)", t.healthy_lines),
        ("classes it would change", t.class_changed),
        ("explained failures it would change (must be 0)", t.explained_changed),
    ]
    width = max(len(name) for name, _ in rows)
    head = [
        f"rule     {r.rule_id}",
        f"class    {r.failure_class}",
        f"pattern  {r.pattern}",
        "",
        f"{'BACKTEST'.ljust(width)}  COUNT",
    ]
    return "\n".join(head + [f"{name.ljust(width)}  {n}" for name, n in rows])
