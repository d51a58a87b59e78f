"""broker.topics.served: topic creation returns once every broker of the bootstrap list serves the topics."""

from __future__ import annotations

import asyncio
import time

from flightrec.broker.topics import ensure_topics, served


def test_new_topics_are_served_when_created_and_an_unknown_one_is_reported(kafka) -> None:
    kwargs = {"bootstrap_servers": kafka.bootstrap}
    name = f"served-{time.time_ns()}"
    assert asyncio.run(ensure_topics(kwargs, [name], partitions=3)) == [name]
    assert asyncio.run(served(kwargs, [name], 3, timeout=0.1))  # ready at once: ensure_topics waited for it
    started = time.monotonic()
    assert not asyncio.run(served(kwargs, [f"{name}-never"], 3, timeout=1.0))
    assert 1.0 <= time.monotonic() - started < 10.0
