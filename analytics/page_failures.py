"""Failures page: failures over time by class and GPU model, a list, and the full context of one."""

from __future__ import annotations

from typing import Any

import altair as alt
import streamlit as st
from flightrec.analytics import queries
from flightrec.analytics.ui import (
    HINT_CHARS,
    REFRESH_S,
    bucket_unit,
    collapse,
    cut_line,
    fetch,
    fmt_num,
    md,
    page_link_url,
    query_param,
    remember_in_url,
    rows_height,
    short_source,
    since_us,
    table_height,
)

COUNT_AXIS: dict[str, Any] = {"tickMinStep": 1, "format": "d"}  # counts of failures: whole numbers on the axis
BUCKET_FORMAT = {"minute": "%H:%M", "hour": "%m-%d %H:00", "day": "%Y-%m-%d"}


def charts(classes: list[str], gpus: list[str], since: int | None) -> None:
    """Failures per minute, hour or day (whichever says something) stacked by class, and per GPU model."""
    span = fetch(queries.failures_span, classes=classes, gpu_models=gpus, since_us=since).to_pylist()[0]
    unit = bucket_unit(span["first_us"], span["last_us"])
    over_time = fetch(queries.failures_over_time, classes=classes, gpu_models=gpus, since_us=since, unit=unit)
    by_gpu = fetch(queries.failures_by_gpu, classes=classes, gpu_models=gpus, since_us=since)
    if not over_time.num_rows:
        return
    frame = over_time.to_pandas()
    frame["when"] = frame["bucket"].dt.strftime(BUCKET_FORMAT[unit])  # one band per bucket, labelled, not a hairline
    left, right = st.columns(2)
    tall = rows_height(by_gpu.to_pandas()["gpu_model"].nunique() if by_gpu.num_rows else 1)
    left.altair_chart(
        alt.Chart(frame, title=f"Failures per {unit} by class (UTC)")
        .mark_bar()
        .encode(
            x=alt.X("when:O", title=f"{unit} (UTC)", sort=None, axis=alt.Axis(labelAngle=0)),
            y=alt.Y("failures:Q", axis=alt.Axis(**COUNT_AXIS)),
            color="failure_class:N",
            tooltip=["bucket", "failure_class", "failures"],
        )
        .properties(height=tall),
        width="stretch",
        height=tall,
    )
    right.altair_chart(
        alt.Chart(by_gpu.to_pandas(), title="Failures by GPU model")
        .mark_bar()
        .encode(
            x=alt.X("failures:Q", axis=alt.Axis(**COUNT_AXIS)),
            y=alt.Y("gpu_model:N", sort="-x", title=None, axis=alt.Axis(labelLimit=0, labelOverlap=False)),
            color="failure_class:N",
            tooltip=["gpu_model", "failure_class", "failures"],
        )
        .properties(height=tall),
        width="stretch",
        height=tall,
    )


def failure_label(row: dict) -> str:
    """How a failure reads in the picker: when, where, what."""
    return f"{row['failed_at']:%Y-%m-%d %H:%M:%S} · {row['instance_id']} · {row['stage']} · {row['failure_class']}"


