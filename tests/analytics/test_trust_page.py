"""The Fleet page says which instances are unauthenticated and how many events were refused in whose name."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "consumers"))  # materializer_helpers

from flightrec.db.filestore import FileStore  # noqa: E402  # after the helpers' path
from flightrec.db.fold import RawMessage, fold  # noqa: E402  # after the helpers' path
from flightrec.db.trust import Trust, TrustConfig  # noqa: E402  # after the helpers' path
from flightrec.schemas import Lifecycle, encode  # noqa: E402  # after the helpers' path
from flightrec.schemas.auth import enroll, new_fleet_key, parse_fleet_key  # noqa: E402  # after the helpers' path
from materializer_helpers import Boot  # noqa: E402  # beside the consumers' tests, where the fold's helpers live


def test_fleet_page_names_refused_events_and_unauthenticated_instances(tmp_path: Path, open_page) -> None:
    fleet = parse_fleet_key(new_fleet_key())
    honest, legacy, victim = Boot(instance="honest-1"), Boot(instance="legacy-1"), Boot(instance="victim-1")
    for b in (honest, legacy, victim):
        b.add(Lifecycle, stage="benchmark", state="started")
    keys = {b.instance: enroll(fleet, b.instance, 1) for b in (honest, victim)}
    forged = Lifecycle(
        event_id="forged-1",
        instance_id="victim-1",
        boot_id=victim.boot,
        seq=1,
        ts_us=victim.t0 + 1000,
        stage="benchmark",
        state="failed",
    )
    msgs = []
    for n, (ev, signer) in enumerate(
        [
            (honest.events[0], keys["honest-1"]),
            (victim.events[0], keys["victim-1"]),
            (legacy.events[0], None),
            (forged, keys["honest-1"]),
        ]
    ):
        key, value = ev.instance_id.encode(), encode(ev)
        headers = (signer.header(ev.topic, 0, key, value),) if signer else ()
        msgs.append(RawMessage(ev.topic, 0, n, key, value, headers=headers))
    db = tmp_path / "trust.duckdb"
    store = FileStore(db, "g")
    store.commit(fold(msgs, trust=Trust(TrustConfig(fleet, "accept"))))
    store.close()
    at = open_page(db)
    errors = " ".join(e.value for e in at.error)
    assert "1 event(s) refused" in errors and "victim" in errors and "honest" in errors  # whose key forged
    warnings = " ".join(w.value for w in at.warning)
    assert "1 instance(s) unauthenticated" in warnings and "legacy" in warnings and "honest" not in warnings
