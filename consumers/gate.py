"""The destroy gate: wait until an instance's evidence is complete in the database, or say why not."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from flightrec.db.location import Location, locate
from flightrec.db.query import run_query
from flightrec.db.views import VIEWS

from flightrec.errors import QueryError


@dataclass(frozen=True)
class GateResult:
    """Whether the instance's latest boot is sealed with every seq present, and if not, why."""

    complete: bool
    reason: str
    status: str | None = None  # the fleet status when the gate gives up at once (lost, destroyed)


HOPELESS = ("lost", "destroyed", "forgotten")  # statuses after which no missing event will come: waiting is pointless
# (db, instance) -> (status, status detail) of the instance, or None
StatusOf = Callable[[str | Path | Location, str], tuple[str, str] | None]


def fleet_status(db: str | Path | Location, instance: str) -> tuple[str, str] | None:
    """The instance's status from the readers' one rule table (a forgotten one too, which the fleet view leaves
    out), or None when it has no events."""
    rows = run_query(
        db, "SELECT status, status_detail FROM instance_status WHERE instance_id = ?", [instance], prelude=VIEWS
    ).to_pylist()
    return (rows[0]["status"], rows[0]["status_detail"]) if rows else None


def check_sealed(db: str | Path | Location, instance: str, status_of: StatusOf | None = fleet_status) -> GateResult:
    """One look at the database (live or not); a lost or destroyed instance (``status_of``) is final."""
    db = locate(db)
    if not db.exists():
        return GateResult(False, f"no database at {db.describe()} yet")
    rows = run_query(
        db, "SELECT complete, incomplete_reason, boot_id, events FROM instances WHERE instance_id = ?", [instance]
    ).to_pylist()
    if not rows:
        return GateResult(False, f"instance {instance} has no events in {db.describe()}")
    r = rows[0]
    if r["complete"]:
        return GateResult(
            True,
            f"boot {r['boot_id']} sealed with all {r['events']} events"
            + _dropped(db, r["boot_id"])
            + _left_running(db, r["boot_id"]),
        )
    missing = f"boot {r['boot_id']}: {r['incomplete_reason']} ({r['events']} events so far)" + _sealing(
        db, r["boot_id"]
    )
    status = status_of(db, instance) if status_of is not None else None
    if status is not None and status[0] in HOPELESS:
        return GateResult(False, f"{status[0]} ({status[1]}); missing: {missing}", status[0])
    return GateResult(False, missing)


def _dropped(db: Location, boot_id: str) -> str:
    """'; 1 event dropped: seq 7 LogBatch of 6123 bytes dropped: ...' for a boot with Dropped markers, else ''."""
    rows = run_query(
        db,
        """SELECT seq, detail FROM lifecycle_events WHERE boot_id = ? AND kind = 'dropped'
                            ORDER BY seq""",
        [boot_id],
    ).to_pylist()
    if not rows:
        return ""
    what = "; ".join(f"seq {d['seq']} {d['detail']}" for d in rows)
    return f"; {len(rows)} event{'s' if len(rows) > 1 else ''} dropped: {what}"


def _left_running(db: Location, boot_id: str) -> str:
    """'; the seal says: still running when sealed ...' when the seal named what it could not wait for, else ''."""
    rows = run_query(
        db,
        """SELECT detail FROM lifecycle_events WHERE boot_id = ? AND kind = 'sealed'
                            AND detail LIKE '%still running when sealed%' ORDER BY seq""",
        [boot_id],
    ).to_pylist()
    return "".join(f"; the seal says: {r['detail']}" for r in rows)


def _sealing(db: Location, boot_id: str) -> str:
    """'; the seal waits ... for the late output of stage X (...) since HH:MM:SS' while a seal waits, else ''.

    A seal that waits for a stage's late output says so first (a Lifecycle ``info`` event with the attribute
    ``seal_waits_for``); the boot is not sealed until that output is all in, so the gate tells what it waits for.
    """
    rows = run_query(
        db,
        """SELECT detail, strftime(make_timestamp(ts_us), '%H:%M:%S') AS since FROM lifecycle_events
                            WHERE boot_id = ? AND kind = 'lifecycle' AND state = 'info'
                              AND map_contains(attributes, 'seal_waits_for')
                              AND NOT EXISTS (SELECT 1 FROM lifecycle_events s
                                              WHERE s.boot_id = ? AND s.kind = 'sealed')
                            ORDER BY seq""",
        [boot_id, boot_id],
    ).to_pylist()
    return "".join(f"; {r['detail']} (since {r['since']} UTC)" for r in rows)


def wait_sealed(
    db: str | Path | Location,
    instance: str,
    timeout: float,
    poll: float = 0.5,
    status_of: StatusOf | None = fleet_status,
) -> GateResult:
    """Poll until complete or ``timeout`` seconds pass; the last reason is returned on timeout.

    A lost or destroyed instance that is not complete fails at once (``status`` set).
    """
    db = locate(db)
    deadline = time.monotonic() + timeout
    while True:
        try:
            result = check_sealed(db, instance, status_of)
        except QueryError as exc:
            result = GateResult(False, f"cannot read {db.describe()}: {exc}")
        if result.complete or result.status is not None or time.monotonic() >= deadline:
            return result
        time.sleep(min(poll, max(0.0, deadline - time.monotonic())))
