"""Instance page: one instance's life - stage timeline, exits, throughput and a log viewer."""

from __future__ import annotations

import altair as alt
import streamlit as st
from flightrec.analytics import queries
from flightrec.analytics.ui import (
    HINT_CHARS,
    REFRESH_S,
    cut_line,
    fetch,
    fmt_num,
    fmt_offset,
    md,
    md_code_block,
    md_money,
    query_param,
    remember_in_url,
    rows_height,
    short_source,
    since_us,
    table_height,
)
from flightrec.db.status import CLOCK_SKEW_BOUND_S

TAIL_ROWS = 200  # lines the live tail shows, newest first

OUTCOME_COLORS = alt.Scale(
    domain=[
        "succeeded",
        "failed",
        "skipped",
        "running",
        "no end (lost)",
        "no end (destroyed)",
        "no end (finished)",
        "no end (rebooted)",
    ],
    range=["#2e7d32", "#c62828", "#9e9e9e", "#1565c0", "#ef6c00", "#6d4c41", "#757575", "#757575"],
)
STATUS_BANNER = {
    "failed": st.error,
    "below_min_rate": st.warning,
    "lost": st.error,
    "destroyed": st.warning,
    "finished": st.success,
    "healthy": st.success,
    "running": st.info,
    "idle": st.info,
}


def pick_instance() -> str | None:
    """The instance to show: from ?instance=ID, else the selectbox (newest activity first, within the time range)."""
    ids = fetch(queries.instance_ids, since_us=since_us())
    wanted = query_param("instance")
    if wanted and wanted not in ids:
        if fetch(queries.fleet_row, wanted).num_rows:
            ids = [wanted, *ids]  # linked to one outside the time range: still show it
        elif fetch(queries.instance_manager_events, wanted).num_rows:
            st.info(
                f"{md(wanted)} is known only from the manager's events: its agent has sent nothing yet "
                "(still booting, or the agent never started: look at the machine)."
            )
            manager_events(wanted)
            return None
        else:
            st.warning(f"No instance {md(wanted)} in the database" + ("; showing the newest one." if ids else "."))
    if not ids:
        st.info(
            "No instances heard from in this time range (sidebar). Widen it, or start `flightrec materialize` "
            "and an agent."
        )
        return None
    index = ids.index(wanted) if wanted in ids else 0
    key = f"instance_pick_{wanted}"
    return st.selectbox("Instance", ids, index=index, key=key, on_change=remember_in_url, args=("instance", key))


def facts(instance_id: str) -> dict | None:
    """Headline facts of the instance."""
    rows = fetch(queries.fleet_row, instance_id).to_pylist()
    if not rows:
        st.warning(f"No instance {instance_id!r} in the database.")
        return None
    f = rows[0]
    st.code(instance_id, language=None)  # the id, with a copy button
    cols = st.columns(5)
    cols[0].metric("Status", f"{f['status'] or '—'}", help=f"{md(f['status_detail'])} (state: {md(f['state'])})")
    cols[1].metric("Stage", f["stage"] or "—", help=f"its last lifecycle state: {md(f['state'])}")
    cols[2].metric("Proofs/hour", fmt_num(f["proofs_per_hour"]), help=f"minimum rate {fmt_num(f['min_rate'])}")
    cols[3].metric("Verdict", f["verdict"] or "—")
    cols[4].metric("Failures", f"{f['failures']}")
    evidence = "complete" if f["complete"] else f"incomplete ({f['incomplete_reason'] or 'not sealed'})"
    st.caption(
        f"GPU **{md(f['gpu_model'] or 'unknown')}** ×{f['gpu_count'] or '?'} · "
        f"compute {md(f['compute_capability'] or '?')} · driver {md(f['driver_version'] or '?')} · "
        f"CUDA {md(f['cuda_version'] or '?')} · host {md(f['host'] or '?')} · "
        f"{md_money(f['price_per_hour'], 2)}/hour · cost/proof {md_money(f['cost_per_proof'])} · "
        f"first seen {f['first_seen']} · last seen {f['last_seen']} · evidence {evidence}"
    )
    if f["detail"]:
        st.caption(f"Latest detail: {md(f['detail'])}")
    if f.get("status"):
        STATUS_BANNER.get(f["status"], st.info)(f"Status **{md(f['status'])}**: {md(f['status_detail'])}")
    clock(f)
    return f


def rejected(instance_id: str) -> None:
    """Messages of the instance kept as dead letters (an event id reused with other content first among them)."""
    rows = fetch(queries.instance_rejected, instance_id)
    if not rows.num_rows:
        return
    reused = sum("reused" in r for r in rows.column("reason").to_pylist())
    st.warning(
        f"**{rows.num_rows} message{'s' if rows.num_rows > 1 else ''} of this instance kept as dead letters"
        f"**{f' ({reused} an event id reused with other content: not stored, the first stays)' if reused else ''}"
        ": a forger or a broken producer; see below."
    )
    st.dataframe(rows.to_pandas(), hide_index=True, width="stretch", height=table_height(rows.num_rows, 200))