def listing(classes: list[str], gpus: list[str], since: int | None) -> str | None:
    """The failures table and the picker; returns the failure id to drill into."""
    table = fetch(queries.failure_list, classes=classes, gpu_models=gpus, since_us=since)
    wanted = query_param("failure")
    if not table.num_rows:
        st.info("No failures match." if classes or gpus or since else "No failures recorded. Good.")
        return wanted
    frame = table.to_pandas()
    frame.insert(0, "open", [page_link_url("failures", failure=f) for f in frame["failure_id"]])
    st.dataframe(
        frame.drop(columns=["failure_id"]),
        hide_index=True,
        width="stretch",
        height=table_height(len(frame), 260),
        column_config={
            "open": st.column_config.LinkColumn("open", display_text="open", width="small"),
            "instance_id": st.column_config.TextColumn("instance_id", width="medium"),
            "gpu_model": st.column_config.TextColumn("gpu_model", width="medium"),
        },
    )
    rows = table.select(["failure_id", "failed_at", "instance_id", "stage", "failure_class"]).to_pylist()
    labels = {r["failure_id"]: failure_label(r) for r in rows}
    ids = list(labels)
    if wanted and wanted not in labels:
        ids.insert(
            0, wanted
        )  # linked directly to one outside the list (its length, filters, time range): still show it
        labels[wanted] = wanted
    index = ids.index(wanted) if wanted in ids else 0
    key = f"failure_pick_{wanted}"
    return st.selectbox(
        "Failure",
        ids,
        index=index,
        format_func=lambda i: labels.get(i, i),
        key=key,
        on_change=remember_in_url,
        args=("failure", key),
    )


def tail_block(title: str, lines: list[str] | None, at: int | None) -> None:
    """One tail as a code block: the decisive line (line ``at``) marked ▶, a long tail collapsed around it (all of it
    below)."""
    st.markdown(f"**{md(title)}**")
    if not lines:
        st.caption("(empty)")
        return
    shown, cut = collapse(list(lines), at)
    if shown != list(lines):
        st.caption("▶ the decisive line" + (f"; {len(shown)} of {len(lines)} lines around it" if cut else ""))
    short = [cut_line(line) for line in shown]
    st.code("\n".join(short), language=None, wrap_lines=True)
    if cut or short != shown:
        with st.expander(f"All {len(lines)} lines"):
            st.code("\n".join(lines), language=None, wrap_lines=True)


def where_decided(f: dict) -> str:
    """Where a failure's decisive line stands and what classed it, in words."""
    source, line_no = f.get("decisive_source"), f.get("decisive_line_no")
    if source in ("exit", "result"):
        where = "the exit's own words" if source == "exit" else "the benchmark's result"
    elif source == "detail":
        where = "the stage's failed event"
    else:
        where = f"{short_source(source) or '?'}" + (f", line {line_no + 1} of its tail" if line_no is not None else "")
    if f.get("rule_id") and f.get("failure_class") != "unknown":
        how = f"classed by rule `{md(f['rule_id'])}` (rules {md(f.get('rules_version') or '?')})"
    else:
        how = "no rule placed it: read the line and the tails"
    return f"{md(where)} · {how}"


def decisive(f: dict) -> None:
    """The line that says why, for every failure (unknown included), and where it stands: above the fold."""
    line = f.get("decisive_line")
    st.markdown("**Why: the decisive line**")
    if line:
        st.code(cut_line(line), language=None, wrap_lines=True)
        st.caption(where_decided(f))
    else:
        st.caption("No line recorded (a failure built before flightrec kept decisive lines: replay to add it).")


