"""consumers/progress.py: the caught-up moment is the latest ask whose every end offset the commits reached."""

from __future__ import annotations

from flightrec.consumers.progress import RECORD_EVERY_S, Progress

A, B = ("flightrec.logs", 0), ("flightrec.logs", 1)


def test_the_moment_waits_for_every_partition_and_only_moves_forward() -> None:
    p = Progress()
    p.asked(100, {A: 5, B: 7})
    p.asked(200, {A: 9, B: 7})
    assert p.advance({A: 5}) is None  # B not read to 7 yet
    assert p.advance({A: 5, B: 7}) == 100
    assert p.advance({A: 8, B: 7}) is None and p.caught_up_us == 100
    assert p.advance({A: 9, B: 7}) == 200
    p.asked(150, {A: 0, B: 0})  # an older moment never moves it back
    assert p.advance({A: 9, B: 7}) is None and p.caught_up_us == 200


def test_a_partition_never_read_and_empty_is_caught_up() -> None:
    p = Progress()
    p.asked(100, {A: 0, B: 3})
    assert p.advance({B: 3}) == 100


def test_writes_are_spaced_unless_forced() -> None:
    p = Progress()
    p.asked(100, {A: 1})
    p.advance({A: 1})
    assert p.due(now=10.0) == 100
    p.written(100, now=10.0)
    p.asked(200, {A: 1})
    p.advance({A: 1})
    assert p.due(now=10.0 + RECORD_EVERY_S / 2) is None
    assert p.due(now=10.0 + RECORD_EVERY_S / 2, force=True) == 200
    assert p.due(now=10.0 + RECORD_EVERY_S) == 200
