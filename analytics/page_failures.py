"""Failures page: failures over time by class and GPU model, a list, and the full context of one."""

from __future__ import annotations

import altair as alt
import streamlit as st

from flightrec.analytics import queries
from flightrec.analytics.ui import fetch, fmt_num, page_link_url, query_param, remember_in_url, table_height


def charts(classes: list[str], gpus: list[str]) -> None:
    """Failures per hour stacked by class, and per GPU model."""
    over_time = fetch(queries.failures_over_time, classes=classes, gpu_models=gpus)
    by_gpu = fetch(queries.failures_by_gpu, classes=classes, gpu_models=gpus)
    if not over_time.num_rows:
        return
    left, right = st.columns(2)
    left.altair_chart(
        alt.Chart(over_time.to_pandas(), title="Failures per hour by class").mark_bar().encode(
            x=alt.X("hour:T", title="hour (UTC)"), y=alt.Y("failures:Q"), color="failure_class:N",
            tooltip=["hour", "failure_class", "failures"]), width="stretch")
    right.altair_chart(
        alt.Chart(by_gpu.to_pandas(), title="Failures by GPU model").mark_bar().encode(
            x=alt.X("failures:Q"), y=alt.Y("gpu_model:N", sort="-x", title=None, axis=alt.Axis(labelLimit=220)), color="failure_class:N",
            tooltip=["gpu_model", "failure_class", "failures"]), width="stretch")


def failure_label(row: dict) -> str:
    """How a failure reads in the picker: when, where, what."""
    return f"{row['failed_at']:%Y-%m-%d %H:%M:%S} · {row['instance_id']} · {row['stage']} · {row['failure_class']}"


def listing(classes: list[str], gpus: list[str]) -> str | None:
    """The failures table and the picker; returns the failure id to drill into."""
    table = fetch(queries.failure_list, classes=classes, gpu_models=gpus)
    if not table.num_rows:
        st.info("No failures match." if classes or gpus else "No failures recorded. Good.")
        return None
    frame = table.to_pandas()
    frame.insert(0, "open", [page_link_url("failures", failure=f) for f in frame["failure_id"]])
    st.dataframe(frame.drop(columns=["failure_id"]), hide_index=True, width="stretch", height=table_height(len(frame), 260),
                 column_config={"open": st.column_config.LinkColumn("open", display_text="open", width="small")})
    rows = table.select(["failure_id", "failed_at", "instance_id", "stage", "failure_class"]).to_pylist()
    labels = {r["failure_id"]: failure_label(r) for r in rows}
    ids = list(labels)
    wanted = query_param("failure")
    if wanted and wanted not in labels and not (classes or gpus):
        ids.insert(0, wanted)  # linked directly to one beyond the list's length: still show it
        labels[wanted] = wanted
    index = ids.index(wanted) if wanted in ids else 0
    key = f"failure_pick_{wanted}"
    return st.selectbox("Failure", ids, index=index, format_func=lambda i: labels.get(i, i), key=key,
                        on_change=remember_in_url, args=("failure", key))


def tail_block(title: str, lines: list[str] | None, matched: str | None) -> None:
    """One tail as a code block; the line the class rule matched is called out above it."""
    st.markdown(f"**{title}**")
    if not lines:
        st.caption("(empty)")
        return
    if matched and any(matched in line for line in lines):
        st.caption("contains the matched line")
    st.code("\n".join(lines), language=None, wrap_lines=True)


def drill_down(failure_id: str) -> None:
    """Everything that explains one failure."""
    f = fetch(queries.failure_detail, failure_id)
    if f is None:
        st.warning(f"No failure {failure_id!r} in the database.")
        return
    st.header(f"{f['instance_id']} · {f['stage']} · {f['outcome']}")
    st.page_link("page_instance.py", label="open the instance", icon=":material/memory:",
                 query_params={"instance": f["instance_id"]})
    st.caption(f"failed at {f['failed_at']} UTC")
    cols = st.columns([3, 1, 1, 2])
    cols[0].metric("Class", f["failure_class"] or "unknown")
    cols[1].metric("Exit code", "—" if f["exit_code"] is None else str(f["exit_code"]))
    cols[2].metric("Signal", f["signal_name"] or ("—" if not f["signal"] else str(f["signal"])))
    cols[3].metric("GPU", f["gpu_model"] or "unknown", help=f"compute capability {f['compute_capability']}")
    if f["hint"]:
        st.info(f"**Hint:** {f['hint']}")
    if f["matched_line"]:
        st.markdown("**Matched line**")
        st.code(f["matched_line"], language=None, wrap_lines=True)
    facts = (f"driver {f['driver_version'] or '?'} · CUDA {f['cuda_version'] or '?'} · "
             f"compute capability {f['compute_capability'] or '?'} · host {f['host'] or '?'}")
    if f["proofs_per_hour"] is not None:
        facts += f" · {fmt_num(f['proofs_per_hour'])} proofs/hour against a minimum of {fmt_num(f['min_rate'])}"
    st.caption(facts)
    if f["start_error"]:
        st.error(f"The command did not start: {f['start_error']}")
    if f["detail"]:
        st.caption(f"Detail: {f['detail']}")

    tails: list[tuple[str, list[str] | None]] = [("stderr", f["stderr_tail"])]
    for ft in f["file_tails"] or []:
        suffix = "" if ft.get("exists", True) else " (missing)"
        tails.append((f"{ft['path']}{suffix}", ft.get("lines")))
    if f["stdout_tail"]:
        tails.append(("stdout", f["stdout_tail"]))
    for col, (title, lines) in zip(st.columns(len(tails)), tails):
        with col:
            tail_block(title, lines, f["matched_line"])

    st.markdown("**Events that led up to it**")
    events = f["preceding_events"] or []
    st.code("\n".join(events) if events else "(none recorded)", language=None)


def render() -> None:
    """The Failures page."""
    st.title("Failures")
    options = fetch(queries.failure_filter_options).to_pylist()[0]
    c1, c2 = st.columns(2)
    classes = c1.multiselect("Failure class", options["classes"] or [], key="failures_classes")
    gpus = c2.multiselect("GPU model", options["gpu_models"] or [], key="failures_gpus")
    charts(classes, gpus)
    chosen = listing(classes, gpus)
    if chosen:
        drill_down(chosen)


if __name__ == "__main__":
    render()
