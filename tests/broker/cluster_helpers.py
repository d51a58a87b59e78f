"""Helpers of the cluster fault tests: heal the cluster, find a key's partition leader, read the nodes' logs."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

from flightrec.broker.cluster import REPLICATION, LocalCluster

from flightrec.settings import TOPICS


def heal(cluster: LocalCluster, wait_isr: bool = True, timeout: float = 120.0) -> None:
    """Every node running and not stopped (SIGCONT), started again where it died; then (``wait_isr``) every
    partition of the flightrec topics back to three in-sync replicas."""
    for n in cluster.nodes:
        pid = n._pid()
        if pid is not None:
            os.kill(pid, signal.SIGCONT)
    dead = [n for n in cluster.nodes if n._pid() is None]
    if dead:
        cluster._each(lambda n: n.start(timeout=timeout), dead)
    if wait_isr:
        deadline = time.monotonic() + timeout
        while min_isr(cluster.bootstrap) < REPLICATION:
            assert time.monotonic() < deadline, "the cluster's partitions did not get back to 3 in-sync replicas"
            time.sleep(0.5)


def min_isr(bootstrap: str) -> int:
    """The smallest in-sync replica count over the partitions of the flightrec topics (0 when not known)."""

    async def go() -> int:
        from aiokafka import AIOKafkaClient

        client = AIOKafkaClient(bootstrap_servers=bootstrap, request_timeout_ms=5000)
        try:
            await client.bootstrap()
            await client.force_metadata_update()
            parts = [m for t in TOPICS for m in (client.cluster._partitions.get(t) or {}).values()]
            return min((len(m.isr) for m in parts), default=0)
        except Exception:
            return 0
        finally:
            await client.close()

    return asyncio.run(go())


def leaders(bootstrap: str, topic: str) -> dict[int, int]:
    """Each partition of ``topic`` and the node id of its leader, as the cluster's metadata says now."""

    async def go() -> dict[int, int]:
        from aiokafka import AIOKafkaClient, TopicPartition

        client = AIOKafkaClient(bootstrap_servers=bootstrap, request_timeout_ms=5000)
        try:
            await client.bootstrap()
            await client.force_metadata_update()
            parts = sorted(client.cluster.partitions_for_topic(topic) or ())
            return {p: client.cluster.leader_for_partition(TopicPartition(topic, p)) for p in parts}
        finally:
            await client.close()

    return asyncio.run(go())


def partition_of(key: bytes, partitions: int) -> int:
    from aiokafka.partitioner import DefaultPartitioner

    return DefaultPartitioner()(key, list(range(partitions)), list(range(partitions)))


def node_log(cluster: LocalCluster) -> str:
    return "\n".join(f"--- node {n.node_id}\n{Path(n.log_path).read_text()[-3000:]}" for n in cluster.nodes)
