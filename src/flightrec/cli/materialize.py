"""`flightrec materialize|replay|timeline|wait-sealed`: the materializer (consumers/)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from typing import TYPE_CHECKING, Any

from flightrec.cli.options import add_read_db
from flightrec.errors import ConfigError, CredentialError, MaterializeError
from flightrec.settings import Settings

if TYPE_CHECKING:
    from flightrec.consumers.options import Options
    from flightrec.db.location import Location
    from flightrec.db.trust import TrustConfig

log = logging.getLogger(__name__)


def register(sub: argparse._SubParsersAction) -> None:
    from flightrec.consumers.options import Options  # the defaults are the materializer's own (a light module)

    m = sub.add_parser("materialize", help="consume all topics into DuckDB")
    m.add_argument(
        "--db",
        default=None,
        help="database file, or a DuckLake written by a consumer group: "
        "'ducklake:postgres:dbname=… host=… port=… user=…' (default $FLIGHTREC_DB)",
    )
    m.add_argument(
        "--data-path",
        default=None,
        metavar="DIR",
        help="a DuckLake --db's data folder for its Parquet files (default $FLIGHTREC_DATA_PATH); "
        "every writer of the lake must reach it",
    )
    m.add_argument(
        "--until-idle",
        type=float,
        default=None,
        metavar="SECONDS",
        help="exit once caught up and no message came for SECONDS",
    )
    m.add_argument(
        "--group",
        default=None,
        help="name of the offsets kept in the database; on a lake also the "
        "Kafka consumer group whose members share the partitions",
    )
    m.add_argument("--rules", default=None, metavar="FILE", help="failure rule table (default: db/rules.toml)")
    add_create_folder(m)
    m.add_argument(
        "--no-serve",
        action="store_true",
        help="publish no snapshot of the file for readers (<db>.snapshots/): they cannot read it while this runs",
    )
    m.add_argument(
        "--memory-limit",
        default=Options.memory_limit,
        help=f"DuckDB memory limit of the writer (default {Options.memory_limit})",
    )
    m.add_argument(
        "--lock-wait",
        type=float,
        default=Options.lock_wait,
        metavar="SECONDS",
        help="how long to wait for another process holding the file (flightrec readers leave "
        "at once); then exit 1 naming it",
    )
    m.add_argument(
        "--webhook",
        default=None,
        metavar="URL",
        help="post a Slack-compatible JSON message per new failure, status change or new failure kind here "
        "(default $FLIGHTREC_WEBHOOK)",
    )
    m.add_argument(
        "--alert-on",
        default=None,
        metavar="KINDS",
        help="which alerts, comma separated: failed,lost,below_min_rate,incomplete,refused,failure_kind "
        "(default $FLIGHTREC_ALERT_ON, else all)",
    )
    m.add_argument(
        "--metrics-port",
        type=int,
        default=None,
        metavar="N",
        help="serve Prometheus metrics on http://ADDRESS:N/metrics (lag, folds, commits, dead letters, alerts, "
        "instances by status; docs/materializer.md)",
    )
    m.add_argument(
        "--metrics-address",
        default=Options.metrics_address,
        metavar="ADDRESS",
        help="the address /metrics and /health listen on (default 127.0.0.1: this host only; 0.0.0.0: every "
        "interface, for a Prometheus on another host)",
    )
    m.set_defaults(func=_materialize)
    r = sub.add_parser("replay", help="rebuild a database from the topics")
    r.add_argument(
        "--db",
        default=None,
        help="the NEW database file to build, or a DuckLake holding no events yet "
        "('ducklake:postgres:dbname=… host=… port=… user=…')",
    )
    r.add_argument(
        "--data-path",
        default=None,
        metavar="DIR",
        help="a DuckLake --db's data folder for its Parquet files (default $FLIGHTREC_DATA_PATH); "
        "every writer of the lake must reach it",
    )
    r.add_argument("--since", default=None, help="only events at/after TIME (ISO-8601, epoch s, or an age: 2h)")
    r.add_argument("--instance", default=None, help="only this instance's events")
    r.add_argument(
        "--archive",
        default=None,
        metavar="URI",
        help="read what the topics no longer hold from this archive first (default $FLIGHTREC_ARCHIVE; "
        "`flightrec archive` writes it), then the topics from where it ends",
    )
    r.add_argument("--group", default=None, help="name of the offsets kept in the new database")
    r.add_argument("--rules", default=None, metavar="FILE", help="failure rule table (default: db/rules.toml)")
    add_create_folder(r)
    r.add_argument(
        "--memory-limit",
        default=Options.memory_limit,
        help=f"DuckDB memory limit of the writer (default {Options.memory_limit})",
    )
    r.set_defaults(func=_replay)
    t = sub.add_parser("timeline", help="print one instance's life")
    t.add_argument("instance", help="the instance id")
    add_read_db(t)
    t.add_argument("--from-topics", action="store_true", help="read the topics even if the database exists")
    t.add_argument("--max-lines", type=int, default=2000, help="log lines shown, the latest (0: all)")
    t.add_argument(
        "--rules", default=None, metavar="FILE", help="failure rule table for --from-topics (default: db/rules.toml)"
    )
    t.set_defaults(func=_timeline)
    w = sub.add_parser("wait-sealed", help="wait until an instance's evidence is complete")
    w.add_argument("instance", help="the instance id")
    add_read_db(w)
    w.add_argument(
        "--timeout", type=float, default=60.0, metavar="SECONDS", help="give up after SECONDS (exit 3; default 60)"
    )
    w.add_argument(
        "--poll", type=float, default=0.5, metavar="SECONDS", help="read the database again every SECONDS (default 0.5)"
    )
    w.set_defaults(func=_wait_sealed)


def add_create_folder(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--create-folder",
        action="store_true",
        help="make the --db file's folder when it does not exist (without it a missing folder is refused: "
        "a mistyped path would start a new database from the topics' beginning)",
    )


def check_folder(loc: Location, create: bool) -> None:
    """Refuse a database file whose folder does not exist, unless asked to create it (ConfigError)."""
    path = getattr(loc, "path", None)
    if path is None or create or path.parent.is_dir():
        return
    raise ConfigError(
        f"--db {path}: the folder {path.parent} does not exist; check the path (a new database would be built "
        "from the topics' beginning), or add --create-folder to make it"
    )


def _ensure_topics(settings: Settings) -> None:
    """Create the topics where missing. When Kafka cannot be reached or refuses this client (login, TLS), stop
    here with that one cause, before the store makes a database file; anything else only warns (an ACL that
    forbids creating topics to this principal, say: the materializer reads topics made by another)."""
    from flightrec.broker.topics import ensure_topics
    from flightrec.cluster import connection_cause

    try:
        asyncio.run(
            asyncio.wait_for(
                ensure_topics(
                    settings.kafka_kwargs(),
                    partitions=settings.partitions,
                    replication=settings.replication,
                    retention_ms=settings.retention_ms,
                ),
                20.0,
            )
        )
    except Exception as exc:  # noqa: BLE001 - why is told below: the cause that stops us, or a warning
        cause = asyncio.run(connection_cause(settings.kafka_kwargs()))
        if cause:
            raise MaterializeError(f"cannot read Kafka: {cause}") from exc
        log.warning("could not make sure the topics exist: %s", exc)


def _reader_location(db: str, data_path: str | None) -> Location:
    from flightrec.db.location import reader_location

    return reader_location(db, data_path)


def _run(opts: Options, loc: Location, settings: Settings) -> int:
    from flightrec.consumers.materializer import Materializer
    from flightrec.db.markers import unfinished_lake_replay
    from flightrec.db.nopandas import keep_pandas_out

    keep_pandas_out()  # pyarrow would import it at the first commit (db/nopandas.py)
    made = None if loc.shared or loc.exists() else getattr(loc, "path", None)  # a file this run makes

    unfinished: list[str] = []  # a lake's replay stopped before its end offsets (a file's says so by its marker)

    async def go() -> int:
        loop = asyncio.get_running_loop()
        kind: type[Materializer] = Materializer
        if loc.shared:  # a lake: written by a consumer group of materializers
            from flightrec.consumers.group import GroupMaterializer

            kind = GroupMaterializer
        async with kind(settings.kafka_kwargs(), opts) as m:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, m.stop)
            stats = await m.run()
            if opts.replay and loc.shared and not m.replay_finished:
                unfinished.append(loc.describe())
        print(
            f"events_received={stats.events_received} lines_written={stats.lines_written} "
            f"dead_letters={stats.dead_letters} duplicates_dropped={stats.duplicates_dropped} "
            f"commits={stats.commits}"
            + (
                f" conflicts_retried={stats.conflicts_retried} fenced={stats.fenced} "
                f"catalog_waits={stats.catalog_waits}"
                if loc.shared
                else ""
            )
            + (f" oom_retried={stats.oom_retried}" if stats.oom_retried else ""),
            file=sys.stderr,
        )
        if unfinished:
            print(f"flightrec replay: {unfinished_lake_replay(unfinished[0])}", file=sys.stderr)
            return 1
        return 0

    try:
        return asyncio.run(go())
    except CredentialError:
        if made is not None:  # nothing could be read into it: no empty database is left behind (nor a replay's marker)
            for path in (made, made.with_name(made.name + ".wal"), made.with_name(made.name + ".replaying")):
                path.unlink(missing_ok=True)
        raise


def _materialize(args: argparse.Namespace, settings: Settings) -> int:
    from flightrec.consumers.alerts import parse_kinds
    from flightrec.db.location import locate

    settings = settings.with_overrides(db=args.db, webhook=args.webhook, alert_on=args.alert_on)
    kinds = parse_kinds(settings.alert_on)
    loc = locate(settings.db, args.data_path, writing=True)
    check_folder(loc, args.create_folder)
    if loc.shared and settings.webhook:
        raise ConfigError(
            "--webhook/FLIGHTREC_WEBHOOK: alerts are sent by a materializer on a database file only "
            "(on a lake no single member sees every instance's changes); unset it for the lake, or run "
            "a materializer on a file for alerts"
        )
    if args.metrics_port is not None and not 1 <= args.metrics_port <= 65535:
        raise ConfigError(f"--metrics-port {args.metrics_port}: a TCP port is 1 to 65535")
    if loc.shared and args.metrics_port is not None:
        raise ConfigError(
            "--metrics-port: metrics are served by a materializer on a database file only (a lake's members "
            "each see a share of the partitions); leave it out for the lake"
        )
    _ensure_topics(settings)
    return _run(materialize_options(args, settings, loc, kinds), loc, settings)


def materialize_options(args: argparse.Namespace, settings: Settings, loc: Location, kinds: tuple[str, ...]) -> Options:
    """The materializer's options from its flags and settings (``kinds``: the alerts the webhook gets)."""
    from flightrec.consumers.materializer import DEFAULT_GROUP, Options
    from flightrec.db.classify import load_rules
    from flightrec.db.keep import Keep
    from flightrec.db.kinds import KindWindows
    from flightrec.db.views import stored_views

    return Options(
        db=settings.db,
        group=args.group or DEFAULT_GROUP,
        until_idle=args.until_idle,
        rules=load_rules(args.rules),
        rules_file=settings.rules_file,
        serve=not args.no_serve and not loc.shared,
        memory_limit=args.memory_limit,
        lock_wait=args.lock_wait,
        commit_interval=settings.commit_interval,
        webhook=settings.webhook,
        alert_on=kinds,
        dashboard_url=settings.dashboard_url,
        alert_max_age=settings.alert_max_age,
        views=stored_views(KindWindows.from_settings(settings)),
        kind_windows=KindWindows.from_settings(settings),
        data_path=getattr(loc, "data_path", None),
        trust=trust_config(settings),
        metrics_port=args.metrics_port,
        metrics_address=args.metrics_address,
        keep=Keep.from_settings(settings),
        compact_free_share=settings.compact_free_share,
        archive=settings.archive,
    )


