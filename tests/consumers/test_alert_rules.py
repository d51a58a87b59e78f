"""The shipped Prometheus rules (examples/prometheus/flightrec.rules.yml), evaluated by Prometheus's own promtool:
each rule fires on its condition and stays quiet otherwise, the lag rule keeps the labels its `and` needs, and every
series a rule reads is one the materializer's /metrics really serves (a real scrape, evaluated)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from flightrec.broker.local import free_port
from flightrec.consumers.metrics import Metrics
from flightrec.consumers.storefigures import StoreFigures
from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "examples" / "prometheus" / "flightrec.rules.yml"
RULE_TESTS = ROOT / "examples" / "prometheus" / "flightrec.rules.test.yml"
EXE = str(Path(sys.executable).with_name("flightrec"))


def promtool() -> str:
    """promtool's path; a clear failure (never a skip) where it is missing."""
    found = shutil.which("promtool")
    if found is None:
        pytest.fail(
            "promtool is not installed: `apt-get install prometheus` (Debian's package brings it; "
            "scripts/system-packages.sh installs it, and `make test` runs that)"
        )
    return found


def _run(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([promtool(), *args], cwd=cwd, capture_output=True, text=True, timeout=120)


def _rules() -> list[dict]:
    """Each rule's alert name and expression, read from the rules file (its two forms: `expr: …` on one line, or
    `expr: >-` and the indented lines after it). No YAML library: the tests need none but this."""
    out: list[dict] = []
    lines = RULES.read_text().splitlines()
    for i, line in enumerate(lines):
        if m := re.match(r"\s*- alert: (\w+)$", line):
            out.append({"alert": m.group(1)})
        elif m := re.match(r"(\s*)expr: (.*)$", line):
            if m.group(2) == ">-":
                body = []
                for nxt in lines[i + 1 :]:
                    if len(nxt) - len(nxt.lstrip()) <= len(m.group(1)):
                        break
                    body.append(nxt.strip())
                out[-1]["expr"] = " ".join(body)
            else:
                out[-1]["expr"] = m.group(2)
    return out


def _cases() -> list[tuple[str, bool]]:
    """(alert name, whether it is expected to fire) of every check in the rules' unit tests."""
    text = RULE_TESTS.read_text()
    return [
        (m.group(1), m.group(2).strip() != "[]") for m in re.finditer(r"alertname: (\w+)\n\s*exp_alerts:(.*)", text)
    ]


def _yaml(data: object) -> str:
    """YAML for promtool: JSON is YAML."""
    return json.dumps(data, indent=1)


def test_the_shipped_rules_are_valid_and_pass_their_unit_tests() -> None:
    r = _run("check", "rules", RULES.name, cwd=RULES.parent)
    assert r.returncode == 0, r.stdout + r.stderr
    r = _run("test", "rules", RULE_TESTS.name, cwd=RULES.parent)
    assert r.returncode == 0 and "SUCCESS" in r.stdout, r.stdout + r.stderr


def test_every_rule_has_a_case_that_fires_and_one_that_stays_quiet() -> None:
    cases = _cases()
    rules = _rules()
    assert len(rules) == 10 and all("expr" in r for r in rules), rules
    for rule in rules:
        mine = [fires for name, fires in cases if name == rule["alert"]]
        assert True in mine, f"{rule['alert']}: no case where it fires"
        assert False in mine, f"{rule['alert']}: no case where it stays quiet"
    # and where it fires, only the materializer meeting the condition does ("good:9464" never)
    assert "good:9464" not in "".join(re.findall(r"exp_labels: \{[^}]*\}", RULE_TESTS.read_text()))


def _promtool_fires(expr: str, series: list[tuple[str, str]], at: str, tmp: Path) -> list[dict]:
    """The alerts one expression fires at ``at`` on ``series``, as promtool evaluates it (by a failing test's
    report: expecting none shows what it got)."""
    (tmp / "r.yml").write_text(_yaml({"groups": [{"name": "t", "rules": [{"alert": "A", "expr": expr}]}]}))
    test = {
        "rule_files": ["r.yml"],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [{"series": s, "values": v} for s, v in series],
                "alert_rule_test": [{"eval_time": at, "alertname": "A", "exp_alerts": []}],
            }
        ],
    }
    (tmp / "t.yml").write_text(_yaml(test))
    r = _run("test", "rules", "t.yml", cwd=tmp)
    if r.returncode == 0:
        return []
    return [{"got": r.stdout}]


def test_the_documented_lag_expression_never_fired_and_the_shipped_one_does(tmp_path: Path) -> None:
    series = [
        (
            'flightrec_consumer_lag_messages{job="flightrec", instance="m:9464", topic="flightrec.logs", '
            'partition="0"}',
            "5x30",
        ),
        ('flightrec_last_commit_timestamp_seconds{job="flightrec", instance="m:9464"}', "0x30"),
    ]
    old = "sum(flightrec_consumer_lag_messages) > 0 and (time() - flightrec_last_commit_timestamp_seconds) > 600"
    assert _promtool_fires(old, series, "20m", tmp_path) == []  # `sum` drops the labels the `and` matches on
    shipped = next(r["expr"] for r in _rules() if r["alert"] == "FlightrecLagNotShrinking")
    assert _promtool_fires(shipped, series, "20m", tmp_path), "the shipped lag rule does not fire"


