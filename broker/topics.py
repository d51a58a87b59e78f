"""Topic creation and liveness checks that work against any Kafka cluster."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from typing import Any

from aiokafka import AIOKafkaClient
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import KafkaError, TopicAlreadyExistsError

from flightrec.cluster import LOG_APPEND_TIME, TIMESTAMP_TYPE, connection_cause
from flightrec.errors import BrokerError
from flightrec.settings import TOPICS

log = logging.getLogger(__name__)


async def answers_metadata(kafka_kwargs: dict[str, Any], timeout: float = 3.0) -> bool:
    """True when a broker at the bootstrap address answers a metadata request."""
    if not await _any_port_open(kafka_kwargs.get("bootstrap_servers", ""), timeout):
        return False  # nothing listens: skip the client, which would log a connect error
    client = AIOKafkaClient(request_timeout_ms=int(timeout * 1000), **kafka_kwargs)
    try:
        await asyncio.wait_for(client.bootstrap(), timeout)
        return bool(client.cluster.brokers())
    except (TimeoutError, KafkaError, OSError):
        return False
    finally:
        await client.close()


async def answering_cluster(kafka_kwargs: dict[str, Any], timeout: float = 3.0) -> str | None:
    """The cluster id of the broker answering at the bootstrap address; None when none answers (or it names none)."""
    if not await _any_port_open(kafka_kwargs.get("bootstrap_servers", ""), timeout):
        return None
    admin = AIOKafkaAdminClient(request_timeout_ms=int(timeout * 1000), **kafka_kwargs)
    try:
        await asyncio.wait_for(admin.start(), timeout)
        info = await asyncio.wait_for(admin.describe_cluster(), timeout)
        return str(info.get("cluster_id") or "") or None
    except (TimeoutError, KafkaError, OSError):
        return None
    finally:
        await admin.close()


async def _any_port_open(bootstrap: str, timeout: float) -> bool:
    for hostport in str(bootstrap).split(","):
        host, _, port = hostport.strip().rpartition(":")
        try:
            _, writer = await asyncio.wait_for(asyncio.open_connection(host or "localhost", int(port)), timeout)
        except (TimeoutError, OSError, ValueError):
            continue
        writer.close()
        return True
    return False


def topic_config(retention_ms: int = -1) -> dict[str, str]:
    """The configuration flightrec creates its topics with. LogAppendTime: every record carries the broker's clock,
    the receive time liveness and retention judge by. Kafka's AlterConfigs replaces a topic's whole configuration,
    so whoever alters one sends all of this along with the change."""
    return {"retention.ms": str(retention_ms), "retention.bytes": "-1", TIMESTAMP_TYPE: LOG_APPEND_TIME}


async def ensure_topics(
    kafka_kwargs: dict[str, Any],
    topics: Iterable[str] = TOPICS,
    partitions: int = 6,
    replication: int = 1,
    retention_ms: int = -1,
) -> list[str]:
    """Create the topics that do not exist yet, stamped with the broker's clock (LogAppendTime); return the names
    created. Idempotent: an existing topic is left as it is (the materializer says when it stamps CreateTime)."""
    admin = AIOKafkaAdminClient(**kafka_kwargs)
    try:
        await admin.start()
    except KafkaError as exc:
        await admin.close()
        cause = await connection_cause(kafka_kwargs)
        raise BrokerError(f"cannot create the topics: {cause or exc}") from exc
    try:
        existing = set(await admin.list_topics())
        wanted = [t for t in topics if t not in existing]
        if not wanted:
            return []
        config = topic_config(retention_ms)
        new = [
            NewTopic(t, num_partitions=partitions, replication_factor=replication, topic_configs=config) for t in wanted
        ]
        try:
            response = await admin.create_topics(new)
        except TopicAlreadyExistsError:
            return []
        created = []
        for name, code, *rest in getattr(response, "topic_errors", ()):
            if code == 0:
                created.append(name)
            elif code != TopicAlreadyExistsError.errno:
                raise BrokerError(f"could not create topic {name}: error code {code} {rest}")
        log.info("topics created", extra={"topics": created, "partitions": partitions})
    finally:
        await admin.close()
    await served(kafka_kwargs, created, partitions)
    return created


async def served(kafka_kwargs: dict[str, Any], topics: Iterable[str], partitions: int, timeout: float = 30.0) -> bool:
    """Wait until every broker of the bootstrap list serves ``topics``: each partition with a leader in its metadata.

    A KRaft cluster answers a topic's creation once its controller has it; a broker applies it a moment later (seconds
    under load), and a client asking it meanwhile is told the topic has no partitions. Returns False (and says so)
    when ``timeout`` passes first: the topics exist, clients retry until they are served."""
    topics = list(topics)
    if not topics:
        return True
    deadline = asyncio.get_running_loop().time() + timeout
    for address in str(kafka_kwargs.get("bootstrap_servers", "")).split(","):
        client = AIOKafkaClient(**{**kafka_kwargs, "bootstrap_servers": address.strip()})
        booted = False
        try:
            while True:
                try:
                    if not booted:
                        await client.bootstrap()
                        booted = True
                    await client.force_metadata_update()
                    if all(_led(client, t, partitions) for t in topics):
                        break
                except (KafkaError, OSError):
                    pass
                if asyncio.get_running_loop().time() > deadline:
                    log.warning("topics created but not yet served by %s after %.0f s: clients retry", address, timeout)
                    return False
                await asyncio.sleep(0.2)
        finally:
            await client.close()
    return True


def _led(client: AIOKafkaClient, topic: str, partitions: int) -> bool:
    from aiokafka import TopicPartition

    parts = client.cluster.partitions_for_topic(topic) or set()
    return len(parts) >= partitions and all(
        (client.cluster.leader_for_partition(TopicPartition(topic, p)) or -1) >= 0 for p in parts
    )