def trust_config(settings: Settings) -> TrustConfig:
    """What the materializer verifies with (db/trust.py): the fleet key, and what an untagged event gets."""
    from flightrec.db.trust import TrustConfig
    from flightrec.schemas.auth import parse_fleet_key

    if not settings.fleet_key:
        if settings.unauthenticated == "refuse":
            raise ConfigError(
                "FLIGHTREC_UNAUTHENTICATED=refuse needs FLIGHTREC_FLEET_KEY (without it no tag can be checked)"
            )
        return TrustConfig(None, "accept")
    return TrustConfig(
        parse_fleet_key(settings.fleet_key), "accept" if settings.unauthenticated == "accept" else "refuse"
    )


def _replay(args: argparse.Namespace, settings: Settings) -> int:
    from flightrec.consumers.materializer import DEFAULT_GROUP, Options, parse_time
    from flightrec.db.classify import load_rules
    from flightrec.db.kinds import KindWindows
    from flightrec.db.location import locate
    from flightrec.db.views import stored_views

    settings = settings.with_overrides(db=args.db)
    loc = locate(settings.db, args.data_path, writing=True)
    check_folder(loc, args.create_folder)
    opts = Options(
        db=settings.db,
        group=args.group or DEFAULT_GROUP,
        replay=True,
        instance=args.instance,
        since_us=parse_time(args.since) if args.since else None,
        rules=load_rules(args.rules),
        rules_file=settings.rules_file,
        memory_limit=args.memory_limit,
        views=stored_views(KindWindows.from_settings(settings)),
        serve=not loc.shared,
        data_path=getattr(loc, "data_path", None),
        trust=trust_config(settings),
        archive=args.archive or settings.archive,
    )
    from flightrec.consumers.archive import ArchiveGap
    from flightrec.db.location import FileLocation
    from flightrec.db.markers import replaying_path, unfinished_replay

    try:
        code = _run(opts, loc, settings)
    except ArchiveGap:
        if isinstance(loc, FileLocation):  # made by this replay (an existing file is refused): nothing in it
            for made in (loc.path, loc.path.with_name(loc.path.name + ".wal"), replaying_path(loc.path)):
                made.unlink(missing_ok=True)
        raise
    if isinstance(loc, FileLocation) and replaying_path(loc.path).exists():  # stopped before its end offsets
        print(f"flightrec replay: {unfinished_replay(loc.path)}", file=sys.stderr)
        return 1
    return code


