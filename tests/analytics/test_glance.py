"""The dashboard at a glance (issue #15): each page's points, checked with AppTest on databases folded from events."""

from __future__ import annotations

import json
from typing import Any

import pandas as pd
import pytest
import streamlit as st
from dashdata import BASE_US, MIN, NO_KERNEL, SEGV_ARGV, SEGV_GPU, SEGV_LINE, append_lines
from flightrec.analytics.ui import table_height
from streamlit.dataframe_util import convert_arrow_bytes_to_pandas_df
from streamlit.testing.v1 import AppTest

TIME_RANGE = "time_range"


def charts(at: AppTest) -> list[tuple[dict[str, Any], pd.DataFrame]]:
    """Every Vega-Lite chart on the page: (spec, its first dataset as a frame)."""
    out = []
    for el in at.get("vega_lite_chart"):
        spec = json.loads(el.proto.spec)
        data = convert_arrow_bytes_to_pandas_df(el.proto.datasets[0].data.data) if el.proto.datasets else pd.DataFrame()
        out.append((spec, data))
    return out


def chart(at: AppTest, title_part: str) -> tuple[dict[str, Any], pd.DataFrame]:
    found = [
        (s, d)
        for s, d in charts(at)
        if title_part in json.dumps(s.get("title", ""))
        or any(title_part in json.dumps(layer.get("title", "")) for layer in s.get("layer", []))
    ]
    assert found, f"no chart titled {title_part!r}: {[s.get('title') for s, _ in charts(at)]}"
    return found[0]


def enc(spec: dict[str, Any], channel: str) -> dict[str, Any]:
    """The encoding of ``channel`` in a chart or its first layer that has it."""
    for part in [spec, *spec.get("layer", [])]:
        if channel in part.get("encoding", {}):
            return part["encoding"][channel]
    raise AssertionError(f"no {channel} encoding in {spec}")


def column_config(df: Any) -> dict[str, Any]:
    return json.loads(df.proto.columns or "{}")


def text_of(at: AppTest) -> str:
    parts: list[str] = []
    for kind in ("markdown", "caption", "code", "info", "warning", "error", "title", "header", "subheader"):
        parts += [str(e.value) for e in getattr(at, kind)]
    parts += [f"{m.label}={m.value}" for m in at.metric]
    return "\n".join(parts)


# ---- every page ------------------------------------------------------------------------


def test_dashboard_starts_streamlit_without_the_deploy_button():
    from flightrec.cli.analytics import streamlit_command

    cmd = streamlit_command("/tmp/x.duckdb", 8501, "127.0.0.1")
    assert cmd[cmd.index("--client.toolbarMode") + 1] == "minimal"
    assert cmd.index("--client.toolbarMode") < cmd.index("--")  # a streamlit option, not one of the app's


@pytest.mark.slow
def test_time_range_picker_is_shared_by_all_pages(glance_db, open_page):
    db, ids = glance_db
    at = open_page(db)
    picker = at.selectbox(key=TIME_RANGE)
    assert picker.options == ["Last 15 min", "Last 1 h", "Last 6 h", "Last 24 h", "All time"]
    assert picker.value == "All time"
    assert len(at.dataframe[0].value) == 4
    picker.select("Last 15 min").run()  # the fixture's events are long past
    assert at.dataframe[0].value.empty if at.dataframe else True
    at.switch_page("page_failures.py").run()
    assert at.selectbox(key=TIME_RANGE).value == "Last 15 min"  # kept across pages
    assert "No failures" in text_of(at)
    at.selectbox(key=TIME_RANGE).select("All time").run()
    assert ids["segv"] in set(at.dataframe[0].value["instance_id"])


# ---- Fleet -----------------------------------------------------------------------------


def test_fleet_rows_show_status_first_class_and_links(glance_db, open_page):
    db, ids = glance_db
    at = open_page(db)
    frame = at.dataframe[0].value
    assert list(frame.columns)[0] == "status"
    rows = frame.set_index("instance_id")
    assert rows.loc[ids["segv"], "status"] == "failed"
    assert rows.loc[ids["segv"], "failure_class"] == "daemon_crashed"
    assert rows.loc[ids["slow"], "status"] == "below_min_rate"
    assert rows.loc[ids["no_kernel"], "failure"] == f"failures?failure={ids['no_kernel_failure']}"
    assert rows.loc[ids["segv"], "failure"] == f"failures?failure={ids['segv_failure']}"
    assert pd.isna(rows.loc[ids["ok"], "failure"])  # nothing failed: no link
    assert rows.loc[ids["ok"], "instance"] == f"instance?instance={ids['ok']}"
    config = column_config(at.dataframe[0])
    assert config["failure"]["type_config"]["type"] == "link"
    assert config["instance"]["type_config"]["type"] == "link"
    assert config["instance_id"]["width"] == "large"  # ids are not cut
    assert at.dataframe[0].proto.placeholder == "—"  # a missing value reads as a dash, not "None"


