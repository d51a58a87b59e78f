"""The Kafka topics events travel on (a contract of the wire, like the .avsc files): names, and which event goes
where."""

from __future__ import annotations

TOPIC_LIFECYCLE = "flightrec.lifecycle"  # Lifecycle, InstanceFacts, Sealed, Dropped, Heartbeat, ManagerEvent
TOPIC_LOGS = "flightrec.logs"  # LogBatch
TOPIC_EXITS = "flightrec.exits"  # ProcessExit
TOPIC_METRICS = "flightrec.metrics"  # throughput: Throughput (kind sample) and BenchmarkResult (kind result)
TOPICS: tuple[str, ...] = (TOPIC_LIFECYCLE, TOPIC_LOGS, TOPIC_EXITS, TOPIC_METRICS)
