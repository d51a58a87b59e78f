"""The local three-node cluster fixture (one per test module) and what fault tests ask of it."""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from flightrec.broker.cluster import LocalCluster

from flightrec.errors import BrokerError
from flightrec.localservice import free_port
from flightrec.settings import Settings

sys.path.insert(0, str(Path(__file__).parent))  # tests/broker only, for cluster_helpers
from cluster_helpers import heal  # noqa: E402 - importable only once its folder is on sys.path


@pytest.fixture(scope="module")
def kafka_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """A real three-node KRaft cluster (RF 3, min.insync.replicas=2) for the module; one retry on other ports."""
    data = tmp_path_factory.mktemp("cluster")
    cluster = None
    for attempt in (1, 2):
        cluster = LocalCluster([free_port(), free_port(), free_port()], data / f"try{attempt}", Settings.from_env({}))
        try:
            cluster.start(timeout=180)
            break
        except BrokerError as exc:
            cluster.stop()
            if attempt == 2:
                raise
            logging.getLogger(__name__).warning("cluster fixture: retrying on other ports after: %s", exc)
    assert cluster is not None
    try:
        yield cluster
    finally:
        heal(cluster, wait_isr=False)
        cluster.stop()