def test_fleet_table_fits_its_rows():
    for rows in (1, 4, 12, 25):
        assert table_height(rows) >= 35 * (rows + 1)  # every row of a fleet that size shows without scrolling


def test_fleet_count_charts_have_integer_axes_and_every_label(glance_db, open_page):
    db, _ = glance_db
    at = open_page(db)
    for title in ("Instances by status", "Instances by GPU model"):
        spec, data = chart(at, title)
        axis = enc(spec, "x")["axis"]
        assert axis["tickMinStep"] == 1 and axis["format"] == "d"
        assert enc(spec, "y")["axis"]["labelOverlap"] is False
    _, gpus = chart(at, "Instances by GPU model")
    assert SEGV_GPU in set(gpus["gpu_model"])


def test_fleet_and_detail_pages_refresh_by_themselves(glance_db, open_page):
    db, ids = glance_db
    at = open_page(db)
    assert at.toggle(key="fleet_live").value
    at = open_page(db, "instance", instance=ids["no_kernel"])
    assert at.toggle(key="instance_live").value
    at = open_page(db, "failures", failure=ids["no_kernel_failure"])
    assert at.toggle(key="failures_live").value


# ---- Instance --------------------------------------------------------------------------


def test_instance_stage_chart_labels_every_stage_and_times_read(glance_db, open_page):
    db, ids = glance_db
    at = open_page(db, "instance", instance=ids["ok"])
    spec, data = chart(at, "Stages")
    y = enc(spec, "y")
    assert y["axis"]["labelOverlap"] is False
    assert y["sort"] == ["tunnel", "register", "fetch_params", "benchmark", "supervisor"]
    assert spec["height"] >= 28 * 5
    spec, _ = chart(at, "Throughput")
    assert enc(spec, "x")["axis"]["format"] == "%H:%M:%S"


def test_instance_log_sources_are_short_with_the_path_in_a_legend(glance_db, open_page):
    db, ids = glance_db
    at = open_page(db, "instance", instance=ids["no_kernel"])
    logs = at.dataframe[-1].value
    assert "daemon.log" in set(logs["source"])
    assert "/var/log/prover/daemon.log" not in set(logs["source"])
    assert "daemon.log = /var/log/prover/daemon.log" in text_of(at)


def test_instance_shows_the_cuda_error_above_the_fold_and_whole_commands(glance_db, open_page):
    db, ids = glance_db
    at = open_page(db, "instance", instance=ids["no_kernel"])
    assert any(NO_KERNEL in e.value for e in at.error)
    at = open_page(db, "instance", instance=ids["segv"])
    assert any(SEGV_LINE in e.value or "core dumped" in e.value for e in at.error)
    exits = at.table[0].value
    assert " ".join(SEGV_ARGV) in list(exits["command"])


@pytest.mark.slow
def test_instance_live_tail_shows_new_lines_first(live_db, open_page):
    db, ids = live_db
    iid = ids["ok"]
    at = open_page(db, "instance", instance=iid)
    at.toggle(key=f"live_tail_{iid}").set_value(True).run()
    tail = at.dataframe[-1].value
    assert tail["text"].iloc[0] == "proof 49 done"  # newest first
    append_lines(db, iid, "supervisor", ["proof 50 done", "proof 51 done"], BASE_US + 60 * MIN, seq=500)
    st.cache_data.clear()  # what the refresh period does on a live page
    at.run()
    tail = at.dataframe[-1].value
    assert list(tail["text"].iloc[:2]) == ["proof 51 done", "proof 50 done"]


# ---- Failures --------------------------------------------------------------------------


def test_failure_of_a_daemon_sigsegv_shows_the_signal_and_whole_gpu_name(glance_db, open_page):
    db, ids = glance_db
    at = open_page(db, "failures", failure=ids["segv_failure"])
    assert next(m.value for m in at.metric if m.label == "Signal") == "SIGSEGV"
    assert all(SEGV_GPU not in str(m.value) for m in at.metric)  # not in a metric that cuts it
    assert f"**GPU** {SEGV_GPU}" in text_of(at)


