"""`flightrec demo --headless`: the whole system end to end, asserted through SQL."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from flightrec.broker.local import free_port
from flightrec.db.query import run_query

from flightrec.demo.system import plan_fleet

pytestmark = pytest.mark.integration

EXPECTED_CLASS = {
    "no_kernel_image": "gpu_arch_unsupported",
    "cuda_oom": "cuda_out_of_memory",
    "params_download": "params_download_failed",
    "too_slow": "below_min_rate",
    "daemon_signal": "daemon_crashed",
}


def run_demo(home, port: int, instances: int) -> subprocess.CompletedProcess:
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "flightrec",
            "demo",
            "--instances",
            str(instances),
            "--headless",
            "--port",
            str(port),
            "--home",
            str(home),
            "--supervisor-seconds",
            "2",
        ],
        capture_output=True,
        text=True,
        timeout=400,
        env={**os.environ, "PYTHONSAFEPATH": "1"},
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return r


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    home, port = tmp_path_factory.mktemp("demo"), free_port()
    r = run_demo(home, port, 7)
    return home / "flightrec.duckdb", r.stdout, home, port


def test_every_failure_fate_is_explained_with_its_class(demo):
    db, *_ = demo
    rows = run_query(
        db, "SELECT i.instance_id, f.failure_class, f.stage FROM instances i JOIN failures f USING (instance_id)"
    ).to_pylist()
    by_instance: dict[str, set[str]] = {}
    for r in rows:
        by_instance.setdefault(r["instance_id"], set()).add(r["failure_class"])
    fate_of = {i.instance_id: i.fate for i in _plan()}
    counts = {
        r["instance_id"]: r["failures"]
        for r in run_query(db, "SELECT instance_id, failures FROM instances").to_pylist()
    }
    for inst, fate in fate_of.items():  # one failure per failed instance: the entrypoint's stop is no second one
        assert counts[inst] == (1 if fate in EXPECTED_CLASS else 0), (inst, fate, by_instance.get(inst))
    for fate, klass in EXPECTED_CLASS.items():
        assert any(klass in classes for inst, classes in by_instance.items() if fate_of.get(inst) == fate), (
            f"{fate}: expected a failure of class {klass}; got {by_instance}"
        )


def test_the_motivating_case_shows_the_daemon_line(demo):
    db, *_ = demo
    rows = run_query(
        db,
        "SELECT decisive_line, decisive_source, exit_code, stage FROM failures "
        "WHERE failure_class = 'gpu_arch_unsupported'",
    ).to_pylist()
    assert rows and "no kernel image is available" in rows[0]["decisive_line"]
    assert rows[0]["decisive_source"].endswith(".log")  # the daemon's own log, not the benchmark's stderr
    assert rows[0]["exit_code"] == 1 and rows[0]["stage"] == "benchmark"


def test_every_failure_of_the_demo_says_why(demo):
    """Each demo failure's decisive line is the line its fate is about (not the wrapper that reported it)."""
    db, *_ = demo
    rows = run_query(db, "SELECT failure_class, decisive_line FROM failures").to_pylist()
    assert rows and all(r["decisive_line"] for r in rows), rows
    why = {r["failure_class"]: r["decisive_line"] for r in rows}
    assert "out of memory" in why["cuda_out_of_memory"].lower(), why
    assert "404" in why["params_download_failed"], why
    assert "proofs/hour" in why["below_min_rate"], why


def test_healthy_instances_have_throughput_and_complete_evidence(demo):
    db, *_ = demo
    healthy = [i.instance_id for i in _plan() if i.fate in ("healthy", "destroyed")]
    rows = run_query(
        db,
        "SELECT instance_id, count(*) AS n FROM throughput WHERE kind = 'sample' "
        "AND list_contains(?, instance_id) GROUP BY ALL",
        [healthy],
    ).to_pylist()
    assert {r["instance_id"] for r in rows} == set(healthy)
    sealed = run_query(
        db,
        "SELECT instance_id, complete, failures FROM instances WHERE list_contains(?, instance_id)",
        [[i.instance_id for i in _plan() if i.fate == "healthy"]],
    ).to_pylist()
    assert sealed and all(r["complete"] and r["failures"] == 0 for r in sealed)


def test_the_destroyed_instances_late_events_arrived(demo):
    db, out, *_ = demo
    (inst,) = [i.instance_id for i in _plan() if i.fate == "destroyed"]
    assert f"{inst} destroyed mid-supervisor" in out and "delivered late" in out
    late = [line for line in out.splitlines() if "delivered late" in line]
    assert len(late) == 1 and re.search(r"\(exit \d+\)$", late[0]), "no second message glued on the line"
    rows = run_query(db, "SELECT stage, state FROM lifecycle_events WHERE instance_id = ?", [inst]).to_pylist()
    assert {"stage": "supervisor", "state": "started"} in rows
    (row,) = run_query(
        db, "SELECT complete, incomplete_reason FROM instances WHERE instance_id = ?", [inst]
    ).to_pylist()
    assert not row["complete"] and "not sealed" in row["incomplete_reason"]
    # its events waited in the spool and were flushed later: that is no wrong clock (its send times say so)
    from flightrec.db.views import VIEWS

    (clock,) = run_query(
        db, "SELECT clock_offset_s, clock_skewed FROM fleet WHERE instance_id = ?", [inst], prelude=VIEWS
    ).to_pylist()
    assert not clock["clock_skewed"] and abs(clock["clock_offset_s"] or 0) < 10, clock


