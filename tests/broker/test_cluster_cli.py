"""`flightrec broker start|status|stop --nodes 3` as a user runs them: a real three-node cluster, and wrong flags."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest
from flightrec.broker.cluster import LocalCluster

from flightrec.errors import BrokerError
from flightrec.localservice import port_free
from flightrec.settings import TOPICS, Settings


def flightrec(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "flightrec", *args],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONSAFEPATH": "1"},
        timeout=240,
    )


def three_free_ports() -> int:
    """PORT, PORT+1, PORT+2 free, below the kernel's ephemeral range: the ports other tests' brokers take (bind to
    port 0) and clients' outgoing connections use come from that range, so they cannot take PORT+1 meanwhile."""
    import random

    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    assert low > 13100, f"the ephemeral range starts at {low}: no room below it for this test's ports"
    while True:
        port = random.randrange(max(1024, low - 12000), low - 3)
        if port_free(port) and port_free(port + 1) and port_free(port + 2):
            return port


def topic_settings(bootstrap: str) -> dict[str, tuple[int, str]]:
    """Each flightrec topic's (replication factor, min.insync.replicas) as the cluster describes them."""

    async def go() -> dict[str, tuple[int, str]]:
        from aiokafka.admin import AIOKafkaAdminClient

        from flightrec.cluster import describe_topic_configs

        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        await admin.start()
        try:
            described = {t["topic"]: t for t in await admin.describe_topics(list(TOPICS))}
            configs = await describe_topic_configs(admin, TOPICS)
            return {
                t: (len(described[t]["partitions"][0]["replicas"]), configs[t]["min.insync.replicas"]) for t in TOPICS
            }
        finally:
            await admin.close()

    return asyncio.run(go())


@pytest.mark.integration
@pytest.mark.slow
def test_start_status_stop_a_three_node_cluster(tmp_path):
    port, data = three_free_ports(), str(tmp_path / "c")
    args = ("--nodes", "3", "--port", str(port), "--data", data)
    try:
        r = flightrec("broker", "start", *args)
        assert r.returncode == 0, r.stdout + r.stderr
        assert "cluster of 3 nodes" in r.stdout and "topics created" in r.stdout
        bootstrap = ",".join(f"localhost:{p}" for p in (port, port + 1, port + 2))
        assert topic_settings(bootstrap) == {t: (3, "2") for t in TOPICS}
        r = flightrec("broker", "status", *args)
        assert r.returncode == 0 and "3 of 3 nodes answering" in r.stdout, r.stdout + r.stderr
        r = flightrec("broker", "start", *args)
        assert r.returncode == 0 and r.stdout.count("already running") == 3, r.stdout + r.stderr
    finally:
        r = flightrec("broker", "stop", *args)
    assert r.returncode == 0 and r.stdout.count("\nnode ") == 2, r.stdout + r.stderr  # a line for each node
    assert all(" stopped" in line or "killed" in line for line in r.stdout.splitlines()), r.stdout
    r = flightrec("broker", "status", *args)
    assert r.returncode == 3 and "0 of 3 nodes answering" in r.stdout


def test_a_cluster_is_plaintext_and_has_three_nodes(tmp_path):
    r = flightrec("broker", "start", "--nodes", "3", "--security", "sasl_ssl", "--data", str(tmp_path / "c"))
    assert r.returncode == 1 and "plaintext only" in r.stderr, r.stderr
    r = flightrec("broker", "start", "--nodes", "2", "--data", str(tmp_path / "c"))
    assert r.returncode == 2 and "invalid choice" in r.stderr
    r = flightrec("broker", "status", "--nodes", "3", "--port", "65534", "--data", str(tmp_path / "c"))
    assert r.returncode == 1 and "choose a lower --port" in r.stderr, r.stderr
    with pytest.raises(BrokerError, match="3 different ports"):
        LocalCluster([9092, 9092, 9093], tmp_path / "d", Settings.from_env({}))
