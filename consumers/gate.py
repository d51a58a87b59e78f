"""The destroy gate: wait until an instance's evidence is complete in the database, or say why not."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from flightrec.errors import QueryError
from flightrec.query import run_query


@dataclass(frozen=True)
class GateResult:
    """Whether the instance's latest boot is sealed with every seq present, and if not, why."""

    complete: bool
    reason: str


def check_sealed(db: str | Path, instance: str) -> GateResult:
    """One look at the database (live or not)."""
    if not Path(db).exists():
        return GateResult(False, f"no database at {db} yet")
    rows = run_query(db, "SELECT complete, incomplete_reason, boot_id, events FROM instances WHERE instance_id = ?",
                     [instance]).to_pylist()
    if not rows:
        return GateResult(False, f"instance {instance} has no events in {db}")
    r = rows[0]
    if r["complete"]:
        return GateResult(True, f"boot {r['boot_id']} sealed with all {r['events']} events" + _dropped(db, r["boot_id"]))
    return GateResult(False, f"boot {r['boot_id']}: {r['incomplete_reason']} ({r['events']} events so far)")


def _dropped(db: str | Path, boot_id: str) -> str:
    """'; 1 event dropped: seq 7 LogBatch of 6123 bytes dropped: ...' for a boot with Dropped markers, else ''."""
    rows = run_query(db, """SELECT seq, detail FROM lifecycle_events WHERE boot_id = ? AND kind = 'dropped'
                            ORDER BY seq""", [boot_id]).to_pylist()
    if not rows:
        return ""
    what = "; ".join(f"seq {d['seq']} {d['detail']}" for d in rows)
    return f"; {len(rows)} event{'s' if len(rows) > 1 else ''} dropped: {what}"


def wait_sealed(db: str | Path, instance: str, timeout: float, poll: float = 0.5) -> GateResult:
    """Poll until complete or ``timeout`` seconds pass; the last reason is returned on timeout."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            result = check_sealed(db, instance)
        except QueryError as exc:
            result = GateResult(False, f"cannot read {db}: {exc}")
        if result.complete or time.monotonic() >= deadline:
            return result
        time.sleep(min(poll, max(0.0, deadline - time.monotonic())))
