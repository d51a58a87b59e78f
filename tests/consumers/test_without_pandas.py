"""`flightrec materialize`, `replay` and `timeline` fold, write and read without importing pandas (pyarrow would, at
its first conversion: ~0.3-1 s of CPU at the first commit, apache/arrow#34994)."""

from __future__ import annotations

import pytest
from materializer_helpers import flightrec, motivating_boot, publish

pytestmark = pytest.mark.integration


def _pandas_loaded(stderr: str) -> set[str]:
    """pandas' modules `python -X importtime` reported loading (its lines: 'import time: self | cumulative | name');
    a refused import reports its top-level name alone, a real one its many submodules."""
    names = {line.rsplit("|", 1)[1].strip() for line in stderr.splitlines() if line.startswith("import time:")}
    return {n for n in names if n.startswith("pandas.")} | ({"pyarrow"} - names) | ({"duckdb"} - names)


def test_the_materializer_a_replay_and_a_timeline_without_pandas(kafka, db, env_for, tmp_path):
    boot = motivating_boot()
    publish(kafka.bootstrap, boot.events)
    kafka.seed_at_mark(db)
    env = env_for(PYTHONPROFILEIMPORTTIME="1")
    r = flightrec("materialize", "--db", str(db), "--until-idle", "1", "--no-serve", env=env)
    assert "lines_written=0" not in r.stderr, r.stderr  # a LogBatch was folded: pyarrow converted its lines
    assert not _pandas_loaded(r.stderr), "the materializer imported pandas (or no pyarrow/duckdb: nothing folded)"
    r = flightrec("replay", "--db", str(tmp_path / "replayed.duckdb"), "--instance", boot.instance, env=env)
    assert "lines_written=0" not in r.stderr, r.stderr
    assert not _pandas_loaded(r.stderr), "the replay imported pandas"
    r = flightrec("timeline", "--db", str(db), boot.instance, env=env)
    assert "no kernel image" in r.stdout, r.stdout
    assert not _pandas_loaded(r.stderr), "the timeline imported pandas"
