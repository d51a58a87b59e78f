"""The dashboard says when the materializer of its database file waits for disk space (the marker it leaves)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from flightrec.db.markers import disk_full_path


@pytest.mark.slow  # two renders of the app (~5 s)
def test_the_dashboard_shows_a_full_disk_and_forgets_it_when_room_returns(arrow_db, open_page, tmp_path: Path):
    db = tmp_path / "fleet.duckdb"
    shutil.copy(arrow_db[0], db)
    disk_full_path(db).touch()
    at = open_page(db)
    errors = [str(e.value) for e in at.error]
    assert any("disk is full" in e and "Nothing is lost" in e for e in errors), errors
    disk_full_path(db).unlink()
    at = open_page(db)
    assert not any("disk is full" in str(e.value) for e in at.error)
