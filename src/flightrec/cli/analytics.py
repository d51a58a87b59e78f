"""`flightrec dashboard`: start the Streamlit app (analytics/) on a database, headless."""

from __future__ import annotations

import argparse
import logging
import os
import sys

from flightrec.cli.options import LAKE_FORM, add_read_db
from flightrec.settings import Settings

log = logging.getLogger(__name__)


def register(sub: argparse._SubParsersAction) -> None:
    d = sub.add_parser(
        "dashboard",
        help="start the Streamlit app",
        description="Start the Streamlit dashboard (Fleet, Instance, Failures, Throughput, SQL) "
        "on a flightrec database; while a materializer runs, it reads the snapshot the materializer publishes.",
    )
    add_read_db(
        d, f"the database (default: $FLIGHTREC_DB, else flightrec.duckdb), or a DuckLake: {LAKE_FORM}, read read-only"
    )
    d.add_argument("--port", type=int, default=8501, help="HTTP port (default 8501)")
    d.add_argument(
        "--address",
        default="127.0.0.1",
        help="address to listen on (default 127.0.0.1; 0.0.0.0 serves every interface)",
    )
    d.set_defaults(func=run_dashboard)


def streamlit_command(db: str, port: int, address: str) -> list[str]:
    """The `streamlit run` command line for the app's entry script, headless, on ``db``."""
    from flightrec.analytics import ENTRY_SCRIPT

    return [
        sys.executable,
        "-m",
        "streamlit",
        "run",
        str(ENTRY_SCRIPT),
        "--server.headless",
        "true",
        "--server.port",
        str(port),
        "--server.address",
        address,
        "--browser.gatherUsageStats",
        "false",
        "--server.fileWatcherType",
        "none",
        "--client.toolbarMode",
        "minimal",  # no "Deploy" button, no developer menu
        "--",
        "--db",
        db,
    ]


def run_dashboard(args: argparse.Namespace, settings: Settings) -> int:
    """Replace this process with Streamlit (so signals reach it directly); never returns on success."""
    from flightrec.db.location import reader_location

    loc = reader_location(args.db or settings.db, args.data_path)  # the data path into os.environ: Streamlit's
    if not loc.exists():
        log.warning(
            "no database at %s yet; the pages say so until `flightrec materialize --db %s` creates it",
            loc.describe(),
            loc.describe(),
        )
    env = dict(os.environ)
    shown = loc.for_command_line()  # None for a lake: its string (a password, perhaps) goes by the environment only
    env["FLIGHTREC_DB"] = shown or loc.db
    env["PYTHONSAFEPATH"] = "1"  # keep the working directory off sys.path (./cuda would shadow NVIDIA's package)
    cmd = streamlit_command(shown or "", args.port, args.address)
    if shown is None:
        cmd = cmd[:-3]
    print(f"flightrec dashboard: http://{args.address}:{args.port}/ on {loc.describe()}", file=sys.stderr, flush=True)
    os.execve(cmd[0], cmd, env)
    return 0  # pragma: no cover - execve does not return