def test_failure_long_tail_collapsed_around_the_highlighted_line(glance_db, open_page):
    db, ids = glance_db
    at = open_page(db, "failures", failure=ids["segv_failure"])
    codes = [c.value for c in at.code]
    around = [c for c in codes if SEGV_LINE in c and "goroutine" in c]
    assert around, codes
    window = around[0].splitlines()
    assert len(window) <= 21
    assert f"▶ {SEGV_LINE}" in window
    assert any(e.label.startswith("All 90 lines") for e in at.expander)


UNKNOWN_WHY = "Error: witness column 7 has 3 rows, the circuit expects 4"


def _unknown_failure_db(path) -> tuple[str, str]:
    """A database of one instance whose benchmark failed in a way no rule knows; (instance id, failure id)."""
    from dashdata import Boot, commit, facts, first_failure_id, stages_ok
    from flightrec.schemas import Lifecycle, ProcessExit

    b = Boot("a100-unknown")
    facts(b, "NVIDIA A100-SXM4-80GB", "8.0", 1.1)
    t = stages_ok(b, "benchmark", BASE_US)
    b.add(Lifecycle, t, stage="benchmark", state="started")
    stderr = ["loading circuit", UNKNOWN_WHY, "exit status 1", "benchmark exited with error"]
    b.lines("benchmark", "stderr", stderr, t + 1000)
    b.add(
        ProcessExit,
        t + 9_000_000,
        stage="benchmark",
        argv=["./bench"],
        pid=7,
        exit_code=1,
        started_us=t,
        ended_us=t + 9_000_000,
        duration_s=9.0,
        stderr_tail=stderr,
    )
    b.add(Lifecycle, t + 9_500_000, stage="benchmark", state="failed", detail="benchmark exited with error")
    commit(path, [b])
    return b.instance, first_failure_id(path, b.instance)


def test_an_unknown_failure_shows_its_decisive_line_above_the_fold(tmp_path, open_page):
    """No rule knows it: the Failures page still shows the line that says why, where it stands, and that no rule
    placed it; the Instance page shows the same line in its failure banner."""
    db = tmp_path / "unknown.duckdb"
    instance, failure = _unknown_failure_db(db)
    at = open_page(db, "failures", failure=failure)
    assert next(m.value for m in at.metric if m.label == "Class") == "unknown"
    assert UNKNOWN_WHY in [c.value for c in at.code]
    assert any("stderr, line 2 of its tail" in c.value and "no rule placed it" in c.value for c in at.caption)
    assert any(f"▶ {UNKNOWN_WHY}" in c.value for c in at.code)  # and marked in its tail
    at = open_page(db, "instance", instance=instance)
    assert any(UNKNOWN_WHY in e.value for e in at.error)


def test_failure_events_that_led_up_to_it_have_times(glance_db, open_page):
    db, ids = glance_db
    at = open_page(db, "failures", failure=ids["no_kernel_failure"])
    events = at.dataframe[-1].value
    assert {"at", "stage", "state"} <= set(events.columns)
    assert "benchmark" in set(events["stage"])
    assert events["at"].notna().all()


def test_failures_chart_uses_minutes_when_hours_say_nothing(glance_db, open_page):
    db, _ = glance_db
    at = open_page(db, "failures")
    spec, data = chart(at, "Failures per minute")
    assert len(set(data.iloc[:, 0])) >= 2  # two moments 40 min apart: two bars, not one
    assert enc(spec, "y")["axis"]["tickMinStep"] == 1


# ---- Throughput ------------------------------------------------------------------------


def test_throughput_distribution_labels_every_gpu_and_minutes_over_time(glance_db, open_page):
    db, _ = glance_db
    at = open_page(db, "throughput")
    spec, data = chart(at, "Distribution")
    y = enc(spec, "y")
    assert y["axis"]["labelOverlap"] is False and y["axis"]["labelLimit"] == 0
    spec, data = chart(at, "per minute")
    h100 = data[data["gpu_model"] == "NVIDIA H100 80GB HBM3"]
    assert len(h100) >= 2  # samples a minute apart are not one hourly point


def test_fleet_lists_what_needs_attention_with_links(glance_db, open_page):
    db, ids = glance_db
    at = open_page(db)
    links = [(el.proto.label, el.proto.page, el.proto.query_string) for el in at.get("page_link")]
    failure_links = [q for label, _, q in links if label == "failure"]
    assert f"failure={ids['segv_failure']}" in failure_links
    assert f"failure={ids['no_kernel_failure']}" in failure_links
    assert any(label == "instance" and q == f"instance={ids['slow']}" for label, _, q in links)
    assert all(ids["ok"] not in q for _, _, q in links)  # a healthy instance needs no look


