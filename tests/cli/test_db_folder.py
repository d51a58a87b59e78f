"""`materialize` and `replay` refuse a --db file whose folder does not exist (a mistyped path silently made folders
and a new database from the topics' beginning), unless --create-folder says to make it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

FLIGHTREC = str(Path(sys.executable).parent / "flightrec")


@pytest.mark.parametrize("command", ["materialize", "replay"])
def test_a_db_in_a_missing_folder_is_refused_before_anything_is_made(tmp_path: Path, command: str) -> None:
    db = tmp_path / "mistyped" / "fleet.duckdb"
    env = dict(os.environ, FLIGHTREC_BOOTSTRAP="127.0.0.1:9")  # nothing listens: the refusal comes first
    r = subprocess.run([FLIGHTREC, command, "--db", str(db)], capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 1, r.stderr
    assert f"the folder {db.parent} does not exist" in r.stderr and "--create-folder" in r.stderr, r.stderr
    assert not db.parent.exists()


def test_create_folder_makes_it(tmp_path: Path) -> None:
    db = tmp_path / "new" / "fleet.duckdb"
    env = dict(os.environ, FLIGHTREC_BOOTSTRAP="127.0.0.1:9")
    r = subprocess.run(
        [FLIGHTREC, "materialize", "--db", str(db), "--create-folder"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert "does not exist" not in r.stderr, r.stderr  # it goes on to Kafka (here away: its own error)
    assert r.returncode == 1 and "no Kafka broker answered" in r.stderr, r.stderr
