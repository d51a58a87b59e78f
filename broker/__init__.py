"""How a local Apache Kafka is obtained (Maven Central) and run (KRaft combined mode)."""

from flightrec.broker.local import (
    KAFKA_VERSION,
    BrokerStatus,
    LocalBroker,
    check_java,
    fetch_kafka,
    kafka_libs_dir,
)
from flightrec.broker.topics import ensure_topics

__all__ = [
    # running a broker
    "LocalBroker",
    "BrokerStatus",
    "KAFKA_VERSION",
    # obtaining Kafka
    "fetch_kafka",
    "kafka_libs_dir",
    "check_java",
    # talking to any cluster
    "ensure_topics",
]