def _plan():
    return plan_fleet(7)


def test_one_honest_status_per_instance_and_failed_now_counts_them(demo):
    from flightrec.analytics.queries import fleet_counts
    from flightrec.db.views import ALL_VIEWS, VIEWS

    db, out, *_ = demo
    status = {r["instance_id"]: r for r in run_query(db, "SELECT * FROM fleet", prelude=VIEWS).to_pylist()}
    for inst in _plan():
        row = status[inst.instance_id]
        if inst.fate == "destroyed":  # never a pass: the manager destroyed it
            assert row["status"] == "destroyed", row
            assert row["status_detail"].startswith("destroyed by manager@demo at "), row
        elif inst.fate == "too_slow":
            assert row["status"] == "below_min_rate", row
        elif inst.fate in EXPECTED_CLASS:
            assert (row["status"], row["failure_class"]) == ("failed", EXPECTED_CLASS[inst.fate]), row
        else:
            assert row["status"] == "finished", row
    failed = sum(1 for i in _plan() if i.fate in EXPECTED_CLASS)
    assert fleet_counts(db).to_pylist()[0]["failed"] == failed
    (inst,) = [i.instance_id for i in _plan() if i.fate == "destroyed"]
    line = [x for x in out.splitlines() if x.startswith(inst)]
    assert line and " destroyed " in line[0]  # the summary says it too
    rented = run_query(db, "SELECT count(DISTINCT instance_id) AS n FROM manager_events WHERE kind = 'rented'")
    assert rented.to_pylist()[0]["n"] >= len(_plan())
    # the money: every instance priced by its `rented` event; the Blackwell cards that never ran are to avoid
    priced = run_query(
        db,
        "SELECT count(*) FILTER (WHERE price_source = 'manager') AS priced, count(*) AS n FROM instance_cost",
        prelude=ALL_VIEWS,
    ).to_pylist()[0]
    assert priced["priced"] == priced["n"] > 0
    (avoid,) = run_query(db, "SELECT offer_filter FROM avoid_filter", prelude=ALL_VIEWS).to_pylist()
    assert "RTX_PRO_4000_Blackwell" in avoid["offer_filter"], avoid


def test_a_second_run_reuses_the_broker_data_and_adds_a_boot(demo):
    db, _, home, port = demo
    before = run_query(db, "SELECT count(*) AS n FROM log_lines").to_pylist()[0]["n"]
    r = run_demo(home, port, 2)
    assert "broker:" in r.stdout and "started" in r.stdout
    boots = run_query(db, "SELECT instance_id, count(*) AS n FROM boots GROUP BY ALL").to_pylist()
    assert {b["instance_id"]: b["n"] for b in boots}["rtxpro4000-02"] == 2
    assert run_query(db, "SELECT count(*) AS n FROM log_lines").to_pylist()[0]["n"] > before
    # progress counts this run only: its 2 instances and its one failure, not the first run's
    last = [x for x in r.stdout.splitlines() if "failures explained" in x][-1]
    counts = re.search(r"instances: (.*) \| (\d+) log lines, (\d+) failures explained", last)
    assert counts, last
    assert sum(int(n) for n in re.findall(r"(\d+) \S+/\S+", counts.group(1))) == 2, last
    assert counts.group(3) == "1", last
    # the summary shows this run's failure once (not one per boot)
    (line,) = [x for x in r.stdout.splitlines() if x.startswith("rtxpro4000-02")]
    assert line.rstrip().endswith(" gpu_arch_unsupported")


def test_the_demo_has_a_broker_of_its_own():
    """Producers left at the default bootstrap (localhost:9092) never reach the demo's broker or database."""
    from flightrec.cli.demo import DEMO_PORT as CLI_PORT
    from flightrec.demo.system import DEMO_PORT, Demo
    from flightrec.settings import Settings

    default_port = int(Settings().bootstrap.rsplit(":", 1)[1])
    assert DEMO_PORT == CLI_PORT != default_port
    assert Demo.__dataclass_fields__["port"].default == DEMO_PORT


def test_the_demo_speaks_in_failure_classes_and_its_logs_agree_with_its_rates(demo):
    """The first line names failure classes, not scenarios; no daemon log claims proofs faster than the rate
    measured beside it (a40-05 measured ~460 proofs/h while its daemon wrote "proof N done" every 0.5 s)."""
    db, out, *_ = demo
    (line,) = [x for x in out.splitlines() if "instances started" in x]
    assert "gpu_arch_unsupported" in line and "below_min_rate" in line and "too_slow" not in line, line
    rows = run_query(
        db,
        """SELECT l.instance_id, count(*) AS n, (max(l.ts_us) - min(l.ts_us)) / 3600e6 AS hours, i.proofs_per_hour
           FROM log_lines l JOIN instances i USING (instance_id)
           WHERE regexp_matches(l.text, 'proof \\d+ done') AND i.proofs_per_hour IS NOT NULL GROUP BY ALL""",
    ).to_pylist()
    for r in rows:
        claimed = (r["n"] - 1) / r["hours"] if r["hours"] else 0.0
        assert claimed <= 1.5 * r["proofs_per_hour"], r
