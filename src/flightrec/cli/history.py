"""`flightrec compact|archive|purge`: months of history on bounded disks (docs/retention.md)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from flightrec.cli.options import add_read_db
from flightrec.errors import ConfigError, FlightrecError, MaterializeError
from flightrec.settings import Settings

if TYPE_CHECKING:
    from flightrec.db.location import Location

log = logging.getLogger(__name__)
HELD = (
    "stop the materializer that holds it (nothing is lost: it goes on from the offsets stored with the rows), run "
    "this, and start it again"
)


def register(sub: argparse._SubParsersAction) -> None:
    c = sub.add_parser("compact", help="give the space deleted rows left in a database file back to the disk")
    c.add_argument("--db", default=None, help="the database file (default $FLIGHTREC_DB)")
    c.add_argument(
        "--lock-wait",
        type=float,
        default=5.0,
        metavar="SECONDS",
        help="how long to wait for another process holding the file (default 5); a running materializer compacts "
        "by itself at a quiet moment (FLIGHTREC_COMPACT_FREE_SHARE)",
    )
    c.set_defaults(func=_compact)
    a = sub.add_parser("archive", help="keep the topics' raw records as Parquet files that replay reads")
    a.add_argument(
        "--to", default=None, metavar="URI", help="a folder or e.g. s3://bucket/prefix (default $FLIGHTREC_ARCHIVE)"
    )
    a.add_argument("--until-idle", type=float, default=None, metavar="SECONDS", help="exit once caught up and idle")
    a.add_argument(
        "--roll-seconds",
        type=float,
        default=600.0,
        metavar="S",
        help="write a partition's records out at least this often (default 600; the topics must keep them longer)",
    )
    a.add_argument("--roll-bytes", type=int, default=64 << 20, metavar="N", help="or once N bytes are held for it")
    a.set_defaults(func=_archive)
    p = sub.add_parser("purge", help="take one instance, or a leaked secret's text, out of the database and archive")
    add_read_db(p)
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--instance", default=None, metavar="ID", help="delete every row and record of this instance")
    what.add_argument(
        "--text-from",
        default=None,
        metavar="FILE",
        help="mask the text on the first line of FILE ('-': standard input) wherever it is stored: never on the "
        "command line, where ps and the shell's history would keep it",
    )
    p.add_argument(
        "--archive", default=None, metavar="URI", help="the archive to purge too (default $FLIGHTREC_ARCHIVE)"
    )
    p.add_argument("--no-archive", action="store_true", help="leave the archive as it is")
    p.set_defaults(func=_purge)


def _compact(args: argparse.Namespace, settings: Settings) -> int:
    from flightrec.db.compact import FileBusy, compact_file
    from flightrec.db.location import FileLocation, locate

    loc = locate(args.db or settings.db, None, writing=False)
    if not isinstance(loc, FileLocation):
        raise ConfigError(
            "a lake needs no compaction by hand: its materializer's maintenance writes mostly deleted files anew "
            "and removes the old ones (docs/lake.md)"
        )
    try:
        done = compact_file(loc.path, lock_wait=args.lock_wait)
    except FileBusy as exc:
        raise MaterializeError(f"cannot compact {loc.path}: {exc}; {HELD}, or let it compact by itself") from exc
    print(done.summary())
    return 0


def _archive(args: argparse.Namespace, settings: Settings) -> int:
    from flightrec.consumers.archive import Archiver
    from flightrec.settings import TOPICS

    uri = args.to or settings.archive
    if not uri:
        raise ConfigError("flightrec archive: give --to URI or set FLIGHTREC_ARCHIVE (a folder or s3://bucket/prefix)")

    async def go() -> int:
        loop = asyncio.get_running_loop()
        async with Archiver(
            settings.kafka_kwargs(),
            uri,
            TOPICS,
            roll_s=args.roll_seconds,
            roll_bytes=args.roll_bytes,
            keep_days=settings.archive_keep_days,
            until_idle=args.until_idle,
        ) as archiver:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, archiver.stop)
            records = await archiver.run()
        print(f"records_archived={records} segments_written={archiver.written}", file=sys.stderr)
        return 0

    return asyncio.run(go())


def _secret(path: str) -> str:
    try:
        text = sys.stdin.readline() if path == "-" else Path(path).read_text("utf-8").splitlines()[0]
    except (OSError, IndexError, UnicodeDecodeError) as exc:
        raise ConfigError(f"--text-from {path}: cannot read its first line ({exc})") from exc
    text = text.rstrip("\r\n")
    if len(text) < 4:
        raise ConfigError("--text-from: the text to purge must be at least 4 characters (a shorter one is everywhere)")
    return text


def _purge(args: argparse.Namespace, settings: Settings) -> int:
    from flightrec.db.location import locate

    secret = _secret(args.text_from) if args.text_from else None
    if args.instance is not None and not args.instance.strip():
        raise ConfigError("--instance: give the instance id to purge")
    loc = locate(args.db or settings.db, args.data_path, writing=True)
    if not loc.exists():
        raise MaterializeError(f"no database at {loc.describe()}")
    changed = _purge_database(loc, args.instance, secret)
    for table, n in sorted(changed.items()):
        print(f"{table}: {n} rows {'deleted' if args.instance else 'masked'}")
    uri = None if args.no_archive else (args.archive or settings.archive)
    if uri:
        n = _purge_archive(uri, args.instance, secret)
        print(f"archive {uri}: {n} segments written anew")
    print(asyncio.run(_what_kafka_holds(settings, args.instance)))
    return 0


def _purge_database(loc: Location, instance: str | None, secret: str | None) -> dict[str, int]:
    from flightrec.db import purge
    from flightrec.db.location import FileLocation

    def apply(con: Any, database: str) -> dict[str, int]:
        if instance is not None:
            return purge.purge_instance(con, database, instance)
        assert secret is not None
        return purge.mask_text(con, database, secret)

    if isinstance(loc, FileLocation):
        return _purge_file(loc.path, apply)
    return _purge_lake(loc, apply)


def _purge_file(path: Path, apply: Any) -> dict[str, int]:
    import duckdb

    from flightrec.db.compact import FileBusy, _connect, compact_file
    from flightrec.db.snapshot import remove_copies

    try:
        con = _connect(path, lock_wait=5.0)
    except FileBusy as exc:
        raise MaterializeError(f"cannot purge {path}: {exc}; {HELD}") from exc
    try:
        database = str(con.execute("SELECT current_database()").fetchall()[0][0])
        con.execute("BEGIN TRANSACTION")
        changed = apply(con, database)
        con.execute("COMMIT")
    except duckdb.Error as exc:
        raise MaterializeError(f"could not purge {path}: {exc}; nothing changed") from exc
    finally:
        con.close()
    done = compact_file(path)  # the deleted bytes leave the file only when it is written anew
    print(f"{done.summary()} (the purged bytes are no longer in it)")
    try:  # the readers' snapshot copies a materializer left hold them too (the next run copies the file anew)
        remove_copies(path)
    except OSError as exc:
        raise MaterializeError(f"{path} is purged but its readers' snapshot copies are not: {exc}") from exc
    return changed


def _purge_lake(loc: Location, apply: Any) -> dict[str, int]:
    from datetime import timedelta

    from flightrec.db import lake as lakes
    from flightrec.db.lakestore import ALIAS, LakeStore

    assert isinstance(loc, lakes.LakeLocation)
    store = LakeStore(loc, "flightrec-purge", mode="purge")
    try:
        changed = store.transaction("purge", lambda: apply(store.con, ALIAS))
        # the files holding the purged rows are written anew, the snapshots that still name them expired now
        now = timedelta(0)
        done = lakes.maintain(store.con, ALIAS, keep_snapshots=now, file_grace=now, rewrite_deleted=0.0)
        print(f"lake: {done.files_rewritten} files written anew, {done.files_deleted} old files deleted")
    finally:
        store.close()
    return dict(changed)


def _purge_archive(uri: str, instance: str | None, secret: str | None) -> int:
    import pyarrow as pa
    import pyarrow.compute as pc

    from flightrec.consumers.archive import Archive, purge
    from flightrec.db.purge import mask_bytes

    def drop(table: pa.Table) -> pa.Table:
        if instance is not None:
            return table.filter(pc.invert(pc.fill_null(pc.equal(table["key"], pa.scalar(instance.encode())), False)))
        assert secret is not None
        raw = secret.encode()
        for col in ("key", "value"):
            values = pa.array(mask_bytes(table[col].to_pylist(), raw), pa.binary())
            table = table.set_column(table.schema.get_field_index(col), col, values)
        return table

    return purge(Archive(uri), drop)


async def _what_kafka_holds(settings: Settings, instance: str | None) -> str:
    """One paragraph: what the topics still hold that the purge could not touch (Kafka's log is append-only)."""
    from aiokafka.admin import AIOKafkaAdminClient

    from flightrec.cluster import describe_topic_configs
    from flightrec.settings import TOPICS

    where = (
        "this instance's records (keyed by its id, in one partition of each topic)"
        if instance
        else ("every record that carried the text")
    )
    try:
        admin = AIOKafkaAdminClient(**settings.kafka_kwargs(), request_timeout_ms=5000)
        await asyncio.wait_for(admin.start(), 5.0)
        try:
            configs = await asyncio.wait_for(describe_topic_configs(admin, TOPICS), 5.0)
        finally:
            await admin.close()
        kept = ", ".join(f"{t} retention.ms={c.get('retention.ms', '?')}" for t, c in sorted(configs.items()))
    except (FlightrecError, OSError, TimeoutError, Exception) as exc:  # noqa: BLE001 - said, never fatal here
        kept = f"their retention could not be asked ({type(exc).__name__}: {exc})"
    return (
        f"Kafka still holds {where} until the topics' retention lets them go ({kept}; -1: never). A replay from "
        "the topics brings them back: purge the new database too. Kafka deletes records only from the start of a "
        "partition (kafka-delete-records.sh --offset-json-file: every earlier record of that partition goes with them)."
    )
