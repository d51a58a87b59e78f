"""Every reader command, with no Kafka at its address and no database at its path: one line that says what to do,
a non-zero exit, no traceback, and no file left behind."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

NOWHERE = "127.0.0.1:9"  # nothing listens on the discard port
LAKE = "ducklake:postgres:dbname=x host=127.0.0.1 port=9 user=u"

READERS = [
    ("timeline", ["timeline", "x", "--db", "{db}", "--from-topics"], "no Kafka broker answered at 127.0.0.1:9"),
    ("timeline", ["timeline", "x", "--db", "{db}"], "no Kafka broker answered at 127.0.0.1:9"),
    ("timeline", ["timeline", "x", "--db", LAKE], "cannot attach the lake"),
    ("sql", ["sql", "--db", "{db}", "SELECT * FROM fleet"], "no database at"),
    ("sql", ["sql", "--db", LAKE, "SELECT 1"], "cannot attach the lake"),
    ("wait-sealed", ["wait-sealed", "x", "--db", "{db}", "--timeout", "1"], "no database at"),
    ("wait-sealed", ["wait-sealed", "x", "--db", LAKE, "--timeout", "1"], "cannot attach the lake"),
]


@pytest.mark.parametrize(("command", "argv", "says"), READERS, ids=[" ".join(r[1][:2] + r[1][3:4]) for r in READERS])
def test_a_reader_without_kafka_or_database_ends_with_one_line(tmp_path, command, argv, says):
    db = tmp_path / "gone.duckdb"
    r = subprocess.run(
        [sys.executable, "-m", "flightrec", *[a.replace("{db}", str(db)) for a in argv]],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONSAFEPATH": "1", "FLIGHTREC_BOOTSTRAP": NOWHERE, "FLIGHTREC_HOME": str(tmp_path)},
    )
    assert r.returncode != 0, r
    assert "Traceback" not in r.stderr and "Unclosed" not in r.stderr, r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith(f"flightrec {command}: ") and says in last, r.stderr
    assert not db.exists(), "a reader made a database file"
