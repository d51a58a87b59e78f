"""Who may do what at a SASL_SSL broker: the principals, their ACLs, the agents' produce quota.

Pure: the same argument lists run at ``flightrec broker start --security sasl_ssl`` (through Kafka's own
``AclCommand`` and ``ConfigCommand``) and are printed in docs/security.md for a managed cluster.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from flightrec.errors import ConfigError

TOPIC_PREFIX = "flightrec."  # every flightrec topic (flightrec.schemas.topics.TOPICS)
GROUP_PREFIX = "flightrec"  # the materializer's group (flightrec-materializer) and any other of the operator's
READER_GROUP_PREFIX = "flightrec-reader"  # the groups a reader may use for its own consumers

# Bump when the grants below change: a broker started before re-applies them at its next start.
ROLES_VERSION = 1


@dataclass(frozen=True)
class Role:
    """One principal (a SCRAM user), where its password lives in the data folder and which env file names it."""

    name: str
    user: str
    password_file: str
    env_file: str | None  # None: the super user, whose password goes into no env file
    purpose: str


ADMIN = Role(
    "admin",
    "flightrec",
    "admin.password",
    None,
    "the super user: inter-broker traffic and `broker start` itself (topics, ACLs, quotas); never on an instance",
)
OPERATOR = Role(
    "operator",
    "flightrec-operator",
    "client.password",
    "client.env",
    "materializer, manager, replay, timeline --from-topics, topics create: reads and writes the topics, "
    "uses the groups flightrec*",
)
READER = Role(
    "reader",
    "flightrec-reader",
    "reader.password",
    "reader.env",
    "reads the topics (its own consumer groups flightrec-reader*); writes nothing",
)
AGENT = Role(
    "agent",
    "flightrec-agent",
    "agent.password",
    "agent.env",
    "what goes into instances: produces to the topics, nothing else (no reads, no groups, no administration)",
)
ROLES: tuple[Role, ...] = (ADMIN, OPERATOR, READER, AGENT)


@dataclass(frozen=True)
class Grant:
    """Operations one role may perform on every topic or group whose name starts with ``prefix``."""

    role: Role
    resource: str  # "topic" or "group"
    prefix: str
    operations: tuple[str, ...]

    def acl_args(self) -> list[str]:
        """The arguments of ``kafka-acls.sh`` (``org.apache.kafka.tools.AclCommand``) adding this grant."""
        args = ["--add", "--allow-principal", f"User:{self.role.user}"]
        for op in self.operations:
            args += ["--operation", op]
        return args + [f"--{self.resource}", self.prefix, "--resource-pattern-type", "prefixed"]


# DescribeConfigs for the agent: it learns each topic's max.message.bytes to split large log batches
# (producer/deliver.py); a topic's configuration is no secret. Idempotent produce needs no IdempotentWrite on
# the cluster since Kafka 3.0 (KIP-679): Write on a topic is enough.
GRANTS: tuple[Grant, ...] = (
    Grant(AGENT, "topic", TOPIC_PREFIX, ("Write", "Describe", "DescribeConfigs")),
    Grant(OPERATOR, "topic", TOPIC_PREFIX, ("Read", "Write", "Describe", "DescribeConfigs", "Create")),
    Grant(OPERATOR, "group", GROUP_PREFIX, ("Read", "Describe", "Delete")),
    Grant(READER, "topic", TOPIC_PREFIX, ("Read", "Describe", "DescribeConfigs")),
    Grant(READER, "group", READER_GROUP_PREFIX, ("Read", "Describe")),
)


def quota_args(byte_rate: int) -> list[str]:
    """The arguments of ``kafka-configs.sh`` (``kafka.admin.ConfigCommand``) giving each client id of the agent
    principal ``byte_rate`` bytes per second of produce (the most specific quota Kafka finds applies)."""
    if byte_rate <= 0:
        raise ConfigError(
            f"FLIGHTREC_AGENT_BYTE_RATE={byte_rate}: the agents' produce quota must be a positive number of bytes "
            "per second; set it to one (the default is 5242880, 5 MiB/s) or unset it"
        )
    return [
        "--alter",
        "--add-config",
        f"producer_byte_rate={byte_rate}",
        "--entity-type",
        "users",
        "--entity-name",
        AGENT.user,
        "--entity-type",
        "clients",
        "--entity-default",
    ]


def user_args(role: Role, mechanism: str, password: str) -> list[str]:
    """The arguments of ``kafka-configs.sh`` creating (or resetting) ``role``'s SCRAM credential."""
    return [
        "--alter",
        "--add-config",
        f"{mechanism}=[password={password}]",
        "--entity-type",
        "users",
        "--entity-name",
        role.user,
    ]


def fingerprint(byte_rate: int) -> str:
    """What the grants and the quota amount to: a broker whose marker differs applies them again."""
    text = repr((ROLES_VERSION, [g.acl_args() for g in GRANTS], quota_args(byte_rate)))
    return f"v{ROLES_VERSION} {hashlib.sha256(text.encode()).hexdigest()[:16]}"
