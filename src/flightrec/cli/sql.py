"""`flightrec sql`: read-only SQL over the database, in a bounded process of its own (see flightrec.db.query)."""

from __future__ import annotations

import argparse
import csv
import json
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # imported where used: every `flightrec` command (the agent's too) would pay for it at start
    import pyarrow as pa

    from flightrec.db.sandbox import ReadLimits

from flightrec.cli.options import add_read_db
from flightrec.errors import ConfigError
from flightrec.settings import Settings

MAX_CELL = 200  # characters shown per cell in the text table


def register(sub: argparse._SubParsersAction) -> None:
    s = sub.add_parser("sql", help="run read-only SQL and print the result")
    s.add_argument("query", help="one read-only SQL statement; the shared views (fleet, log_view, ...) are there")
    add_read_db(s)
    fmt = s.add_mutually_exclusive_group()
    fmt.add_argument("--csv", action="store_true", help="print CSV")
    fmt.add_argument("--json", action="store_true", help="print one JSON object per line")
    s.add_argument(
        "--memory-limit",
        default="1GiB",
        metavar="SIZE",
        help="memory the query's own process may take (RLIMIT_AS; DuckDB keeps half; it never spills to disk; "
        "default 1GiB); a file only, never in the materializer",
    )
    s.add_argument(
        "--timeout",
        type=float,
        default=60.0,
        metavar="SECONDS",
        help="stop the query after SECONDS (default 60); a file only",
    )
    s.set_defaults(func=_sql)


def _cell(value: Any) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, bytes):
        return value.hex()
    text = (
        value
        if isinstance(value, str)
        else json.dumps(value, default=str)
        if isinstance(value, (list, dict))
        else str(value)
    )
    text = text.replace("\n", "\\n")
    return text if len(text) <= MAX_CELL else text[: MAX_CELL - 1] + "…"


def _column_values(column: pa.ChunkedArray) -> list[Any]:
    """A column as Python values; one Python cannot hold (a TIMESTAMP past year 9999, a DATE
    before year 1) falls back to Arrow's own text for it, or to the raw number."""
    import pyarrow as pa
    import pyarrow.compute as pc

    try:
        return column.to_pylist()
    except (OverflowError, ValueError, pa.ArrowException):
        pass
    try:
        return pc.cast(column, pa.string()).to_pylist()
    except (pa.ArrowException, ValueError):
        pass
    try:
        storage = pa.int64() if pa.types.is_timestamp(column.type) or pa.types.is_date64(column.type) else pa.int32()
        return [None if v is None else f"<{column.type} {v}>" for v in column.cast(storage).to_pylist()]
    except (pa.ArrowException, ValueError):
        return [f"<{column.type} value>"] * len(column)


def table_rows(table: pa.Table) -> list[dict[str, Any]]:
    """The rows as dicts of Python values, never failing on a value Python cannot represent."""
    import pyarrow as pa

    try:
        return table.to_pylist()
    except (OverflowError, ValueError, pa.ArrowException):
        columns = [_column_values(c) for c in table.columns]
        return [dict(zip(table.column_names, values, strict=True)) for values in zip(*columns, strict=True)]


def format_table(table: pa.Table) -> str:
    """An aligned text table with a header, a rule and a row count."""
    import pyarrow as pa

    names = table.column_names
    rows = [[_cell(v) for v in row.values()] for row in table_rows(table)]
    widths = [max([len(n)] + [len(r[i]) for r in rows]) for i, n in enumerate(names)]
    numeric = [
        pa.types.is_integer(f.type) or pa.types.is_floating(f.type) or pa.types.is_decimal(f.type) for f in table.schema
    ]

    def line(cells: list[str]) -> str:
        return "  ".join(
            c.rjust(w) if num else c.ljust(w) for c, w, num in zip(cells, widths, numeric, strict=True)
        ).rstrip()

    out = [line(names), "  ".join("-" * w for w in widths)]
    out += [line(r) for r in rows]
    out.append(f"({len(rows)} row{'s' if len(rows) != 1 else ''})")
    return "\n".join(out)


def read_limits(memory: str, seconds: float) -> ReadLimits:
    """The limits of `flightrec sql`'s read from its flags (ConfigError with the fix)."""
    from flightrec.db.sandbox import ReadLimits, parse_bytes

    try:
        size = parse_bytes(memory)
    except ValueError as exc:
        raise ConfigError(f"--memory-limit {memory}: {exc}") from None
    if not seconds > 0:
        raise ConfigError(f"--timeout {seconds:g}: give a number of seconds above 0")
    return ReadLimits(memory=size, seconds=seconds)


def _sql(args: argparse.Namespace, settings: Settings) -> int:
    from flightrec.db.kinds import KindWindows
    from flightrec.db.location import reader_location
    from flightrec.db.nopandas import keep_pandas_out
    from flightrec.db.query import freshness, run_query
    from flightrec.db.sandbox import allow_fork
    from flightrec.db.views import prelude_for

    keep_pandas_out()  # nothing here uses it; pyarrow would import it at its first conversion (db/nopandas.py)
    settings = settings.with_overrides(db=args.db)
    loc = reader_location(settings.db, args.data_path)
    limits = read_limits(args.memory_limit, args.timeout)
    allow_fork()  # this process opens no DuckDB database: the read's process is forked from it (a few ms)
    prelude = prelude_for(args.query, windows=KindWindows.from_settings(settings))  # the shared views it names
    table = run_query(loc, args.query, prelude=prelude, limits=limits)
    fresh = freshness(table)
    if args.csv:
        w = csv.writer(sys.stdout)
        w.writerow(table.column_names)
        for row in table_rows(table):
            w.writerow(
                [
                    "" if v is None else json.dumps(v, default=str) if isinstance(v, (list, dict)) else v
                    for v in row.values()
                ]
            )
    elif args.json:
        for row in table_rows(table):
            print(json.dumps(row, default=lambda v: v.hex() if isinstance(v, bytes) else str(v)))
    else:
        print(format_table(table))
    if fresh is not None:
        sys.stdout.flush()
        print(f"-- {fresh.line()}", file=sys.stderr)
    return 0
