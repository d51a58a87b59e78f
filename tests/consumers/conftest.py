"""Fixtures of the materializer tests; the helpers live in materializer_helpers.py (importable from here)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # tests/consumers only, for materializer_helpers


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "flightrec.duckdb"


@pytest.fixture
def env_for(kafka: Any):
    def make(**extra: str) -> dict[str, str]:
        return kafka.env(FLIGHTREC_LOG_LEVEL="WARNING", **extra)

    return make
