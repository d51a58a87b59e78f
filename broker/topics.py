"""Topic creation and liveness checks that work against any Kafka cluster."""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Iterable

from aiokafka import AIOKafkaClient
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import KafkaError, TopicAlreadyExistsError

from flightrec.errors import BrokerError
from flightrec.settings import STOCK_MAX_MESSAGE_BYTES, TOPICS  # noqa: F401 - re-exported

log = logging.getLogger(__name__)


async def answers_metadata(kafka_kwargs: dict[str, Any], timeout: float = 3.0) -> bool:
    """True when a broker at the bootstrap address answers a metadata request."""
    if not await _any_port_open(kafka_kwargs.get("bootstrap_servers", ""), timeout):
        return False  # nothing listens: skip the client, which would log a connect error
    client = AIOKafkaClient(request_timeout_ms=int(timeout * 1000), **kafka_kwargs)
    try:
        await asyncio.wait_for(client.bootstrap(), timeout)
        return bool(client.cluster.brokers())
    except (KafkaError, OSError, asyncio.TimeoutError):
        return False
    finally:
        await client.close()


async def _any_port_open(bootstrap: str, timeout: float) -> bool:
    for hostport in str(bootstrap).split(","):
        host, _, port = hostport.strip().rpartition(":")
        try:
            _, writer = await asyncio.wait_for(asyncio.open_connection(host or "localhost", int(port)), timeout)
        except (OSError, ValueError, asyncio.TimeoutError):
            continue
        writer.close()
        return True
    return False


async def ensure_topics(
    kafka_kwargs: dict[str, Any],
    topics: Iterable[str] = TOPICS,
    partitions: int = 6,
    replication: int = 1,
    retention_ms: int = -1,
) -> list[str]:
    """Create the topics that do not exist yet; return the names created. Idempotent."""
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
        config = {"retention.ms": str(retention_ms), "retention.bytes": "-1"}
        new = [NewTopic(t, num_partitions=partitions, replication_factor=replication, topic_configs=config) for t in wanted]
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
        return created
    finally:
        await admin.close()


async def topic_limits(kafka_kwargs: dict[str, Any], topics: Iterable[str] = TOPICS,
                       timeout: float = 10.0) -> dict[str, int]:
    """Each topic's ``max.message.bytes`` as the cluster describes it (the broker default when not overridden).

    Raises KafkaError (or a timeout) when the configs cannot be described, e.g. without DescribeConfigs rights.
    """
    from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

    admin = AIOKafkaAdminClient(request_timeout_ms=int(timeout * 1000), **kafka_kwargs)
    await asyncio.wait_for(admin.start(), timeout)
    try:
        names = list(topics)
        responses = await asyncio.wait_for(
            admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, t) for t in names]),
            timeout)
        out: dict[str, int] = {}
        for resp in responses:
            for res in resp.resources:
                code, _msg, _rtype, name, entries = res[:5]
                if code:
                    continue
                for entry in entries:
                    if entry[0] == "max.message.bytes" and entry[1] is not None:
                        out[name] = int(entry[1])
        return out
    finally:
        await admin.close()


async def connection_cause(kafka_kwargs: dict[str, Any], timeout: float = 10.0) -> str | None:
    """One line naming why a client with these settings cannot talk to the cluster (None: it can).

    Tries each bootstrap address the way every client connects (TCP, TLS, SASL) and names the first
    cause it meets: nothing listening, an untrusted certificate, a TLS/plaintext mismatch, or
    credentials the broker refused.
    """
    import ssl

    from aiokafka.conn import create_conn
    from aiokafka.errors import AuthenticationFailedError, SaslAuthenticationFailed

    protocol = str(kafka_kwargs.get("security_protocol", "PLAINTEXT"))
    keys = ("ssl_context", "security_protocol", "sasl_mechanism", "sasl_plain_username", "sasl_plain_password")
    conn_kwargs = {k: kafka_kwargs[k] for k in keys if k in kafka_kwargs}
    causes = []
    for hostport in str(kafka_kwargs.get("bootstrap_servers", "")).split(","):
        host, _, port = hostport.strip().rpartition(":")
        where = hostport.strip()
        try:
            conn = await asyncio.wait_for(create_conn(host or "localhost", int(port),
                                                      request_timeout_ms=int(timeout * 1000), **conn_kwargs), timeout)
        except (SaslAuthenticationFailed, AuthenticationFailedError) as exc:
            user = kafka_kwargs.get("sasl_plain_username")
            causes.append(f"the broker at {where} refused the SASL credentials of user {user!r} "
                          f"({kafka_kwargs.get('sasl_mechanism')}): wrong user or password; check "
                          f"FLIGHTREC_SASL_USERNAME and FLIGHTREC_SASL_PASSWORD_FILE ({exc})")
        except ssl.SSLCertVerificationError as exc:
            causes.append(f"the broker at {where} has a TLS certificate this client does not trust "
                          f"({exc.verify_message}): set FLIGHTREC_SSL_CAFILE to the CA that signed it")
        except ssl.SSLError as exc:
            causes.append(f"TLS with the broker at {where} failed ({exc.reason or exc}): it may not speak TLS on "
                          "this port; check FLIGHTREC_SECURITY_PROTOCOL")
        except (ConnectionRefusedError, OSError) as exc:
            if isinstance(exc, ConnectionRefusedError) or getattr(exc, "errno", None) == 111:
                causes.append(f"nothing listens at {where}: start the broker or fix FLIGHTREC_BOOTSTRAP")
            else:
                causes.append(f"cannot connect to {where}: {exc}")
        except (KafkaError, asyncio.TimeoutError, ValueError) as exc:
            if protocol in ("PLAINTEXT", "SASL_PLAINTEXT"):
                causes.append(f"the broker at {where} closed a {protocol} connection: it expects TLS "
                              "(set FLIGHTREC_SECURITY_PROTOCOL=SASL_SSL or SSL, and FLIGHTREC_SSL_CAFILE)")
            else:
                causes.append(f"the broker at {where} does not answer as Kafka ({type(exc).__name__}: {exc})")
        else:
            conn.close()
            return None
    return causes[0] if causes else None
