"""The command reference (docs/cli.md), generated from the argument parser itself."""

from __future__ import annotations

import argparse
import functools

WIDTH = 100  # the terminal width docs/cli.md is written for, whatever the terminal (or none) renders it


def _subparsers(parser: argparse.ArgumentParser) -> list[tuple[str, argparse.ArgumentParser]]:
    out: list[tuple[str, argparse.ArgumentParser]] = []
    for action in parser._actions:  # argparse keeps subcommands here; there is no public accessor
        if isinstance(action, argparse._SubParsersAction):
            out.extend(action.choices.items())
    return out


def _walk(parser: argparse.ArgumentParser, prefix: str) -> list[tuple[str, argparse.ArgumentParser]]:
    found = [(prefix, parser)]
    for name, sub in _subparsers(parser):
        found.extend(_walk(sub, f"{prefix} {name}"))
    return found


def _help(parser: argparse.ArgumentParser) -> str:
    """The parser's --help wrapped at WIDTH (argparse would take the width from $COLUMNS or the terminal; it
    keeps two columns free, as on a terminal of WIDTH columns)."""
    kept = parser.formatter_class
    parser.formatter_class = functools.partial(kept, width=WIDTH - 2)  # type: ignore[call-arg]  # every HelpFormatter takes width
    try:
        return parser.format_help().rstrip()
    finally:
        parser.formatter_class = kept


def render(parser: argparse.ArgumentParser) -> str:
    """Markdown with every command's --help, in the parser's order."""
    parts = [
        "# Command reference",
        "",
        "Generated from the parser by `make docs` (`python -m flightrec.cli.reference`);",
        "a test checks it is current.",
        "",
    ]
    for prefix, sub in _walk(parser, "flightrec"):
        parts += [f"## `{prefix}`", "", "```", _help(sub), "```", ""]
    return "\n".join(parts)


if __name__ == "__main__":
    from flightrec.cli import build_parser

    print(render(build_parser()), end="")
