"""Fleet page: instances by state and GPU model, and a filterable table of every instance."""

from __future__ import annotations

from typing import Any

import altair as alt
import pyarrow as pa
import streamlit as st
from flightrec.analytics import queries
from flightrec.analytics.ui import REFRESH_S, fetch, md, rows_height, since_us, table_height

SILENT_SHOWN = 10  # ids named in the "known only from the manager" note
COUNT_AXIS: dict[str, Any] = {"tickMinStep": 1, "format": "d"}  # counts of instances: whole numbers on the axis


def _bar(table, column: str, title: str) -> alt.Chart:
    frame = table.to_pandas()
    return (
        alt.Chart(frame, title=title)
        .mark_bar()
        .encode(
            x=alt.X("instances:Q", title="instances", axis=alt.Axis(**COUNT_AXIS)),
            y=alt.Y(f"{column}:N", sort="-x", title=None, axis=alt.Axis(labelLimit=0, labelOverlap=False)),
            tooltip=[column, "instances"],
        )
        .properties(height=rows_height(len(frame)))
    )


def attention(since: int | None) -> None:
    """The few instances that need a look, each with links to its failure and its instance page."""
    rows = fetch(queries.fleet_attention, since_us=since).to_pylist()
    if not rows:
        return
    st.markdown(
        "**Needs attention** (most recent first): every instance failed, below the minimum rate, lost, or "
        "destroyed with its evidence incomplete"
    )
    for r in rows:
        c1, c2, c3 = st.columns([5, 1, 1])
        c1.markdown(f"`{r['status']}` **{md(r['instance_id'])}** · {md(r['failure_class'])} · {md(r['status_detail'])}")
        if r["failure_id"]:
            c2.page_link(
                "page_failures.py", label="failure", icon=":material/error:", query_params={"failure": r["failure_id"]}
            )
        c3.page_link(
            "page_instance.py", label="instance", icon=":material/memory:", query_params={"instance": r["instance_id"]}
        )
    if rows[-1]["more"] > 0:
        st.warning(
            f"{rows[-1]['more']:,} more need attention, not listed here: filter the instances table below by status."
        )


def trust() -> None:
    """Events refused in an instance's name (forged, revoked, untagged), and which instances are unauthenticated."""
    rows = fetch(queries.instance_trust).to_pylist()
    refused = [r for r in rows if r["refused_events"]]
    if refused:
        total = sum(r["refused_events"] for r in refused)
        named = "; ".join(
            f"{md(r['instance_id'])}: {r['refused_events']:,} ({md(r['last_refusal'])})" for r in refused[:SILENT_SHOWN]
        )
        st.error(
            f"{total:,} event(s) refused as forged, revoked or unauthenticated, claiming {len(refused):,} "
            f"instance(s): {named}. They changed nothing; each is in `dead_letters` (docs/security.md)."
        )
    heard = [r for r in rows if r["heard"]]
    open_ = [r["instance_id"] for r in heard if not r["authenticated"]]
    if open_ and len(open_) < len(heard):
        st.warning(
            f"{len(open_):,} instance(s) unauthenticated (their events carry no tag, so anyone with the agent's "
            f"Kafka login could have written them): {', '.join(md(i) for i in open_[:SILENT_SHOWN])}"
        )
    elif open_:
        st.caption("Unauthenticated fleet: no instance tags its events (enroll them: docs/security.md).")


def silent(since: int | None) -> None:
    """Instances the manager rented whose agent never spoke: paid for, and in no other table."""
    rows = fetch(queries.manager_only_instances, since_us=since).to_pylist()
    if rows:
        shown = ", ".join(md(r["instance_id"]) for r in rows[:SILENT_SHOWN])
        more = f" and {len(rows) - SILENT_SHOWN:,} more" if len(rows) > SILENT_SHOWN else ""
        st.info(
            f"{len(rows):,} instance(s) known only from the manager's events (rented, no event from their "
            f"agent yet): {shown}{more}. Open one on the Instance page with its id."
        )


def new_kinds(col: Any) -> None:
    """The headline's count of new failure kinds (first seen within 24 h, whatever the time range), linked to the
    Failure kinds page."""
    n = fetch(queries.new_kinds)
    col.metric(
        "New failure kinds (24 h)",
        "—" if n is None else f"{n:,}",
        help="kinds of failure first seen in the last 24 h that no rule explains: the Failure kinds page lists them",
    )
    if n:
        col.page_link("page_kinds.py", label="open", icon=":material/category:")