def _timeline(args: argparse.Namespace, settings: Settings) -> int:
    from flightrec.consumers import timeline
    from flightrec.db.classify import load_rules
    from flightrec.db.nopandas import keep_pandas_out

    keep_pandas_out()  # a conversion to Arrow would import it, in a command a person waits for (BENCHMARKS.md)
    settings = settings.with_overrides(db=args.db)
    loc = _reader_location(settings.db, args.data_path)
    if loc.exists() and not args.from_topics:
        entries, left_out = timeline.from_db(loc, args.instance, args.max_lines)
    else:
        if not args.from_topics:
            print(f"no database at {settings.db}; reading the topics at {settings.bootstrap}", file=sys.stderr)
        messages = _read_topics(settings, args.instance)
        entries, left_out = (
            timeline.entries_from_messages(messages, args.instance, load_rules(args.rules), args.max_lines)
            if messages
            else ([], 0)
        )
    if not entries:
        print(f"flightrec timeline: no events of instance {args.instance}", file=sys.stderr)
        return 1
    color = sys.stdout.isatty() and not os.environ.get("NO_COLOR")  # https://no-color.org
    print(timeline.render(entries, left_out, color=color))
    return 0


def _read_topics(settings: Settings, instance: str) -> list[Any]:  # RawMessages (db.fold), imported late
    """The instance's messages from the topics; a credential that may not read them ends the command in one line."""
    from flightrec.access import refusal_line, refusal_of
    from flightrec.consumers import timeline
    from flightrec.errors import CredentialError
    from flightrec.settings import TOPICS

    try:
        return asyncio.run(timeline.read_instance_messages(settings.kafka_kwargs(), instance, TOPICS))
    except Exception as exc:
        refusal = refusal_of(exc)
        if refusal is None:
            raise
        raise CredentialError(refusal_line(refusal, settings.kafka_kwargs(), "read")) from exc


