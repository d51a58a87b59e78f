"""Pure parts of liveness: heartbeat gaps, the fold of heartbeats and manager events, the status rule table."""

from __future__ import annotations

from flightrec.db.fold import RawMessage, fold
from flightrec.db.liveness import ago, heartbeat_gaps
from flightrec.db.status import STATUS_RULES, STATUSES, status_case
from flightrec.schemas import Heartbeat, ManagerEvent, encode

S = 1_000_000


def _beats(boot: str, times_s: list[float], stage: str = "supervisor") -> list[dict]:
    return [{"boot_id": boot, "seq": i, "ts_us": int(t * S), "stage": stage} for i, t in enumerate(times_s)]


def test_gaps_between_heartbeats_and_the_open_gap_of_a_silent_boot():
    beats = _beats("b1", [0, 30, 60, 300, 330])  # 60 -> 300: 240 s of silence at a 30 s interval
    gaps = heartbeat_gaps(beats, {"b1": 30.0}, now_us=500 * S)
    assert [(g.since_us // S, g.until_us and g.until_us // S) for g in gaps] == [(60, 300), (330, None)]
    assert heartbeat_gaps(beats, {"b1": 30.0}, now_us=500 * S, sealed_boots=["b1"])[-1].until_us == 300 * S
    # a later event of the boot (the stage's end) counts as a sign of life
    assert [g.until_us for g in heartbeat_gaps(beats, {"b1": 30.0}, 500 * S, (), {"b1": 490 * S})] == [300 * S]
    # within 3 intervals is no gap; a new stage starting later is no gap of the old one
    assert heartbeat_gaps(_beats("b2", [0, 80]), {"b2": 30.0}) == []
    assert (
        heartbeat_gaps(_beats("b3", [0]) + [{"boot_id": "b3", "seq": 5, "ts_us": 500 * S, "stage": "x"}], {"b3": 30.0})
        == []
    )
    assert heartbeat_gaps(beats, {}) == []  # no interval known: no verdict
    assert (ago(42), ago(240), ago(4 * 3600), ago(3 * 86400)) == ("42 s", "4 min", "4 h", "3 d")


def test_heartbeats_count_in_the_boot_and_manager_events_do_not():
    hb = Heartbeat(event_id="h1", instance_id="i", boot_id="b", seq=3, ts_us=5, stage="bench", interval_s=30.0, pid=7)
    me = ManagerEvent(
        event_id="m1",
        instance_id="i",
        boot_id="mgr",
        seq=0,
        ts_us=6,
        source_id="manager@x",
        kind="destroyed",
        detail="why",
        attributes={"k": "v"},
    )
    d = fold(
        [
            RawMessage("flightrec.lifecycle", 0, n, b"i", encode(e), 1_700_000_000_000 + n, 1)  # LogAppendTime
            for n, e in enumerate([hb, me, hb])
        ]
    )
    assert d.events.drop_columns(["fingerprint"]).to_pylist() == [
        {
            "event_id": "h1",
            "instance_id": "i",
            "boot_id": "b",
            "seq": 3,
            "ts_us": 5,
            "kind": "heartbeat",
            "stage": "bench",
            "recv_us": 1_700_000_000_000_000,
            "key_id": None,
            "sent_us": None,
        }
    ]
    assert d.manager.column("recv_us").to_pylist() == [1_700_000_000_001_000]
    assert d.heartbeats.column("interval_s").to_pylist() == [30.0] and d.duplicates == 1
    assert d.manager.to_pylist()[0]["kind"] == "destroyed" and d.lifecycle.num_rows == 0
    # on the wrong topic it is a dead letter, like any event
    assert fold([RawMessage("flightrec.logs", 0, 0, b"i", encode(me))]).dead.num_rows == 1


def test_the_status_rule_table_is_one_ordered_case():
    assert STATUSES[:5] == ("forgotten", "destroyed", "failed", "below_min_rate", "finished")
    assert set(STATUSES) >= {"running", "healthy", "failed", "below_min_rate", "lost", "destroyed", "finished"}
    case = status_case()
    assert case.index("'destroyed'") < case.index("'failed'") < case.index("'lost'") < case.index("'running'")
    assert all(r.meaning for r in STATUS_RULES)
    assert "now()" not in case  # only the silence, computed in the view, reads the clock
