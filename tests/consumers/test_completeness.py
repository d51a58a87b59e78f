"""A sound completeness proof: hand-crafted seq/seal sequences through the real broker and materializer."""

from __future__ import annotations

import dataclasses

import pytest
from flightrec.db.query import run_query
from flightrec.schemas import Sealed
from materializer_helpers import Boot, flightrec, materialize, publish

pytestmark = pytest.mark.integration


def _boot(seqs: list[int], seal_seq: int | None, count: int | None) -> Boot:
    """A boot whose log events carry exactly ``seqs`` and whose seal (if any) is at ``seal_seq`` with ``count``."""
    b = Boot()
    events = []
    for s in seqs:
        b.lines("s", "stdout", [f"line at seq {s}"])
        events.append(dataclasses.replace(b.events[-1], seq=s, ts_us=b.t0 + s * 1000))
    if seal_seq is not None:
        b.add(Sealed, event_count=count, reason="entrypoint ended")
        events.append(dataclasses.replace(b.events[-1], seq=seal_seq, ts_us=b.t0 + seal_seq * 1000))
    b.events = events
    return b


def _parts_boot() -> Boot:
    """A sound boot whose LogBatch at seq 1 arrived in two parts (split by the deliverer for the topic's limit)."""
    b = _boot([0, 1, 1, 2], 3, 4)
    first, second = b.events[1], b.events[2]
    b.events[1] = dataclasses.replace(first, event_id=f"{first.event_id}/part-0-1")
    b.events[2] = dataclasses.replace(second, event_id=f"{first.event_id}/part-1-2")
    return b


CASES = {
    # name: (boot, complete, pieces of the reason)
    "sound": (lambda: _boot(list(range(9)), 9, 10), True, []),
    "count 0 at seq 10, 5..9 missing": (
        lambda: _boot(list(range(5)), 10, 0),
        False,
        ["seal count 0 below seal seq 10", "missing seq 5..9"],
    ),
    "count 3 with 3, 4, 6, 8 present": (
        lambda: _boot([0, 1, 2, 3, 4, 6], 8, 3),
        False,
        ["seal count 3 below seal seq 8", "missing seq 5, 7"],
    ),
    "seal at 2 of 3, then 3, 4, 6": (lambda: _boot([0, 1, 3, 4, 6], 2, 3), False, ["3 events after the seal"]),
    "events after the seal": (lambda: _boot(list(range(5)) + [6, 7, 8], 5, 6), False, ["3 events after the seal"]),
    "a seq twice": (lambda: _boot([0, 1, 1, 2, 3], 4, 5), False, ["seq 1 twice"]),
    "a log batch in two parts": (_parts_boot, True, []),
    "not sealed, with a gap": (lambda: _boot([0, 1, 3], None, None), False, ["not sealed", "missing seq 2"]),
}


def test_complete_means_exactly_a_covering_seal_and_every_seq_once(kafka, db, env_for):
    boots = {name: (make(), complete, why) for name, (make, complete, why) in CASES.items()}
    publish(kafka.bootstrap, [e for b, _, _ in boots.values() for e in b.events])
    materialize(kafka, db, idle=0.5)
    for name, (b, complete, why) in boots.items():
        rows = run_query(
            db, "SELECT complete, incomplete_reason FROM boots WHERE instance_id = ?", [b.instance]
        ).to_pylist()
        assert len(rows) == 1, name
        assert rows[0]["complete"] is complete, (name, rows[0])
        for piece in why:
            assert piece in (rows[0]["incomplete_reason"] or ""), (name, rows[0])
        inst = run_query(
            db, "SELECT complete, incomplete_reason FROM instances WHERE instance_id = ?", [b.instance]
        ).to_pylist()[0]
        assert inst == rows[0], name

    # The destroy gate says it, and opens only for the sound boot.
    env = env_for()
    for name in ("sound", "count 0 at seq 10, 5..9 missing", "events after the seal"):
        b, complete, why = boots[name]
        out = flightrec("wait-sealed", b.instance, "--db", str(db), "--timeout", "0.5", env=env, check=False)
        assert (out.returncode == 0) is complete, (name, out.stdout, out.stderr)
        for piece in why:
            assert piece in out.stderr, (name, out.stderr)


@pytest.mark.parametrize(
    "seq_counts, seal_seq, count, reason",
    [
        ([(s, 1) for s in range(10)], 9, 10, None),
        ([(s, 1) for s in range(5)] + [(10, 1)], 10, 0, "seal count 0 below seal seq 10; missing seq 5..9"),
        ([(s, 1) for s in (0, 1, 2, 3, 4, 6, 8)], 8, 3, "seal count 3 below seal seq 8; missing seq 5, 7"),
        ([(s, 1) for s in range(10)], 9, 11, "missing seq 10"),
        ([(0, 1), (1, 3), (2, 2), (3, 1)], 3, 4, "seq 1 3 times, seq 2 twice"),
        ([(s, 1) for s in range(7)], 5, 6, "1 event after the seal"),
        ([(s, 1) for s in range(4)], None, None, "not sealed"),
        ([(0, 1), (2, 1)], None, None, "not sealed; missing seq 1"),
    ],
)
def test_judge_boot(seq_counts, seal_seq, count, reason):
    from flightrec.db.derive import judge_boot

    assert judge_boot(seq_counts, seal_seq, count) == reason
