"""The `flightrec` command: one console script whose subcommands wire the parts together."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence

from flightrec import __version__
from flightrec.cli import agent, analytics, broker, catalog, demo, history, manager, materialize, prove, sql
from flightrec.errors import FlightrecError, MissingExtraError
from flightrec.settings import Settings

GROUPS = (broker, catalog, agent, manager, materialize, history, sql, analytics, prove, demo)
# The top-level modules of the packages an extra brings (pyproject.toml [project.optional-dependencies]); a command
# that imports one where it is absent says which extra to install (tests/cli/test_profiles.py keeps this current).
EXTRA_OF_MODULE = {
    "duckdb": "server",
    "adbc_driver_duckdb": "server",
    "duckdb_extension_ducklake": "server",
    "duckdb_extension_postgres_scanner": "server",
    "pyarrow": "server",
    "streamlit": "server",
    "altair": "server",
    "pandas": "server",
    "numpy": "server",
    "pytz": "server",
    "prometheus_client": "server",
    "pycuda": "gpu",
}


def build_parser() -> argparse.ArgumentParser:
    """The whole command tree; each module in flightrec.cli registers its own commands."""
    parser = argparse.ArgumentParser(
        prog="flightrec",
        description="A flight recorder for fleets of rented GPU proving machines.",
    )
    parser.add_argument("--version", action="version", version=f"flightrec {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for group in GROUPS:
        group.register(sub)
    return parser


def _configure_logging(level: str) -> None:
    logging.basicConfig(
        stream=sys.stderr,
        level=getattr(logging, level, logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    # aiokafka logs every failed connection attempt at ERROR: each distinct message is shown once (an
    # authentication or TLS error stays visible; a broker that is away does not flood stderr).
    if getattr(logging, level, logging.INFO) > logging.DEBUG:  # its INFO is chatter (CA loaded, authenticated)
        logging.getLogger("aiokafka").setLevel(logging.WARNING)
    for handler in logging.getLogger().handlers:
        handler.addFilter(OncePerMessage("aiokafka"))


class OncePerMessage(logging.Filter):
    """Lets each distinct message template of the loggers under ``prefix`` through once per process."""

    def __init__(self, prefix: str) -> None:
        super().__init__()
        self.prefix = prefix
        self._seen: set[tuple[str, str]] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        if not record.name.startswith(self.prefix):
            return True
        key = (record.name, str(record.msg))
        if key in self._seen:
            return False
        self._seen.add(key)
        return True


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; FlightrecError becomes a one-line message and exit status 1; a closed pipe ends quietly."""
    return run_command(build_parser(), argv)


def run_command(parser: argparse.ArgumentParser, argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` with ``parser`` and run the chosen command (shared by `flightrec` and `flightrec-agent`)."""
    args = parser.parse_args(argv)
    try:
        settings = Settings.from_env()
        _configure_logging(settings.log_level)
        return int(args.func(args, settings) or 0)
    except FlightrecError as exc:
        print(f"{parser.prog} {args.command}: {exc}", file=sys.stderr)
        return 1
    except ModuleNotFoundError as exc:
        extra = EXTRA_OF_MODULE.get((exc.name or "").partition(".")[0])
        if extra is None:
            raise
        print(f"{parser.prog} {args.command}: {MissingExtraError(exc.name or '', extra)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return _closed_pipe()


def _closed_pipe() -> int:
    """The reader of stdout went away (`| head`): end quietly with the status a shell gives SIGPIPE."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())  # the interpreter's last flush must not fail again
    return 128 + 13