def clock(f: dict) -> None:
    """The instance's clock against the broker's, and by whose clock its liveness is judged."""
    offset = f.get("clock_offset_s")
    if f.get("liveness_clock") == "instance":
        st.caption(
            "Clock offset unknown: its events carry no receive time (the topics stamp CreateTime, or they "
            "were folded before receive times were kept), so liveness follows the instance's own clock. "
            "Switch the topics to message.timestamp.type=LogAppendTime (docs/materializer.md, Clocks)."
        )
        return
    if offset is None:
        return
    if f.get("clock_skewed"):
        st.warning(
            f"Clock offset **{fmt_offset(offset)}** of Kafka's (more than {CLOCK_SKEW_BOUND_S} s): this "
            "instance's clock is wrong, so its own times (log lines, stage starts and ends, exits) are off by "
            "that much. Its liveness is not: it is judged by when Kafka received its events."
        )
    else:
        st.caption(
            f"Clock offset {fmt_offset(offset)} of Kafka's (within {CLOCK_SKEW_BOUND_S} s) · liveness "
            "judged by when Kafka received its events"
        )


def manager_events(instance_id: str) -> None:
    """What the manager said about the instance, in place."""
    events = fetch(queries.instance_manager_events, instance_id)
    if events.num_rows:
        st.subheader("Manager events")
        st.dataframe(events.to_pandas(), hide_index=True, width="stretch", height=table_height(events.num_rows, 240))


def timeline(instance_id: str) -> None:
    """A Gantt chart of the stage runs."""
    stages = fetch(queries.instance_stages, instance_id)
    st.subheader("Stages")
    if not stages.num_rows:
        st.caption("No stage events.")
        return
    frame = stages.to_pandas()
    order = list(dict.fromkeys(frame.sort_values("started_at", kind="stable")["stage"]))  # by first start
    chart = (
        alt.Chart(frame, title="Stages")
        .mark_bar()
        .encode(
            x=alt.X("started_at:T", title="time (UTC)", axis=alt.Axis(format="%H:%M:%S")),
            x2="ended_at:T",
            y=alt.Y("stage:N", sort=order, title=None, axis=alt.Axis(labelOverlap=False, labelLimit=0)),
            color=alt.Color("outcome:N", scale=OUTCOME_COLORS),
            tooltip=["stage", "outcome", "started_at", "ended_at", "duration_s", "detail"],
        )
        .properties(height=rows_height(len(order)))
    )
    st.altair_chart(chart, width="stretch", height=rows_height(len(order)))
    st.dataframe(
        frame[["stage", "outcome", "started_at", "ended_at", "duration_s", "detail"]],
        hide_index=True,
        width="stretch",
        height=table_height(len(frame), 300),
    )


def exits_and_throughput(instance_id: str) -> None:
    """Its subprocess exits (the page's whole width: eight columns cut off in half of it), then its throughput."""
    st.subheader("Exits")
    exits = fetch(queries.instance_exits, instance_id)
    if exits.num_rows:
        st.table(exits.to_pandas())  # a static table wraps: the whole command shows
    else:
        st.caption("No subprocess exits.")
    right = st.container()
    right.subheader("Throughput")
    tp = fetch(queries.instance_throughput, instance_id)
    if tp.num_rows:
        frame = tp.to_pandas()
        line = (
            alt.Chart(frame, title="Throughput")
            .mark_line(point=True)
            .encode(
                x=alt.X("ts:T", title="time (UTC)", axis=alt.Axis(format="%H:%M:%S", labelAngle=0)),
                y=alt.Y("proofs_per_hour:Q", title="proofs/hour"),
                color="kind:N",
                tooltip=["ts", "kind", "phase", "proofs", "proofs_per_hour", "verdict"],
            )
        )
        layers = [line]
        if frame["min_rate"].notna().any():
            layers.append(
                alt.Chart(frame.dropna(subset=["min_rate"]).head(1))
                .mark_rule(strokeDash=[4, 4], color="red")
                .encode(y="min_rate:Q")
            )
        right.altair_chart(alt.layer(*layers), width="stretch")
    else:
        right.caption("No throughput measured.")


