"""`agent flush` with nothing listening gives up at once, as docs/agent.md says (not after its 30 s timeout)."""

from __future__ import annotations

import time

from flightrec.producer.spool import Spool


def test_flush_with_the_broker_down_gives_up_at_once_and_keeps_the_events(spool_env) -> None:
    r = spool_env.run("run", "--stage", "params", "--", "sh", "-c", "echo fetched")
    assert r.returncode == 0, r.stderr
    sp = Spool(spool_env.spool, spool_env.instance)
    waiting = sp.pending()
    assert waiting >= 3
    t0 = time.monotonic()
    f = spool_env.run("flush")  # its default --timeout is 30 s: a Kafka that does not answer is not waited for
    took = time.monotonic() - t0
    assert f.returncode == 1, f.stderr
    assert took < 10, f"agent flush with nothing listening took {took:.1f} s"
    assert b"does not answer" in f.stderr or b"nothing listens" in f.stderr, f.stderr
    assert Spool(spool_env.spool, spool_env.instance).pending() == waiting  # nothing lost
