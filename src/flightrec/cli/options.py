"""Command-line options that several commands share, written once."""

from __future__ import annotations

import argparse

LAKE_FORM = "'ducklake:postgres:dbname=… host=… port=… user=…'"


def add_read_db(p: argparse.ArgumentParser, db_help: str | None = None) -> None:
    """``--db`` and ``--data-path`` of a command that reads a database file or a DuckLake."""
    p.add_argument(
        "--db", default=None, help=db_help or f"database file, or a DuckLake: {LAKE_FORM} (default $FLIGHTREC_DB)"
    )
    p.add_argument(
        "--data-path",
        default=None,
        metavar="DIR",
        help="a DuckLake's data folder where it differs on this host (default $FLIGHTREC_DATA_PATH, "
        "else the one the lake's catalog recorded)",
    )
