"""An idle materializer logs its counters only when they changed (it logged the same line every 10 s: 8,600 a day)."""

from __future__ import annotations

import logging
from pathlib import Path

from materializer_helpers import materialize, motivating_boot, publish


def test_an_idle_materializer_logs_its_stats_line_only_when_it_changed(kafka, tmp_path: Path, caplog) -> None:
    db = tmp_path / "quiet.duckdb"
    kafka.seed_at_mark(db)
    publish(kafka.bootstrap, motivating_boot().events)
    with caplog.at_level(logging.INFO, logger="flightrec.consumers.materializer"):
        materialize(kafka, db, idle=21.0)  # two report ticks (every 10 s) after the first commit
    said = [r.getMessage() for r in caplog.records if "events_received=" in r.getMessage()]
    assert said, "the counters after the first commit are logged once"
    assert len(said) == len(set(said)), said
