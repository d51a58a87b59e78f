"""The roles' grants and quota as pure data: what Kafka's tools are given, and a wrong quota said before any start."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from flightrec.broker.local import free_port
from flightrec.broker.roles import AGENT, GRANTS, fingerprint, quota_args

from flightrec.errors import ConfigError

FLIGHTREC = str(Path(sys.executable).parent / "flightrec")


def test_the_agent_is_granted_produce_and_nothing_else():
    agent = [g for g in GRANTS if g.role == AGENT]
    assert [(g.resource, g.prefix, g.operations) for g in agent] == [
        ("topic", "flightrec.", ("Write", "Describe", "DescribeConfigs"))
    ]


def test_a_changed_quota_changes_the_marker_so_the_next_start_applies_it():
    assert fingerprint(5242880) == fingerprint(5242880) != fingerprint(1048576)


@pytest.mark.parametrize("rate", [0, -5])
def test_a_quota_that_is_not_positive_is_refused_with_what_to_do(rate: int):
    with pytest.raises(ConfigError, match="FLIGHTREC_AGENT_BYTE_RATE"):
        quota_args(rate)


def test_broker_start_says_a_wrong_quota_in_one_line_before_starting_anything(tmp_path: Path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLIGHTREC_")}
    env.update(PYTHONSAFEPATH="1", FLIGHTREC_AGENT_BYTE_RATE="0")
    data = tmp_path / "broker"
    r = subprocess.run(
        [FLIGHTREC, "broker", "start", "--port", str(free_port()), "--data", str(data), "--security", "sasl_ssl"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert "FLIGHTREC_AGENT_BYTE_RATE=0" in r.stderr.strip().splitlines()[-1]
    assert not (data / "logs").exists(), "nothing was formatted"


def test_a_refusal_names_the_same_roles_the_broker_grants() -> None:
    """flightrec/access.py (the ground floor: the agent has no broker helpers) names each role by its user."""
    from flightrec.broker.roles import ROLES

    from flightrec.access import ROLE_OF_USER, ROLE_PURPOSE, role_of

    assert {r.user: r.name for r in ROLES} == ROLE_OF_USER
    assert set(ROLE_PURPOSE) == {r.name for r in ROLES}
    assert role_of("flightrec-agent").startswith("user 'flightrec-agent' (the agent role: ")
    assert role_of("someone-else") == "user 'someone-else'"
