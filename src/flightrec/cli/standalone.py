"""`flightrec-agent`: the agent alone (run, event, facts, flush, seal, manager event), as pip installs it and as the
single file `make agent-binary` builds (docs/agent-binary.md)."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from flightrec import __version__

PROG = "flightrec-agent"
LATE = "flightrec.producer.late"  # the late-output process: `flightrec-agent -m flightrec.producer.late …`


def build_parser() -> argparse.ArgumentParser:
    """`flightrec agent`'s actions at the top, and `manager event`: the same flags as under `flightrec`."""
    from flightrec.cli import CommandParser, agent, manager

    parser = argparse.ArgumentParser(
        prog=PROG, description="The flightrec instance agent: wrap stages, publish their lines and exits to Kafka."
    )
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True, parser_class=CommandParser)
    agent.add_actions(sub, PROG)
    manager.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one agent command; in the single file, also the agent's own helper processes."""
    from flightrec.cli import run_command

    args = list(sys.argv[1:] if argv is None else argv)
    if getattr(sys, "frozen", False):
        _frozen_environment()
        if args[:2] == ["-m", LATE]:  # the agent starts its late-output process as `sys.executable -m …`
            from flightrec.producer import late

            sys.argv = [LATE, *args[2:]]
            late.main()
            return 0
    return run_command(build_parser(), args)


def _frozen_environment() -> None:
    """Undo what the single file's loader put in the environment, so that CMD gets the caller's own.

    PyInstaller's onefile loader points ``LD_LIBRARY_PATH`` at its unpacked libraries (and keeps the caller's value
    in ``LD_LIBRARY_PATH_ORIG``): a stage's programs must not load the agent's OpenSSL or zlib. Its ``_PYI_*``
    variables describe this process alone: without them a `flightrec-agent` that a stage starts, and the agent's
    late-output process (which outlives this process and its unpacked folder), unpack their own copy.
    """
    from flightrec.producer import term

    orig = os.environ.pop("LD_LIBRARY_PATH_ORIG", None)
    if orig is not None:
        os.environ["LD_LIBRARY_PATH"] = orig
    else:
        os.environ.pop("LD_LIBRARY_PATH", None)
    for name in [n for n in os.environ if n.startswith("_PYI_") or n == "_MEIPASS2"]:
        del os.environ[name]
    if _onefile():
        term.LOADER_PID = os.getppid()  # the loader passes every signal it gets on to this process


def _onefile() -> bool:
    """Whether this process runs under PyInstaller's onefile loader (a parent process that unpacked it)."""
    meipass = getattr(sys, "_MEIPASS", None)
    return meipass is not None and os.path.dirname(os.path.abspath(sys.executable)) != os.path.abspath(meipass)


if __name__ == "__main__":
    raise SystemExit(main())
