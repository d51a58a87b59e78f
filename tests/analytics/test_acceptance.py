"""Acceptance: every page over a database materialized from real events (agent -> Kafka -> materializer)."""

from __future__ import annotations

import pytest

NO_KERNEL = "CUDA error: no kernel image is available for execution on the device"

pytestmark = pytest.mark.integration


def test_failure_drill_down_shows_the_daemons_line(pipeline_db, open_page):
    db, ids = pipeline_db
    at = open_page(db, "failures", failure=ids["no_kernel_failure"])
    assert ids["no_kernel"] in set(at.dataframe[0].value["instance_id"])
    assert any(ids["no_kernel"] in h.value for h in at.header)
    assert next(m.value for m in at.metric if m.label == "Exit code") == "1"
    assert next(m.value for m in at.metric if m.label == "Class") == "gpu_arch_unsupported"
    codes = [c.value for c in at.code]
    assert any(NO_KERNEL in c for c in codes), codes
    assert any("benchmark exited with error" in c for c in codes), codes  # the stderr tail beside it
    assert at.info and "kernel" in at.info[0].value.lower()  # the class's hint


def test_fleet_lists_the_instances(pipeline_db, open_page):
    db, ids = pipeline_db
    at = open_page(db)
    at.text_input(key="fleet_search").input(ids["no_kernel"]).run()
    table = at.dataframe[0].value
    assert list(table["instance_id"]) == [ids["no_kernel"]]
    assert table["state"][0] == "failed" and table["failures"][0] == 1


def test_instance_page_shows_the_daemon_log(pipeline_db, open_page):
    db, ids = pipeline_db
    iid = ids["no_kernel"]
    at = open_page(db, "instance", instance=iid)
    assert at.selectbox[0].value == iid
    stages = next(df.value for df in at.dataframe if "outcome" in df.value.columns)
    outcomes = dict(zip(stages["stage"], stages["outcome"], strict=True))
    assert outcomes == {"fetch_params": "succeeded", "benchmark": "failed"}
    logs = at.dataframe[-1].value
    assert NO_KERNEL in list(logs["text"])
    assert "daemon.log" in set(logs["source"])  # the followed file by its name ...
    assert any(f"daemon.log = {ids['daemon_log']}" in c.value for c in at.caption)  # ... and its path in the legend
    at.multiselect(key=f"logs_sources_{iid}").select("stderr").run()
    assert list(at.dataframe[-1].value["text"]) == ["benchmark exited with error"]


def test_throughput_and_sql_pages_render(pipeline_db, open_page):
    db, ids = pipeline_db
    at = open_page(db, "throughput")
    per_instance = at.dataframe[1].value.set_index("instance_id")
    assert per_instance.loc[ids["ok"], "proofs_per_hour"] > 0  # measured by `flightrec prove bench`
    assert per_instance.loc[ids["ok"], "meets_min_rate"]
    at = open_page(db, "sql")
    next(iter(at.text_area)).input(
        "SELECT instance_id, failure_class FROM failure_context WHERE failure_class = 'gpu_arch_unsupported'"
    ).run()
    assert ids["no_kernel"] in set(at.dataframe[0].value["instance_id"])
