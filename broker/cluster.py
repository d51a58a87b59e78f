"""Run a local three-node Kafka cluster (KRaft, each node a broker and a controller) from Kafka's own jars."""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import json
import logging
import threading
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flightrec.broker.local import KAFKA_VERSION, BrokerStatus, LocalBroker
from flightrec.broker.topics import ensure_topics

from flightrec.errors import BrokerError
from flightrec.localservice import free_port, port_free
from flightrec.settings import Settings

log = logging.getLogger(__name__)

NODES = (1, 3)  # what `flightrec broker --nodes` accepts: one broker, or a cluster that survives one loss
REPLICATION = 3
MIN_INSYNC = 2
NODE_HEAP = "384m"
STOP_GRACE_S = 20.0  # how long `stop` lets a node stop cleanly before SIGKILL (see LocalCluster.stop)

# What makes a cluster a cluster: every replicated topic (the flightrec topics, the consumer offsets, transactions)
# keeps 3 copies and refuses acks=all writes with fewer than 2 in sync. A stalled replica leaves the ISR after
# replica.lag.time.max.ms (Kafka's default 30 s, 10 s here: a hung broker holds acks=all writes 10 s, not 30 s);
# a broker that stops heartbeating is fenced by the controller after broker.session.timeout.ms (default 9 s).
CLUSTER_PROPS = {
    "default.replication.factor": str(REPLICATION),
    "min.insync.replicas": str(MIN_INSYNC),
    "offsets.topic.replication.factor": str(REPLICATION),
    "transaction.state.log.replication.factor": str(REPLICATION),
    "transaction.state.log.min.isr": str(MIN_INSYNC),
    "share.coordinator.state.topic.replication.factor": str(REPLICATION),
    "share.coordinator.state.topic.min.isr": str(MIN_INSYNC),
    "unclean.leader.election.enable": "false",
    "replica.lag.time.max.ms": "10000",
    "broker.session.timeout.ms": "9000",
}


class ClusterNode(LocalBroker):
    """One node of a LocalCluster: LocalBroker's process handling, with the cluster's node id, voters and id."""

    def __init__(self, cluster: LocalCluster, node_id: int, port: int) -> None:
        super().__init__(
            port=port,
            data=cluster.data / f"node-{node_id}",
            settings=cluster.settings,
            heap=cluster.heap,
            security="plaintext",
        )
        self.cluster = cluster
        self.node_id = node_id

    def _controller_port(self) -> int:
        return self.cluster.controller_ports()[self.node_id - 1]

    def _write_config(self) -> Path:
        path = super()._write_config()
        props = dict(line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)
        props.update(CLUSTER_PROPS)
        props["node.id"] = str(self.node_id)
        props["controller.quorum.voters"] = self.cluster.voters()
        path.write_text("".join(f"{k}={v}\n" for k, v in props.items()))
        return path

    def _format(self, java: str, libs: Path, config: Path, cluster_id: str | None = None) -> None:
        super()._format(java, libs, config, cluster_id or self.cluster.cluster_id())

    def _ensure_topics(self) -> list[str]:
        return []  # the cluster creates them once all nodes answer (replication 3 needs three brokers)

    def kill(self, sig: int) -> int:
        """Send ``sig`` to this node's JVM (SIGKILL, SIGSTOP, SIGCONT in fault tests); return its pid."""
        import os

        pid = self._pid()
        if pid is None:
            raise BrokerError(f"node {self.node_id} of the cluster in {self.cluster.data} is not running")
        os.kill(pid, sig)
        return pid


@dataclass(frozen=True)
class ClusterStatus:
    """What `flightrec broker status --nodes 3` reports: each node's status, and whether all of them answer."""

    nodes: tuple[BrokerStatus, ...]
    data: str

    @property
    def answering(self) -> bool:
        return all(n.answering for n in self.nodes)

    def line(self) -> str:
        up = sum(n.answering for n in self.nodes)
        head = f"Kafka {KAFKA_VERSION} cluster in {self.data}: {up} of {len(self.nodes)} nodes answering"
        return "\n".join([head, *(f"  node {i}: {n.line()}" for i, n in enumerate(self.nodes, 1))])