# ---- the pure helpers behind those points ----------------------------------------------


def test_collapse_keeps_context_around_the_marked_line():
    from flightrec.analytics.ui import collapse

    lines = [f"l{n}" for n in range(90)]
    shown, cut = collapse(lines, 60)
    assert cut and len(shown) == 21 and shown[10] == "▶ l60" and shown[0] == "l50" and shown[-1] == "l70"
    shown, cut = collapse(lines, 88)  # near the end: still 21 lines, ending with the last
    assert cut and len(shown) == 21 and shown[-1] == "l89" and "▶ l88" in shown
    assert collapse(lines[:5], 2) == (["l0", "l1", "▶ l2", "l3", "l4"], False)
    assert collapse(lines, None) == (lines, False) and collapse(lines, 90) == (lines, False)
    same = ["retry", "retry", "retry"]  # the decisive line by its place, not the first line with its text
    assert collapse(same, 2) == (["retry", "retry", "▶ retry"], False)


def test_bucket_unit_and_short_source():
    from flightrec.analytics.ui import bucket_unit, short_source

    assert bucket_unit(0, 40 * 60_000_000) == "minute"
    assert bucket_unit(0, 30 * 3600 * 1_000_000) == "hour"
    assert bucket_unit(0, 10 * 86400 * 1_000_000) == "day"
    assert bucket_unit(None, None) == "hour"
    assert short_source("/tmp/x/.flightrec/h100-01/prover-daemon.log") == "prover-daemon.log"
    assert (short_source("stdout"), short_source("stderr"), short_source(None)) == ("stdout", "stderr", None)


def test_instance_picker_follows_the_time_range_but_keeps_a_linked_instance(glance_db, open_page):
    db, ids = glance_db
    at = open_page(db, "instance", instance=ids["segv"])
    at.selectbox(key=TIME_RANGE).select("Last 15 min").run()
    picker = next(s for s in at.selectbox if s.label == "Instance")
    assert picker.options == [ids["segv"]] and picker.value == ids["segv"]  # the linked one, nothing else


def test_needs_attention_lists_every_instance_that_needs_a_look(tmp_path, open_page):
    """Ten failed instances and an older destroyed one whose boot never sealed: all eleven listed, none cut off;
    a destroyed instance whose evidence is complete and a finished one are not."""
    from dashdata import Boot, commit, facts, manager_events, stages_ok
    from flightrec.schemas.events import Lifecycle, ProcessExit

    boots = []
    for n in range(10):
        b = Boot(f"fail-{n:02d}", BASE_US + (n + 10) * 10 * MIN)
        facts(b, "NVIDIA A40", "8.6", 0.4)
        t = stages_ok(b, "benchmark", b.t)
        b.add(Lifecycle, t, stage="benchmark", state="started")
        b.add(
            ProcessExit,
            t + MIN,
            stage="benchmark",
            argv=["bench"],
            pid=7,
            exit_code=1,
            started_us=t,
            ended_us=t + MIN,
            duration_s=60.0,
            stderr_tail=["out of memory"],
        )
        b.add(Lifecycle, t + MIN + 1000, stage="benchmark", state="failed", detail="benchmark exited with error")
        b.seal()
        boots.append(b)
    gone = Boot("gone-01", BASE_US)  # destroyed mid-supervisor, never sealed: the evidence is incomplete
    facts(gone, "NVIDIA H100 80GB HBM3", "9.0", 2.0)
    t = stages_ok(gone, "supervisor", BASE_US)
    gone.add(Lifecycle, t, stage="supervisor", state="started")
    done = Boot("done-01", BASE_US)  # destroyed after its boot sealed: nothing missing
    facts(done, "NVIDIA H100 80GB HBM3", "9.0", 2.0)
    done.seal(stages_ok(done, "supervisor", BASE_US))
    boots += [gone, done, manager_events("gone-01", ("destroyed", t + 5 * MIN, {}))]
    boots += [manager_events("done-01", ("destroyed", t + 5 * MIN, {}))]
    db = tmp_path / "fleet.duckdb"
    commit(db, boots)
    at = open_page(db)
    listed = {
        q.removeprefix("instance=")
        for label, q in [(el.proto.label, el.proto.query_string) for el in at.get("page_link")]
        if label == "instance"
    }
    assert listed == {f"fail-{n:02d}" for n in range(10)} | {"gone-01"}, listed
    text = " ".join(m.value for m in at.markdown)
    assert "evidence incomplete" in text and "not sealed" in text, text
