"""The destroy gate tells "not sealed" from "no materializer is running" (the seal may be in Kafka, unread), and
says what to start."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from flightrec.db.filestore import FileStore
from flightrec.db.fold import RawMessage, fold
from flightrec.schemas import Lifecycle, encode
from materializer_helpers import Boot

EXE = str(Path(sys.executable).with_name("flightrec"))


def test_wait_sealed_says_no_materializer_runs_and_what_to_start(tmp_path: Path) -> None:
    db = tmp_path / "fleet.duckdb"
    b = Boot()
    b.add(Lifecycle, stage="benchmark", state="started")
    store = FileStore(db, group="gate")
    store.commit(fold([RawMessage(e.topic, 0, n, e.instance_id.encode(), encode(e)) for n, e in enumerate(b.events)]))
    store.close()
    r = subprocess.run(
        [EXE, "wait-sealed", b.instance, "--db", str(db), "--timeout", "1"], capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 3, r.stderr
    assert "not sealed" in r.stderr and "no materializer is running" in r.stderr, r.stderr
    assert f"flightrec materialize --db {db}" in r.stderr, r.stderr
