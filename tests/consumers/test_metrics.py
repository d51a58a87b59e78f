"""`flightrec materialize --metrics-port N`: /metrics scraped from the running materializer, parsed with
prometheus-client's own text parser."""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from flightrec.broker.local import free_port
from flightrec.consumers.metrics import dead_letter_reason
from materializer_helpers import flightrec, motivating_boot, publish
from prometheus_client.parser import text_string_to_metric_families

pytestmark = pytest.mark.integration


def scrape(port: int) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Sample name -> [(labels, value)] of one scrape."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def value(m: dict, name: str, **labels: str) -> float | None:
    found = [v for lab, v in m.get(name, []) if all(lab.get(k) == x for k, x in labels.items())]
    return sum(found) if found else None


def test_metrics_show_lag_falling_to_zero_a_failure_by_status_and_dead_letters(kafka, db, env_for):
    b = motivating_boot()  # a benchmark that fails with gpu_arch_unsupported
    kafka.seed_at_mark(db)
    publish(kafka.bootstrap, b.events, raw=[("flightrec.logs", b"k", b"not avro at all")])
    port = free_port()
    proc = subprocess.Popen(
        [
            str(Path(sys.executable).with_name("flightrec")),
            "materialize",
            "--db",
            str(db),
            "--metrics-port",
            str(port),
            "--metrics-address",
            "127.0.0.1",
        ],
        env={**env_for(), "PYTHONSAFEPATH": "1"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    lags: list[float] = []
    m: dict = {}
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            assert proc.poll() is None, proc.communicate()[1].decode()
            try:
                m = scrape(port)
            except OSError:
                time.sleep(0.05)
                continue
            lag = value(m, "flightrec_consumer_lag_messages")
            if lag is not None:
                lags.append(lag)
            if lag == 0 and value(m, "flightrec_instances", status="failed") == 1:
                break
            time.sleep(0.05)
        assert lags and max(lags) > 0 and lags[-1] == 0, lags
        assert value(m, "flightrec_instances", status="failed") == 1, m.get("flightrec_instances")
        assert value(m, "flightrec_instances", status="healthy") == 0  # every status is a series, 0 included
        assert value(m, "flightrec_events_folded_total") == len(b.events) + 1
        assert value(m, "flightrec_log_lines_folded_total") > 0
        assert value(m, "flightrec_dead_letters_total", reason="decode") == 1
        assert value(m, "flightrec_commit_duration_seconds_count") >= 1
        assert value(m, "flightrec_commit_duration_seconds_bucket", le="+Inf") >= 1
        assert value(m, "flightrec_alerts_sent_total") == 0
        topics = {lab["topic"] for lab, _ in m["flightrec_consumer_lag_messages"]}
        assert topics == {"flightrec.lifecycle", "flightrec.logs", "flightrec.exits", "flightrec.metrics"}
    finally:
        proc.send_signal(2)
        proc.wait(timeout=60)
    assert proc.returncode == 0, proc.stderr.read().decode() if proc.stderr else ""


def test_a_metrics_port_in_use_is_one_line_and_no_database(kafka, tmp_path, env_for):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        db = tmp_path / "m.duckdb"
        r = flightrec(
            "materialize",
            "--db",
            str(db),
            "--metrics-port",
            str(port),
            "--metrics-address",
            "127.0.0.1",
            "--until-idle",
            "1",
            env=env_for(),
            check=False,
        )
    assert r.returncode == 1 and r.stderr.strip().splitlines()[-1].startswith(
        "flightrec materialize: cannot serve metrics on 127.0.0.1:"
    ), r.stderr
    assert "Traceback" not in r.stderr and not db.exists()


def test_dead_letter_reasons_are_a_bounded_label():
    assert dead_letter_reason("decode: unknown schema fingerprint 0x12") == "decode"
    assert dead_letter_reason("conflict: event id x reused with other content") == "conflict"
    assert dead_letter_reason("fold: ValueError: bad") == "fold"
    assert dead_letter_reason("a reason with spaces and no colon") == "other"
    assert dead_letter_reason(None) == "other"


def test_a_metrics_port_out_of_range_is_refused_before_anything(tmp_path):
    import os

    db = tmp_path / "m.duckdb"
    r = subprocess.run(
        [str(Path(sys.executable).with_name("flightrec")), "materialize", "--db", str(db), "--metrics-port", "70000"],
        env={**os.environ, "PYTHONSAFEPATH": "1", "FLIGHTREC_BOOTSTRAP": "127.0.0.1:9"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (
        r.returncode == 1
        and r.stderr.strip() == "flightrec materialize: --metrics-port 70000: a TCP port is 1 to 65535"
    )
    assert not db.exists()
