"""`flightrec backup|restore`: a consistent copy of a database file (the readers' snapshot while a materializer
runs), and its restore (db/backup.py)."""

from __future__ import annotations

import argparse
from pathlib import Path

from flightrec.errors import ConfigError
from flightrec.settings import Settings


def register(sub: argparse._SubParsersAction) -> None:
    b = sub.add_parser("backup", help="copy a database file, live or not, consistently at a commit")
    b.add_argument("--db", default=None, help="the database file (default $FLIGHTREC_DB)")
    b.add_argument("--to", required=True, metavar="FILE", help="the backup: a new file (never overwritten)")
    b.add_argument(
        "--timeout",
        type=float,
        default=120.0,
        metavar="S",
        help="how long to wait for a starting materializer's first snapshot (120)",
    )
    b.set_defaults(func=_backup)
    r = sub.add_parser("restore", help="put a backup in place of a lost database (the rest comes from Kafka)")
    r.add_argument("--from", dest="src", required=True, metavar="FILE", help="the backup file")
    r.add_argument(
        "--db", default=None, help="where the database goes: a file that must not exist (default $FLIGHTREC_DB)"
    )
    r.set_defaults(func=_restore)


def _file(db: str) -> Path:
    if db.startswith("ducklake:"):
        raise ConfigError(
            "a lake is backed up by its own snapshots: its catalog (pg_dump) and its data folder (docs/lake.md, "
            "docs/operations.md), not by `flightrec backup`"
        )
    return Path(db)


def _backup(args: argparse.Namespace, settings: Settings) -> int:
    from flightrec.db.backup import backup

    db = _file(settings.with_overrides(db=args.db).db)
    made = backup(db, Path(args.to), timeout=args.timeout)
    how = (
        f"the running materializer's snapshot at commit {made.commits}" if made.live else "with no materializer running"
    )
    print(
        f"backed up {db} to {made.path} ({how}): {made.instances} instances, {made.events} events, "
        f"{made.bytes / (1 << 20):.1f} MiB; restore: flightrec restore --from {made.path} --db {db}"
    )
    return 0


def _restore(args: argparse.Namespace, settings: Settings) -> int:
    from flightrec.db.backup import restore

    db = _file(settings.with_overrides(db=args.db).db)
    done = restore(Path(args.src), db)
    print(
        f"restored {args.src} to {db}: {done.instances} instances, {done.events} events; start "
        f"`flightrec materialize --db {db}`: it reads from Kafka what came after the backup"
    )
    return 0