def overview() -> None:
    """Headline numbers, the two breakdowns and the instances table."""
    since = since_us()
    counts = fetch(queries.fleet_summary, since_us=since).to_pylist()[0]
    cols = st.columns(7)
    cols[0].metric("Instances", f"{counts['instances']:,}")
    cols[1].metric("Failed now", f"{counts['failed']:,}")
    cols[2].metric("Failures", f"{counts['failures']:,}")
    cols[3].metric("Evidence incomplete", f"{counts['incomplete']:,}")
    cols[4].metric("Benchmark passed", f"{counts['passed']:,}")
    cols[5].metric("Lost or destroyed", f"{counts['gone']:,}")
    new_kinds(cols[6])
    silent(since)
    trust()
    if not counts["instances"]:
        if since is not None and fetch(queries.instance_ids):
            st.info("No instances heard from in this time range (sidebar): widen it to see older ones.")
        else:
            st.info(
                "No instances yet: run `flightrec materialize` against the broker the agents publish to "
                "(`flightrec agent run …` on each instance), or try `flightrec demo`."
            )
        return

    left, right = st.columns(2)
    by_state = pa.Table.from_pylist(counts["by_status"])
    by_gpu = pa.Table.from_pylist(counts["by_gpu_model"])
    if by_state.num_rows:
        tall = rows_height(max(by_state.num_rows, by_gpu.num_rows))  # side by side: one height
        left.altair_chart(_bar(by_state, "status", "Instances by status"), width="stretch", height=tall)
        right.altair_chart(_bar(by_gpu, "gpu_model", "Instances by GPU model"), width="stretch", height=tall)

    attention(since)

    f1, f2, f3, f4 = st.columns([2, 2, 2, 2])
    statuses = f1.multiselect("Status", counts["statuses"] or [], key="fleet_status")
    gpus = f2.multiselect("GPU model", counts["gpu_models"] or [], key="fleet_gpus")
    search = f3.text_input("Instance id contains", key="fleet_search")
    only_failed = f4.checkbox("Only with failures", key="fleet_failed")
    only_incomplete = f4.checkbox("Only incomplete evidence", key="fleet_incomplete")

    table = fetch(
        queries.fleet_table,
        statuses=statuses,
        gpu_models=gpus,
        search=search.strip(),
        only_failed=only_failed,
        only_incomplete=only_incomplete,
        since_us=since,
    )
    frame = table.to_pandas()
    st.caption(f"{table.num_rows:,} instances match · select a cell and copy it (Ctrl+C) to copy an id")
    st.dataframe(
        frame,
        hide_index=True,
        width="stretch",
        key="fleet_table",
        height=table_height(len(frame)),
        placeholder="—",
        column_config={
            "status": st.column_config.TextColumn(
                "status",
                width="medium",
                pinned=True,
                help="running / healthy / failed / below_min_rate / lost / destroyed / finished / idle",
            ),
            "instance_id": st.column_config.TextColumn("instance_id", width="large", pinned=True),
            "failure_class": st.column_config.TextColumn("failure class", width="medium"),
            "failure": st.column_config.LinkColumn(
                "failure", display_text="open", width="small", help="the instance's latest failure on the Failures page"
            ),
            "instance": st.column_config.LinkColumn(
                "instance", display_text="open", width="small", help="the Instance page: stages, exits, logs"
            ),
            "status_detail": st.column_config.TextColumn("status detail", width="medium"),
            "age_hours": st.column_config.NumberColumn("age (h)", format="%.1f"),
            "proofs_per_hour": st.column_config.NumberColumn("proofs/hour", format="%.1f"),
            "cost_per_proof": st.column_config.NumberColumn("$/proof", format="$%.6f"),
            "complete": st.column_config.CheckboxColumn("evidence complete"),
        },
    )


def render() -> None:
    """The Fleet page; the overview reruns on its own every few seconds while `live` is on."""
    st.title("Fleet")
    live = st.toggle(
        "Refresh while the materializer runs",
        value=True,
        key="fleet_live",
        help=f"Re-reads the database every {REFRESH_S:.0f} s",
    )
    st.fragment(overview, run_every=REFRESH_S if live else None)()


if __name__ == "__main__":
    render()
