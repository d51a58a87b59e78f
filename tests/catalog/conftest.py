"""Fixtures for the lake tests: a lake holding the dashboard tests' three-instance fleet, and pages on it."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from flightrec.db import lake as lakes

_ANALYTICS_FIXTURES = Path(__file__).resolve().parent.parent / "analytics" / "conftest.py"


def _analytics_fixtures() -> Any:
    """tests/analytics/conftest.py as a module: its build_arrow_db writes the fleet the page tests know."""
    spec = importlib.util.spec_from_file_location("flightrec_tests_analytics_fixtures", _ANALYTICS_FIXTURES)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def copy_into_lake(file: Path, db: str, data_path: str) -> list[str]:
    """Every table of the DuckDB file ``file`` copied into the lake (CREATE TABLE … AS FROM); their names."""
    con = lakes.connect(lakes.parse_db(db, data_path, writing=True))
    try:
        con.execute(f"ATTACH '{file}' AS src (READ_ONLY)")
        names = [
            r[0]
            for r in con.execute(
                "SELECT table_name FROM duckdb_tables() WHERE database_name = 'src' ORDER BY 1"
            ).fetchall()
        ]
        con.execute("BEGIN")
        for name in names:
            con.execute(f'CREATE TABLE lake."{name}" AS FROM src."{name}"')
        con.execute("COMMIT")
        return names
    finally:
        con.close()


@pytest.fixture
def fleet_lake(lake: tuple[str, str], tmp_path: Path) -> Iterator[tuple[str, str, dict[str, Any]]]:
    """A lake holding the three-instance fleet of the dashboard tests: (db string, data path, ids)."""
    db, data_path = lake
    file = tmp_path / "fleet.duckdb"
    ids = _analytics_fixtures().build_arrow_db(file)
    copy_into_lake(file, db, data_path)
    yield db, data_path, ids


@pytest.fixture
def lake_file_pair(lake: tuple[str, str], tmp_path: Path) -> tuple[str, Path]:
    """The same fleet as a lake and as a file: (lake db string, file path)."""
    db, data_path = lake
    file = tmp_path / "fleet.duckdb"
    _analytics_fixtures().build_arrow_db(file)
    copy_into_lake(file, db, data_path)
    return db, file
