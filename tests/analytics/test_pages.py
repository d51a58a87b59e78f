"""Every dashboard page rendered with Streamlit's AppTest against a real DuckDB file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from streamlit.testing.v1 import AppTest

NO_KERNEL = "CUDA error: no kernel image is available for execution on the device"


def all_text(at: AppTest) -> str:
    """Markdown, captions, code blocks, metrics and alerts on the page, joined."""
    parts: list[str] = []
    for kind in ("markdown", "caption", "code", "info", "warning", "error", "title", "header", "subheader"):
        parts += [str(e.value) for e in getattr(at, kind)]
    parts += [f"{m.label}={m.value}" for m in at.metric]
    return "\n".join(parts)


def frames_text(at: AppTest) -> str:
    return "\n".join(df.value.to_string() for df in at.dataframe)


def metric(at: AppTest, label: str) -> Any:
    return next(m.value for m in at.metric if m.label == label)


@pytest.mark.slow
def test_fleet_shows_counts_and_table(arrow_db, open_page):
    db, ids = arrow_db
    at = open_page(db)  # Fleet is the default page
    assert at.title[0].value == "Fleet"
    assert metric(at, "Instances") == "3"
    assert metric(at, "Failed now") == "2"
    assert metric(at, "Evidence incomplete") == "1"
    table = at.dataframe[0].value
    assert set(table["instance_id"]) == {ids["ok"], ids["no_kernel"], ids["slow"]}
    assert table.set_index("instance_id").loc[ids["ok"], "proofs_per_hour"] == 1500.0


def test_fleet_filters_narrow_the_table(arrow_db, open_page):
    db, ids = arrow_db
    at = open_page(db)
    at.multiselect(key="fleet_status").select("failed").select("below_min_rate").run()
    assert set(at.dataframe[0].value["instance_id"]) == {ids["no_kernel"], ids["slow"]}
    at.text_input(key="fleet_search").input("5090").run()
    assert list(at.dataframe[0].value["instance_id"]) == [ids["no_kernel"]]
    # A filter value is a parameter: quotes and wildcards match literally, nothing else.
    at.text_input(key="fleet_search").input("' OR 1=1 --").run()
    assert at.dataframe[0].value.empty
    at.text_input(key="fleet_search").input("").run()
    at.multiselect(key="fleet_status").unselect("failed").unselect("below_min_rate").run()
    at.checkbox(key="fleet_incomplete").check().run()
    assert list(at.dataframe[0].value["instance_id"]) == [ids["ok"]]


def test_instance_page_shows_life_and_logs(arrow_db, open_page):
    db, ids = arrow_db
    at = open_page(db, "instance", instance=ids["no_kernel"])
    text = all_text(at)
    assert at.selectbox[0].value == ids["no_kernel"]
    assert "NVIDIA GeForce RTX 5090" in text and "compute 12.0" in text
    assert metric(at, "Status") == "failed"
    assert "gpu_arch_unsupported" in text
    frames = frames_text(at)
    assert "bench.sh --min-rate 1000" in set(at.table[0].value["command"])  # the exit, its whole command
    assert "failed" in frames and "fetch_params" in frames  # the stage runs
    logs = at.dataframe[-1].value
    assert NO_KERNEL in list(logs["text"])
    assert "daemon.log" in set(logs["source"])  # by its name; the legend has the path
    assert "daemon.log = /var/log/prover/daemon.log" in text


def test_instance_log_viewer_filters_and_jumps(arrow_db, open_page):
    db, ids = arrow_db
    iid = ids["no_kernel"]
    at = open_page(db, "instance", instance=iid)
    at.multiselect(key=f"logs_sources_{iid}").select("/var/log/prover/daemon.log").run()
    assert set(at.dataframe[-1].value["source"]) == {"daemon.log"}
    assert len(at.dataframe[-1].value) == 3
    at.text_input(key=f"logs_search_{iid}").input("NO KERNEL").run()  # case-insensitive
    assert list(at.dataframe[-1].value["text"]) == [NO_KERNEL]
    at.text_input(key=f"logs_search_{iid}").input("100%").run()  # '%' is literal: the line is in stdout
    assert at.dataframe[-1].value.empty
    at.multiselect(key=f"logs_sources_{iid}").unselect("/var/log/prover/daemon.log").run()
    assert list(at.dataframe[-1].value["text"]) == ["downloading params 100% done_ok"]
    at.text_input(key=f"logs_search_{iid}").input("").run()
    at.toggle(key=f"logs_jump_{iid}").set_value(True).run()
    lines = at.dataframe[-1].value
    assert set(lines["stage"]) == {"benchmark"}  # the failed stage, up to the failure
    assert NO_KERNEL in list(lines["text"])


def test_instance_that_does_not_exist(arrow_db, open_page):
    db, _ = arrow_db
    at = open_page(db, "instance", instance="no-such-instance")
    # The picker falls back to the newest instance rather than failing.
    assert at.selectbox[0].value in {"i-h100-ok", "i-5090-nokernel", "i-a100-slow"}


def test_failure_drill_down_shows_the_daemon_error(arrow_db, open_page):
    db, ids = arrow_db
    at = open_page(db, "failures", failure=ids["no_kernel_failure"])
    assert set(at.dataframe[0].value["instance_id"]) == {ids["no_kernel"], ids["slow"]}
    assert metric(at, "Class") == "gpu_arch_unsupported"
    assert metric(at, "Exit code") == "1"
    codes = [c.value for c in at.code]
    assert NO_KERNEL in codes  # the matched line
    assert any(NO_KERNEL in c and "daemon: shutting down" in c for c in codes)  # the daemon's tail
    assert any(c == "benchmark exited with error" for c in codes)  # the stderr tail, beside it
    events = at.dataframe[-1].value  # the events that led up to it, with their times
    assert ("benchmark", "started") in set(zip(events["stage"], events["state"], strict=True))
    assert "no kernel for this GPU's architecture" in at.info[0].value
    assert "/var/log/prover/daemon.log" in all_text(at)
    last = [e for e in at.expander if "every source in order" in e.label]  # failures.last_lines
    assert len(last) == 1
    assert any(f"daemon.log: {NO_KERNEL}" in c and "stderr: benchmark exited with error" in c for c in codes)


def test_failures_filter_and_picker(arrow_db, open_page):
    db, ids = arrow_db
    at = open_page(db, "failures")
    at.multiselect(key="failures_classes").select("below_min_rate").run()
    assert list(at.dataframe[0].value["instance_id"]) == [ids["slow"]]
    assert metric(at, "Class") == "below_min_rate"
    assert "640.0 proofs/hour against a minimum of 1,000.0" in all_text(at)


def test_throughput_by_gpu_and_cost_per_proof(arrow_db, open_page):
    db, ids = arrow_db
    at = open_page(db, "throughput")
    summary = at.dataframe[0].value.set_index("gpu_model")
    assert summary.loc["NVIDIA H100 80GB HBM3", "median_proofs_per_hour"] == 1500.0
    assert summary.loc["NVIDIA A100-SXM4-40GB", "below_min_rate"] == 1
    per_instance = at.dataframe[1].value.set_index("instance_id")
    assert per_instance.loc[ids["ok"], "cost_per_proof"] == pytest.approx(2.49 / 1500)
    assert not per_instance.loc[ids["slow"], "meets_min_rate"]
    at.multiselect(key="throughput_gpus").select("NVIDIA A100-SXM4-40GB").run()
    assert list(at.dataframe[1].value["instance_id"]) == [ids["slow"]]


def test_sql_console_runs_examples_and_refuses_writes(arrow_db, open_page):
    db, _ = arrow_db
    at = open_page(db, "sql")
    first = at.dataframe[0].value  # the first example: failures by class
    assert set(first["failure_class"]) == {"gpu_arch_unsupported", "below_min_rate"}
    assert at.get("download_button"), "the result can be downloaded as CSV"
    at.selectbox(key="sql_example").select("Throughput by GPU model").run()
    assert len(at.dataframe[0].value) == 3
    for bad in (
        "DROP TABLE instances",
        "DELETE FROM failures",
        "COPY instances TO '/tmp/flightrec-leak.csv'",
        "SELECT * FROM read_csv('/etc/passwd')",
        "SELECT 1; DROP TABLE instances",
    ):
        box = next(t for t in at.text_area)
        box.input(bad)
        at.button(key="sql_run").click().run()
        assert at.error, f"{bad!r} was not refused"
        assert "refused or failed" in at.error[0].value
    assert not Path("/tmp/flightrec-leak.csv").exists()
    box = next(t for t in at.text_area)
    box.input("SELECT count(*) AS n FROM instances").run()
    assert at.dataframe[0].value["n"][0] == 3  # nothing was dropped


def test_sql_console_caps_huge_results(arrow_db, open_page):
    db, _ = arrow_db
    at = open_page(db, "sql")
    next(t for t in at.text_area).input("SELECT * FROM range(20000) t(n)").run()
    assert len(at.dataframe[0].value) == 10_000
    assert "first 10,000 shown" in all_text(at)


def test_missing_database_says_what_to_do(tmp_path, open_page):
    at = open_page(tmp_path / "absent.duckdb")
    assert at.error and "flightrec materialize" in at.error[0].value