class LocalCluster:
    """Three KRaft nodes on one machine, each a broker and a controller, in DATA/node-1..3 on their own ports.

    One cluster id (DATA/cluster.id) is formatted on every node; ``controller.quorum.voters`` names all three
    controllers (their ports kept in DATA/controller.ports, so one node restarts into the same quorum). ``start``
    starts the nodes together (a quorum needs two of them before any answers) and returns once all three answer and
    the topics exist with replication factor 3 and ``min.insync.replicas=2``; ``stop`` stops them together.
    """

    def __init__(
        self,
        ports: Sequence[int] = (9092, 9093, 9094),
        data: str | Path | None = None,
        settings: Settings | None = None,
        heap: str = NODE_HEAP,
    ) -> None:
        if len(ports) != REPLICATION or len(set(ports)) != REPLICATION:
            raise BrokerError(f"a local cluster needs {REPLICATION} different ports, got {list(ports)}")
        if not all(0 < p < 65536 for p in ports):
            raise BrokerError(f"ports {list(ports)} are not all between 1 and 65535: choose a lower --port")
        self.settings = settings or Settings.from_env()
        self.data = (Path(data) if data else Path(self.settings.home) / f"cluster-{ports[0]}").resolve()
        self.heap = heap
        self._lock = threading.Lock()
        self.nodes = [ClusterNode(self, i, port) for i, port in enumerate(ports, 1)]

    @property
    def bootstrap(self) -> str:
        return ",".join(n.bootstrap for n in self.nodes)

    @property
    def client_settings(self) -> Settings:
        return dataclasses.replace(self.settings, bootstrap=self.bootstrap, security_protocol="PLAINTEXT")

    def node(self, node_id: int) -> ClusterNode:
        return self.nodes[node_id - 1]

    # -- the shared identity ---------------------------------------------------

    def cluster_id(self) -> str:
        """The cluster id every node is formatted with (made once, kept in DATA/cluster.id)."""
        with self._lock:
            path = self.data / "cluster.id"
            try:
                return path.read_text().strip()
            except OSError:
                pass
            formatted = [c for c in (n._cluster_id() for n in self.nodes) if c]
            cid = formatted[0] if formatted else base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
            self.data.mkdir(parents=True, exist_ok=True)
            path.write_text(cid + "\n")
            return cid

    def controller_ports(self) -> list[int]:
        """The three controllers' ports: those kept in DATA/controller.ports, new free ones when none is running and
        one of them is taken (the voters must be the same for every node of one run)."""
        with self._lock:
            path = self.data / "controller.ports"
            try:
                ports = [int(p) for p in path.read_text().split(",")]
            except (OSError, ValueError):
                ports = []
            running = any(n._pid() is not None for n in self.nodes)
            if len(ports) != REPLICATION or (not running and not all(port_free(p) for p in ports)):
                ports = []
                while len(ports) < REPLICATION:
                    p = free_port()
                    if p not in ports and p not in (n.port for n in self.nodes):
                        ports.append(p)
                self.data.mkdir(parents=True, exist_ok=True)
                path.write_text(",".join(map(str, ports)))
            return ports

    def voters(self) -> str:
        return ",".join(f"{i}@127.0.0.1:{p}" for i, p in enumerate(self.controller_ports(), 1))

    def active_controller(self) -> int | None:
        """The node id of the quorum's leader, as the newest epoch in the nodes' quorum-state files says (None when no
        node names one)."""
        best: tuple[int, int] | None = None
        for n in self.nodes:
            try:
                state = json.loads((n.data / "logs" / "__cluster_metadata-0" / "quorum-state").read_text())
            except (OSError, ValueError):
                continue
            leader, epoch = state.get("leaderId", -1), state.get("leaderEpoch", -1)
            if leader is not None and leader > 0 and (best is None or epoch > best[1]):
                best = (leader, epoch)
        return best[0] if best else None

    # -- lifecycle ----------------------------------------------------------------

    def _each(self, what: Callable[[ClusterNode], str], nodes: Sequence[ClusterNode] | None = None) -> list[str]:
        """Run ``what`` on the nodes at once (a quorum forms only when two start together); raise the first error."""
        results: dict[int, str] = {}
        errors: list[BaseException] = []

        def one(n: ClusterNode) -> None:
            try:
                results[n.node_id] = what(n)
            except BaseException as exc:  # reported below, after every node had its turn
                errors.append(exc)

        threads = [threading.Thread(target=one, args=(n,), daemon=True) for n in (nodes or self.nodes)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]
        return [f"node {i}: {results[i]}" for i in sorted(results)]

    def start(self, timeout: float = 120.0) -> str:
        """Start every node not running, wait until all answer, create the topics (RF 3). Returns what happened."""
        self.cluster_id()
        self.controller_ports()
        try:
            lines = self._each(lambda n: n.start(timeout=timeout))
        except BrokerError:
            self.stop()
            raise
        created = self.ensure_topics()
        head = f"Kafka {KAFKA_VERSION} cluster of {len(self.nodes)} nodes on {self.bootstrap} (data {self.data})"
        made = f"; topics created: {', '.join(created)}" if created else ""
        return "\n".join([head + made, *lines])

    def ensure_topics(self) -> list[str]:
        kwargs: dict[str, Any] = self.client_settings.kafka_kwargs()
        return asyncio.run(
            ensure_topics(
                kwargs,
                partitions=self.settings.partitions,
                replication=REPLICATION,
                retention_ms=self.settings.retention_ms,
            )
        )

    def stop(self, timeout: float = STOP_GRACE_S) -> str:
        """Stop every node: SIGTERM to all at once, SIGKILL to any still running after ``timeout``.

        A node's clean stop needs the controller quorum to approve it; the last node left has none and would wait
        for ever (seen here: the active controller alone, asking itself for 60 s). Killing it then loses nothing
        acknowledged: acks=all records are on the other replicas, and its own log is recovered at its next start."""
        lines = self._each(lambda n: n.stop(timeout=timeout))
        return "\n".join(
            line + " (its clean stop waited for a controller quorum that had stopped)" if "killed" in line else line
            for line in lines
        )

    def status(self) -> ClusterStatus:
        statuses: dict[int, BrokerStatus] = {}
        self._each(lambda n: str(statuses.setdefault(n.node_id, n.status())))
        return ClusterStatus(nodes=tuple(statuses[n.node_id] for n in self.nodes), data=str(self.data))