def failures(instance_id: str) -> list[dict]:
    """Its failures, each linking to the drill-down on the Failures page."""
    rows = fetch(queries.instance_failures, instance_id).to_pylist()
    if rows:
        latest = rows[0]  # the decisive line, above the fold
        st.error(
            f"**{md(latest['stage'])}** failed: {md(latest['failure_class'])}"
            + (f"\n\n{md_code_block(latest['decisive_line'])}" if latest["decisive_line"] else "")
        )
        st.subheader("Failures")
        for r in rows:
            st.markdown(
                f"- **{md(r['stage'])}** {md(r['outcome'])} at {r['failed_at']} — "
                f"{md(r['failure_class'])}: {md(r['hint'], HINT_CHARS)}"
            )
            if r["decisive_line"]:
                st.code(cut_line(r["decisive_line"]), language=None, wrap_lines=True)
            st.page_link(
                "page_failures.py",
                label=f"drill down: {md(r['stage'])} {md(r['failure_class'])}",
                icon=":material/search:",
                query_params={"failure": r["failure_id"]},
            )
    return rows


def logs(instance_id: str, failure_rows: list[dict]) -> None:
    """The log viewer: filter by stage and source, search, jump to the failure."""
    st.subheader("Logs")
    c1, c2, c3, c4 = st.columns([2, 3, 2, 1])
    live = c4.toggle(
        "Live tail",
        value=False,
        key=f"live_tail_{instance_id}",
        help="The newest lines first; follows them while the page refreshes",
    )
    jump = c4.toggle(
        "Jump to the failure", value=False, disabled=not failure_rows or live, key=f"logs_jump_{instance_id}"
    )
    around = None
    default_stages: list[str] = []
    if jump and failure_rows and not live:
        failure = failure_rows[0]
        # up to the failed stage's last line: a late one (the daemon's, after the exit) may be the one that says why
        last = fetch(queries.failure_lines_end, failure["failure_id"])
        around = max(failure["ts_us"], last or 0)
        default_stages = [failure["stage"]]
    # The filters' values are read before their widgets are drawn, so one scan answers both
    # the widgets' options and the lines (a widget keeps its value in st.session_state).
    stage_key, source_key, search_key = (
        f"logs_stages_{instance_id}_{jump}",
        f"logs_sources_{instance_id}",
        f"logs_search_{instance_id}",
    )
    stages = list(st.session_state.get(stage_key, default_stages))
    chosen_sources = list(st.session_state.get(source_key, []))
    search = str(st.session_state.get(search_key, "")).strip()
    source_rows, lines = fetch(
        queries.log_page,
        instance_id,
        stages=stages,
        sources=chosen_sources,
        search=search,
        around_us=around,
        **({"limit": TAIL_ROWS, "newest_first": True} if live else {}),
    )
    sources = source_rows.to_pylist()
    if not sources:
        st.caption("No log lines.")
        return
    all_stages = sorted({r["stage"] for r in sources if r["stage"]})
    all_sources = sorted({r["source"] for r in sources if r["source"]})
    c1.multiselect("Stage", all_stages, default=[s for s in default_stages if s in all_stages], key=stage_key)
    c2.multiselect(
        "Source",
        all_sources,
        key=source_key,
        format_func=lambda s: short_source(s) or "",
        help="stdout, stderr, or a followed file (by its name; the legend below has the full path)",
    )
    c3.text_input("Search", key=search_key)
    total = lines.column("matching")[0].as_py() if lines.num_rows else 0
    where = " up to the failure" if around is not None else ""
    order = "newest first, following new lines" if live else "oldest first"
    st.caption(f"{total:,} matching lines; showing the last {lines.num_rows:,}{where} ({order}).")
    files = [s for s in all_sources if short_source(s) != s]
    if files:
        st.caption("Sources: " + " · ".join(f"{md(short_source(s))} = {md(s)}" for s in files))
    frame = lines.select(["ts", "stage", "source", "line_no", "late", "text"]).to_pandas()
    frame["source"] = [short_source(s) for s in frame["source"]]
    st.dataframe(
        frame,
        hide_index=True,
        width="stretch",
        height=table_height(len(frame), 420),
        column_config={
            "text": st.column_config.TextColumn("text", width="large"),
            "source": st.column_config.TextColumn(
                "source", width="small", help="a followed file by its name: see Sources"
            ),
            "late": st.column_config.CheckboxColumn(
                "late", help="written after the stage's command exited, by a process it left behind"
            ),
        },
    )


def body(instance_id: str) -> None:
    """Everything below the picker (rerun by itself every few seconds while `live` is on)."""
    if facts(instance_id) is None:
        return
    failure_rows = failures(instance_id)
    rejected(instance_id)
    manager_events(instance_id)
    timeline(instance_id)
    exits_and_throughput(instance_id)
    logs(instance_id, failure_rows)


def render() -> None:
    """The Instance page."""
    st.title("Instance")
    instance_id = pick_instance()
    if instance_id is None:
        return
    live = st.toggle(
        "Refresh while the materializer runs",
        value=True,
        key="instance_live",
        help=f"Re-reads the database every {REFRESH_S:.0f} s",
    )
    st.fragment(body, run_every=REFRESH_S if live else None)(instance_id)


if __name__ == "__main__":
    render()
