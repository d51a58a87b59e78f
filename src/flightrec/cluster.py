"""What any Kafka cluster tells a client: each topic's message limit, and why a connection fails."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from typing import Any

from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaError

from flightrec.settings import TOPICS


async def describe_topic_configs(
    admin: AIOKafkaAdminClient, topics: Iterable[str], timeout: float = 10.0
) -> dict[str, dict[str, str]]:
    """Each topic's configuration as the cluster describes it (name -> value; broker defaults included), through a
    started admin client. A topic the cluster does not know is absent. Raises KafkaError (or a timeout) when the
    configs cannot be described, e.g. without DescribeConfigs rights."""
    from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

    names = list(topics)
    responses = await asyncio.wait_for(
        admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, t) for t in names]), timeout
    )
    out: dict[str, dict[str, str]] = {}
    for resp in responses:
        for res in resp.resources:
            code, _msg, _rtype, name, entries = res[:5]
            if code:
                continue
            out[name] = {str(e[0]): str(e[1]) for e in entries if e[1] is not None}
    return out


async def topic_limits(
    kafka_kwargs: dict[str, Any], topics: Iterable[str] = TOPICS, timeout: float = 10.0
) -> dict[str, int]:
    """Each topic's ``max.message.bytes`` as the cluster describes it (the broker default when not overridden).

    Raises KafkaError (or a timeout) when the configs cannot be described, e.g. without DescribeConfigs rights.
    """
    admin = AIOKafkaAdminClient(request_timeout_ms=int(timeout * 1000), **kafka_kwargs)
    await asyncio.wait_for(admin.start(), timeout)
    try:
        configs = await describe_topic_configs(admin, topics, timeout)
        return {t: int(c["max.message.bytes"]) for t, c in configs.items() if "max.message.bytes" in c}
    finally:
        await admin.close()


# The topic setting that makes every record carry the broker's clock (its LogAppendTime): the receive time
# liveness is judged by (docs/materializer.md, "Clocks"). flightrec creates its topics with it.
TIMESTAMP_TYPE = "message.timestamp.type"
LOG_APPEND_TIME = "LogAppendTime"


def create_time_warning(types: dict[str, str], bootstrap: str) -> str | None:
    """What to tell an operator whose topics stamp the sender's clock (CreateTime), or None when every described
    topic stamps the broker's. Pure."""
    stale = sorted(t for t, kind in types.items() if kind != LOG_APPEND_TIME)
    if not stale:
        return None
    fix = "; ".join(
        f"kafka-configs.sh --bootstrap-server {bootstrap} --alter --entity-type topics --entity-name {t} "
        f"--add-config {TIMESTAMP_TYPE}={LOG_APPEND_TIME}"
        for t in stale
    )
    return (
        f"topics {', '.join(stale)} stamp records with the sender's clock ({TIMESTAMP_TYPE}="
        f"{types[stale[0]]}), so flightrec cannot tell when it received their events: liveness (`lost`) and the "
        "clock offsets fall back to the instances' own clocks, which a wrong clock moves. Switch them to "
        f"{LOG_APPEND_TIME} (it applies to records appended from then on): {fix}"
    )


async def connection_cause(kafka_kwargs: Mapping[str, object], timeout: float = 10.0) -> str | None:
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
            conn = await asyncio.wait_for(
                create_conn(host or "localhost", int(port), request_timeout_ms=int(timeout * 1000), **conn_kwargs),
                timeout,
            )
        except (SaslAuthenticationFailed, AuthenticationFailedError) as exc:
            from flightrec.access import role_of

            user = kafka_kwargs.get("sasl_plain_username")
            causes.append(
                f"the broker at {where} refused the SASL credentials of {role_of(str(user) if user else None)} "
                f"({kafka_kwargs.get('sasl_mechanism')}): wrong user or password; check "
                f"FLIGHTREC_SASL_USERNAME and FLIGHTREC_SASL_PASSWORD_FILE ({exc})"
            )
        except ssl.SSLCertVerificationError as exc:
            causes.append(
                f"the broker at {where} has a TLS certificate this client does not trust "
                f"({exc.verify_message}): set FLIGHTREC_SSL_CAFILE to the CA that signed it"
            )
        except ssl.SSLError as exc:
            causes.append(
                f"TLS with the broker at {where} failed ({exc.reason or exc}): it may not speak TLS on "
                "this port; check FLIGHTREC_SECURITY_PROTOCOL"
            )
        except (ConnectionRefusedError, OSError) as exc:
            if isinstance(exc, ConnectionRefusedError) or getattr(exc, "errno", None) == 111:
                causes.append(
                    f"no Kafka broker answered at {where} (nothing listens there): start one "
                    "(`flightrec broker start`) or set FLIGHTREC_BOOTSTRAP"
                )
            else:
                causes.append(f"cannot connect to {where}: {exc}")
        except (TimeoutError, KafkaError, ValueError) as exc:
            if protocol in ("PLAINTEXT", "SASL_PLAINTEXT"):
                causes.append(
                    f"the broker at {where} closed a {protocol} connection: it expects TLS "
                    "(set FLIGHTREC_SECURITY_PROTOCOL=SASL_SSL or SSL, and FLIGHTREC_SSL_CAFILE)"
                )
            else:
                causes.append(f"the broker at {where} does not answer as Kafka ({type(exc).__name__}: {exc})")
        else:
            conn.close()
            return None
    return causes[0] if causes else None


def partitions_of(described: Iterable[dict[str, Any]], topics: Iterable[str]) -> list[tuple[str, int]]:
    """(topic, partition) of every partition of ``topics`` in a describe_topics answer, sorted. Pure.

    A topic the answer does not hold (not created yet) has no partitions."""
    wanted = set(topics)
    return sorted(
        (t["topic"], int(p["partition"]))
        for t in described
        if t.get("topic") in wanted and not t.get("error_code")
        for p in t.get("partitions") or ()
    )


async def topic_partitions(admin: AIOKafkaAdminClient, topics: Iterable[str]) -> list[tuple[str, int]]:
    """Every partition of ``topics`` now on the cluster, sorted, through the public admin client.

    Asks for the metadata of every topic (as a consumer's own refresh does), so a topic
    not created yet is absent rather than auto-created by the question."""
    return partitions_of(await admin.describe_topics(), topics)


async def partitions_now(kafka_kwargs: dict[str, Any], topics: Iterable[str]) -> list[tuple[str, int]]:
    """:func:`topic_partitions` with an admin client of its own (for one-off readers)."""
    admin = AIOKafkaAdminClient(**kafka_kwargs)
    await admin.start()
    try:
        return await topic_partitions(admin, topics)
    finally:
        await admin.close()
