"""The `flightrec` command: one console script whose subcommands wire the parts together."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence

from flightrec import __version__
from flightrec.cli import (
    agent,
    analytics,
    backup,
    broker,
    catalog,
    demo,
    history,
    kinds,
    manager,
    materialize,
    prove,
    rules,
    sql,
    status,
)
from flightrec.errors import FlightrecError, MissingExtraError
from flightrec.settings import Settings

GROUPS = (
    broker, catalog, agent, manager, materialize, history, status, kinds, rules, backup, sql, analytics, prove, demo
)  # fmt: skip
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


class CommandParser(argparse.ArgumentParser):
    """A subcommand's parser: an argument it does not know is its own error, said with its own usage (argparse
    leaves such arguments to the top-level parser, which printed the top-level usage)."""

    def parse_known_args(  # type: ignore[override]  # the same signature; typeshed's overloads differ
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        parsed, extras = super().parse_known_args(args, namespace)
        if extras:
            self.error(f"unrecognized arguments: {' '.join(extras)}")
        return parsed, extras


def build_parser() -> argparse.ArgumentParser:
    """The whole command tree; each module in flightrec.cli registers its own commands."""
    parser = argparse.ArgumentParser(
        prog="flightrec",
        description="A flight recorder for fleets of rented GPU proving machines.",
    )
    parser.add_argument("--version", action="version", version=f"flightrec {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True, parser_class=CommandParser)
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
    reserve_standard_fds()
    args = parser.parse_args(argv)
    try:
        # a command that runs a stage reads its settings leniently: what it cannot read takes the default, said
        unusable: list[str] | None = [] if getattr(args, "lenient_settings", False) else None
        settings = Settings.from_env(unusable=unusable)
        _configure_logging(settings.log_level)
        for problem in unusable or ():
            print(f"{parser.prog} {args.command}: {problem}; using the default (the command runs)", file=sys.stderr)
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


def reserve_standard_fds() -> None:
    """Put /dev/null on any of the standard descriptors (0, 1, 2) the process was started without (``cmd >&-``):
    a file it opens later would take the lowest free number, and what is written to stdout or stderr (the stage's
    passed-through output, a log line) would land in it (the spool). The wrapped command then reads /dev/null as
    its stdin where it had none; its output the agent reads through pipes as ever."""
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            null = os.open(os.devnull, os.O_RDWR)  # the lowest free number: ``fd``, the ones below are open
            if null != fd:
                os.dup2(null, fd)
                os.close(null)


def _closed_pipe() -> int:
    """The reader of stdout went away (`| head`): end quietly with the status a shell gives SIGPIPE."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())  # the interpreter's last flush must not fail again
    return 128 + 13