def _wait_sealed(args: argparse.Namespace, settings: Settings) -> int:
    from flightrec.consumers.gate import wait_sealed

    settings = settings.with_overrides(db=args.db)
    loc = _reader_location(settings.db, args.data_path)
    result = wait_sealed(loc, args.instance, args.timeout, poll=max(0.0, args.poll))
    if result.complete:
        print(f"{args.instance}: complete: {result.reason}")
        return 0
    if result.status is not None:  # lost / destroyed: the missing events will not come
        print(f"flightrec wait-sealed: {args.instance} is {result.reason}", file=sys.stderr)
        return 3
    print(
        f"flightrec wait-sealed: {args.instance} not complete after {args.timeout:g}s: {result.reason}"
        + _materializer_note(loc),
        file=sys.stderr,
    )
    return 3


def _materializer_note(loc: Location) -> str:
    """'; no materializer is running on DB ...: start ...' when the seal may be in Kafka unread, else ''."""
    import time

    from flightrec.cli.status import read_health
    from flightrec.db.health import BEHIND_AFTER_S, ago
    from flightrec.errors import FlightrecError

    try:
        h, serving = read_health(loc)
    except FlightrecError:
        return ""
    now = time.time_ns() // 1000
    where = loc.describe()
    if serving is False:
        return (
            f"; no materializer is running on {where} (its last commit: {ago(h.last_commit_us, now)}): the seal may "
            f"be waiting in Kafka unread; start one: flightrec materialize --db {where}"
        )
    if h.caught_up_us is None or now - h.caught_up_us > BEHIND_AFTER_S * 1e6:
        return (
            f"; the materializer's input was last read to the end {ago(h.caught_up_us, now)} (its last commit: "
            f"{ago(h.last_commit_us, now)}): it lags or cannot reach Kafka, and the seal may be among what it has "
            "not read (`flightrec status`)"
        )
    return ""
