"""Schema migrations, the same on a file and a lake: each new column and rebuilt derived table, by version.

A database records the versions applied to it in ``schema_version``. Opening a store runs, in one transaction
with its tables' DDL, the migrations newer than the database's version: their columns are added (on a lake in
every shard's tables too) and their derived rows rebuilt. A database made before versions were recorded is
placed by what its tables show (:func:`baseline`). Adding a column: append a :class:`Migration` here (and not to
schema.sql's CREATE TABLE), and the column in the fold's Arrow shape (fold.TABLES) where the fold writes it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from importlib import resources

import duckdb


@dataclass(frozen=True)
class Column:
    """One column a migration adds: ``ALTER TABLE table ADD COLUMN IF NOT EXISTS name type``."""

    table: str
    name: str
    type: str

    def sql(self, schema: str | None = None) -> str:
        """The ALTER statement, on ``schema.table`` when a schema is given."""
        where = f"{schema}.{self.table}" if schema else self.table
        return f"ALTER TABLE {where} ADD COLUMN IF NOT EXISTS {self.name} {self.type};"


@dataclass(frozen=True)
class Migration:
    """One step of the schema: the columns it adds and whether the failures rows are built again for them."""

    version: int
    what: str
    columns: tuple[Column, ...] = ()
    rebuild_failures: bool = False  # every failures row built again from its stored events, by today's rules


MIGRATIONS: tuple[Migration, ...] = (
    Migration(
        1,
        "columns added after the first release",
        (
            Column("instances", "dropped_events", "BIGINT DEFAULT 0"),
            Column("boots", "dropped_events", "BIGINT DEFAULT 0"),
            Column("events_seen", "fingerprint", "BIGINT"),  # NULL for events stored before it
            Column("log_lines", "late", "BOOLEAN"),  # NULL for lines from before `late`: not late
            Column("events_seen", "recv_us", "BIGINT"),  # NULL for events folded before: not known
            Column("manager_events", "recv_us", "BIGINT"),
            Column("heartbeats", "last_recv_us", "BIGINT"),
            Column("boots", "first_recv_us", "BIGINT"),
            Column("boots", "last_recv_us", "BIGINT"),
            Column("boots", "clock_offset_us", "BIGINT"),
            Column("instances", "last_recv_us", "BIGINT"),
            Column("instances", "clock_offset_us", "BIGINT"),
        ),
    ),
    Migration(
        2,
        "failures.killed_by: what killed a stage, the failures rows built again to fill it",
        (
            Column("failures", "killed_by", "VARCHAR"),
            Column("failures", "killed_by_evidence", "VARCHAR"),
        ),
        rebuild_failures=True,
    ),
    Migration(
        3,
        "who wrote an event: the key that tagged it (untrusted hosts), the instance a dead letter claims",
        (
            Column("events_seen", "key_id", "VARCHAR"),  # NULL: untagged (unauthenticated)
            Column("manager_events", "key_id", "VARCHAR"),
            Column("dead_letters", "instance_id", "VARCHAR"),  # NULL: not decoded, or folded before version 3
        ),
    ),
    Migration(
        4,
        "the event id a dead letter carries, so a refused event Kafka holds twice is one dead letter",
        (Column("dead_letters", "event_id", "VARCHAR"),),  # NULL: not decoded, or folded before version 4
    ),
    Migration(
        5,
        "failures.last_lines: a failed stage's last lines in its row (the evidence without a scan of log_lines)",
        (Column("failures", "last_lines", "STRUCT(seq BIGINT, line_no BIGINT, source VARCHAR, text VARCHAR)[]"),),
        rebuild_failures=True,
    ),
    Migration(
        6,
        "events_seen.sent_us: when the sender sent an event (its send-time header), which the clock offset is "
        "judged by (an event's own time, after it waited in a spool, is not)",
        (Column("events_seen", "sent_us", "BIGINT"),),  # NULL: sent without the header (older agents)
    ),
    Migration(
        7,
        "failures.decisive_line: the line that says why, for every failure, where it stands, and the rule (and the "
        "rules' version) that classed it; matched_line becomes its old name",
        (
            Column("failures", "decisive_line", "VARCHAR"),
            Column("failures", "decisive_source", "VARCHAR"),
            Column("failures", "decisive_line_no", "INTEGER"),
            Column("failures", "rule_id", "VARCHAR"),
            Column("failures", "rules_version", "VARCHAR"),
        ),
        rebuild_failures=True,
    ),
    Migration(
        8,
        "failures.kind: each failure's kind (a fingerprint of its stage kind, exit kind and decisive line's "
        "template, db/kinds.py) and that template, for the failure_kinds view",
        (
            Column("failures", "kind", "VARCHAR"),
            Column("failures", "kind_template", "VARCHAR"),
        ),
        rebuild_failures=True,
    ),
)

VERSION_TABLE = "schema_version"
# Databases made before versions were recorded already held every column of these versions when they held
# failures.killed_by (the last migration of that time); without it, they are placed before version 1.
RECORDED_FROM = 2


def latest(migrations: Iterable[Migration] | None = None) -> int:
    """The newest version the code knows."""
    return max((m.version for m in (MIGRATIONS if migrations is None else migrations)), default=0)


def columns_sql(
    schema_of: Callable[[str], str | None] = lambda table: None, migrations: Iterable[Migration] | None = None
) -> str:
    """Every migration's ALTER statements, each table in the schema ``schema_of(table)`` gives (None: unqualified).
    Idempotent: run at every open, so a table created later (a lake's new shard) gets every column too."""
    return "\n".join(
        c.sql(schema_of(c.table)) for m in (MIGRATIONS if migrations is None else migrations) for c in m.columns
    )


def baseline(failures_columns: set[str]) -> int:
    """The version of a database made before versions were recorded, from the columns its failures table had
    before this open: none (a new database): the latest; killed_by: RECORDED_FROM; else 0 (all of them run)."""
    if not failures_columns:
        return latest()
    return RECORDED_FROM if "killed_by" in failures_columns else 0


def recorded(con: duckdb.DuckDBPyConnection, table: str = VERSION_TABLE) -> int | None:
    """The newest version recorded in the database, or None when none was (the table is made by schema.sql)."""
    row = con.execute(f"SELECT max(version) FROM {table}").fetchone()
    return None if row is None or row[0] is None else int(row[0])


def pending(version: int, migrations: Iterable[Migration] | None = None) -> list[Migration]:
    """The migrations newer than ``version``, oldest first."""
    return sorted(
        (m for m in (MIGRATIONS if migrations is None else migrations) if m.version > version), key=lambda m: m.version
    )


def record(
    con: duckdb.DuckDBPyConnection, done: Iterable[Migration], run_id: str, now_us: int, table: str = VERSION_TABLE
) -> None:
    """Note each applied migration in the database (inside the caller's transaction), in one statement (on a lake
    each statement costs catalog round trips)."""
    done = list(done)
    if done:
        con.execute(
            f"INSERT INTO {table} (version, what, applied_us, run_id) VALUES {', '.join(['(?, ?, ?, ?)'] * len(done))}",
            [v for m in done for v in (m.version, m.what, now_us, run_id)],
        )


def schema_sql() -> str:
    """The DDL of every table (db/schema.sql), then every migration's columns (db/migrate.py), idempotent."""
    return resources.files("flightrec.db").joinpath("schema.sql").read_text("utf-8") + "\n" + columns_sql()