def _metric_names(expr: str) -> set[str]:
    return set(re.findall(r"\b(flightrec_[a-z_]+)\b", expr))


def test_every_series_a_rule_reads_is_one_the_materializer_registers() -> None:
    registered = set()
    metrics = Metrics(0)
    StoreFigures().register(metrics.registry)  # as the materializer does (the store's size, a full disk, …)
    for family in metrics.registry.collect():
        registered |= {s.name for s in family.samples} | {family.name}
    registered |= {"flightrec_instances", "flightrec_alerts_failed_total", "flightrec_alerts_sent_total"}  # read from
    # the database at the first scrape (consumers/metrics.py _Database)
    for rule in _rules():
        missing = _metric_names(rule["expr"]) - registered
        assert not missing, f"{rule['alert']} reads {missing}, which /metrics does not serve"


@pytest.mark.integration
def test_the_rules_evaluated_on_a_real_scrape_fire_for_a_real_failure(kafka, tmp_path: Path, env_for) -> None:
    """Scrape a running materializer before and after a real failure and a bad message, feed both scrapes to
    promtool as series, and evaluate the shipped rules: the failure and the dead letter fire, nothing else."""
    from materializer_helpers import motivating_boot, publish

    db = tmp_path / "fleet.duckdb"
    kafka.seed_at_mark(db)
    port = free_port()
    mat = subprocess.Popen(
        [EXE, "materialize", "--db", str(db), "--metrics-port", str(port)],
        env=env_for(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    b = motivating_boot()
    try:
        before = _scrape_when(port, lambda s: "flightrec_input_caught_up_timestamp_seconds" in s)
        publish(kafka.bootstrap, b.events, raw=[("flightrec.logs", b"k", b"not avro at all")])
        after = _scrape_when(port, lambda s: 'flightrec_failures_total{failure_class="gpu_arch_unsupported"} 1.0' in s)
    finally:
        mat.terminate()
        mat.wait(60)
    series = _as_series(before, after)
    names = {re.match(r"[a-z_]+", s).group(0) for s, _ in series}  # type: ignore[union-attr]  # every series starts with its name
    for rule in _rules():
        assert _metric_names(rule["expr"]) <= names | {"up"} or rule["alert"] == "FlightrecMaterializerDown", rule
    tests = {
        "rule_files": [str(RULES)],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [{"series": s, "values": v} for s, v in series],
                "alert_rule_test": [
                    {"eval_time": "12m", "alertname": rule["alert"], "exp_alerts": _expected(rule["alert"])}
                    for rule in _rules()
                ],
            }
        ],
    }
    (tmp_path / "real.yml").write_text(_yaml(tests))
    r = _run("test", "rules", "real.yml", cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr


def _expected(alert: str) -> list[dict]:
    """What the real scrape must fire (the annotations are the shipped templates filled in)."""
    runbook = f"docs/operations.md#{alert.lower()}"
    if alert == "FlightrecFailures":
        return [
            {
                "exp_labels": {"severity": "ticket", "failure_class": "gpu_arch_unsupported"},
                "exp_annotations": {
                    "summary": "1 new failures of class gpu_arch_unsupported in 10 minutes",
                    "runbook": runbook,
                },
            }
        ]
    if alert == "FlightrecDeadLetters":
        return [
            {
                "exp_labels": {"severity": "ticket", "reason": "decode"},
                "exp_annotations": {
                    "summary": "1 messages kept as dead letters (decode) in 10 minutes",
                    "runbook": runbook,
                },
            }
        ]
    return []


def _scrape_when(port: int, ready, within: float = 90.0) -> str:  # type: ignore[no-untyped-def]  # ready: a predicate
    deadline = time.monotonic() + within
    text = ""
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                text = r.read().decode()
            if ready(text):
                return text
        except OSError:
            pass
        time.sleep(0.5)
    raise AssertionError(f"/metrics never showed what was waited for; last scrape:\n{text[-3000:]}")


def _samples(text: str) -> dict[str, float]:
    """'name{labels}' -> value of one scrape, with the labels Prometheus adds (job, instance)."""
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = {**s.labels, "job": "flightrec", "instance": "m:9464"}
            body = ", ".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
            out[f"{s.name}{{{body}}}"] = s.value
    return out


def _as_series(before: str, after: str) -> list[tuple[str, str]]:
    """Each sample as a promtool series: its first scrape's value for 5 minutes, then its second's (the clock-based
    gauges moved to promtool's clock, which starts at 0: caught up and committed at each minute)."""
    b, a = _samples(before), _samples(after)
    out = [('up{instance="m:9464", job="flightrec"}', "1x20")]
    for name in sorted(set(b) | set(a)):
        if name.startswith(("flightrec_input_caught_up_timestamp_seconds", "flightrec_last_commit_timestamp_seconds")):
            out.append((name, "0+60x20"))
            continue
        first, second = b.get(name, 0.0), a.get(name, b.get(name, 0.0))
        out.append((name, f"{first!r}x5 {second!r}x15"))
    return out
