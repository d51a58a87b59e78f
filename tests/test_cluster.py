"""Partitions from the public admin client's describe_topics answer."""

from __future__ import annotations

import asyncio

from aiokafka.admin import AIOKafkaAdminClient

from flightrec.cluster import partitions_of, topic_partitions
from flightrec.settings import TOPICS


def test_partitions_of_keeps_the_asked_topics_sorted_and_skips_errors():
    described = [
        {"error_code": 0, "topic": "b", "partitions": [{"error_code": 0, "partition": 1}, {"partition": 0}]},
        {"error_code": 0, "topic": "a", "partitions": [{"partition": 2}]},
        {"error_code": 3, "topic": "c", "partitions": []},
        {"error_code": 0, "topic": "other", "partitions": [{"partition": 0}]},
    ]
    assert partitions_of(described, ["a", "b", "c", "missing"]) == [("a", 2), ("b", 0), ("b", 1)]


def test_topic_partitions_on_a_real_broker_creates_nothing(kafka):
    async def go() -> tuple[list[tuple[str, int]], list[tuple[str, int]], list[str]]:
        admin = AIOKafkaAdminClient(bootstrap_servers=kafka.bootstrap)
        await admin.start()
        try:
            ours = await topic_partitions(admin, TOPICS)
            absent = await topic_partitions(admin, ["flightrec.never-created"])
            return ours, absent, await admin.list_topics()
        finally:
            await admin.close()

    ours, absent, names = asyncio.run(go())
    assert {t for t, _ in ours} == set(TOPICS) and all(p >= 0 for _, p in ours)
    assert absent == [] and "flightrec.never-created" not in names