def drill_down(failure_id: str) -> None:
    """Everything that explains one failure."""
    f = fetch(queries.failure_detail, failure_id)
    if f is None:
        st.warning(f"No failure {md(failure_id)} in the database.")
        return
    st.header(f"{md(f['instance_id'])} · {md(f['stage'])} · {md(f['outcome'])}")
    st.code(f["instance_id"], language=None)  # the id, with a copy button
    st.page_link(
        "page_instance.py",
        label="open the instance",
        icon=":material/memory:",
        query_params={"instance": f["instance_id"]},
    )
    st.caption(f"failed at {f['failed_at']} UTC · failure id {md(failure_id)}")
    decisive(f)
    name, where = f.get("killed_by"), f.get("killed_by_evidence")  # read by the materializer (db/classify.py)
    cols = st.columns([3, 1, 1])
    cols[0].metric("Class", f["failure_class"] or "unknown")
    cols[1].metric("Exit code", "—" if f["exit_code"] is None else str(f["exit_code"]))
    cols[2].metric("Signal", name or "—", help=md(where) or "no signal: the command exited by itself")
    # The GPU's full name (a metric would cut it).
    st.markdown(f"**GPU** {md(f['gpu_model'] or 'unknown')} · compute capability {md(f['compute_capability'] or '?')}")
    if f["hint"]:
        st.info(f"**Hint:** {md(f['hint'], HINT_CHARS)}")
    facts = (
        f"driver {md(f['driver_version'] or '?')} · CUDA {md(f['cuda_version'] or '?')} · "
        f"compute capability {md(f['compute_capability'] or '?')} · host {md(f['host'] or '?')}"
    )
    if f["proofs_per_hour"] is not None:
        facts += f" · {fmt_num(f['proofs_per_hour'])} proofs/hour against a minimum of {fmt_num(f['min_rate'])}"
    st.caption(facts)
    if f["start_error"]:
        st.error(f"The command did not start: {md(f['start_error'])}")
    if f["detail"]:
        st.caption(f"Detail: {md(f['detail'])}")

    tails: list[tuple[str, str, list[str] | None]] = [("stderr", "stderr", f["stderr_tail"])]
    for ft in f["file_tails"] or []:
        suffix = "" if ft.get("exists", True) else " (missing)"
        tails.append((f"{short_source(ft['path'])}{suffix}", ft["path"], ft.get("lines")))
    if f["stdout_tail"]:
        tails.append(("stdout", "stdout", f["stdout_tail"]))
    files = [ft["path"] for ft in f["file_tails"] or [] if short_source(ft["path"]) != ft["path"]]
    if files:
        st.caption("Files: " + " · ".join(f"{md(short_source(p))} = {md(p)}" for p in files))
    for col, (title, source, lines) in zip(st.columns(len(tails)), tails, strict=True):
        with col:
            tail_block(title, lines, f.get("decisive_line_no") if f.get("decisive_source") == source else None)
    if f.get("last_lines"):  # kept in the failures row by the materializer: no scan of the log lines
        with st.expander(f"The stage's last {len(f['last_lines'])} lines, every source in order"):
            st.code(
                "\n".join(f"{short_source(line['source'])}: {line['text']}" for line in f["last_lines"]),
                language=None,
                wrap_lines=True,
            )

    st.markdown("**Events that led up to it**")
    events = fetch(queries.failure_events, failure_id)
    if events.num_rows:
        st.dataframe(
            events.select(["at", "stage", "state", "detail"]).to_pandas(),
            hide_index=True,
            width="stretch",
            height=table_height(events.num_rows, 420),
            column_config={
                "at": st.column_config.DatetimeColumn("at (UTC)", format="YYYY-MM-DD HH:mm:ss.SSS"),
                "detail": st.column_config.TextColumn("detail", width="large"),
            },
        )
    else:
        st.code("\n".join(f["preceding_events"] or []) or "(none recorded)", language=None)


def body(classes: list[str], gpus: list[str]) -> None:
    """Charts, list and drill-down (rerun by itself every few seconds while `live` is on)."""
    since = since_us()
    charts(classes, gpus, since)
    chosen = listing(classes, gpus, since)
    if chosen:
        drill_down(chosen)


def render() -> None:
    """The Failures page."""
    st.title("Failures")
    options = fetch(queries.failure_filter_options).to_pylist()[0]
    c1, c2, c3 = st.columns([2, 2, 1])
    classes = c1.multiselect("Failure class", options["classes"] or [], key="failures_classes")
    gpus = c2.multiselect("GPU model", options["gpu_models"] or [], key="failures_gpus")
    live = c3.toggle(
        "Refresh while the materializer runs",
        value=True,
        key="failures_live",
        help=f"Re-reads the database every {REFRESH_S:.0f} s",
    )
    st.fragment(body, run_every=REFRESH_S if live else None)(classes, gpus)


if __name__ == "__main__":
    render()
