"""Fleet page: instances by state and GPU model, and a filterable table of every instance."""

from __future__ import annotations

import altair as alt
import streamlit as st

from flightrec.analytics import queries
from flightrec.analytics.ui import REFRESH_S, fetch, page_link_url


def _bar(table, column: str, title: str) -> alt.Chart:
    return (alt.Chart(table.to_pandas(), title=title)
            .mark_bar()
            .encode(x=alt.X("instances:Q", title="instances"),
                    y=alt.Y(f"{column}:N", sort="-x", title=None, axis=alt.Axis(labelLimit=220)),
                    tooltip=[column, "instances"])
            )


def overview() -> None:
    """Headline numbers, the two breakdowns and the instances table."""
    counts = fetch(queries.fleet_counts).to_pylist()[0]
    cols = st.columns(6)
    cols[0].metric("Instances", f"{counts['instances']:,}")
    cols[1].metric("Failed now", f"{counts['failed']:,}")
    cols[2].metric("Failures", f"{counts['failures']:,}")
    cols[3].metric("Evidence incomplete", f"{counts['incomplete']:,}")
    cols[4].metric("Benchmark passed", f"{counts['passed']:,}")
    cols[5].metric("Lost or destroyed", f"{counts['gone']:,}")

    left, right = st.columns(2)
    by_state = fetch(queries.fleet_by, "status")
    by_gpu = fetch(queries.fleet_by, "gpu_model")
    if by_state.num_rows:
        left.altair_chart(_bar(by_state, "status", "Instances by status"), width="stretch")
        right.altair_chart(_bar(by_gpu, "gpu_model", "Instances by GPU model"), width="stretch")

    options = fetch(queries.fleet_filter_options).to_pylist()[0]
    f1, f2, f3, f4 = st.columns([2, 2, 2, 1])
    states = f1.multiselect("State", options["states"] or [], key="fleet_states")
    gpus = f2.multiselect("GPU model", options["gpu_models"] or [], key="fleet_gpus")
    search = f3.text_input("Instance id contains", key="fleet_search")
    only_failed = f4.checkbox("Only with failures", key="fleet_failed")
    only_incomplete = f4.checkbox("Only incomplete evidence", key="fleet_incomplete")

    table = fetch(queries.fleet_table, states=states, gpu_models=gpus, search=search.strip(),
                  only_failed=only_failed, only_incomplete=only_incomplete)
    frame = table.to_pandas()
    frame.insert(0, "open", [page_link_url("instance", instance=i) for i in frame["instance_id"]])
    st.caption(f"{table.num_rows:,} instances match")
    st.dataframe(
        frame, hide_index=True, width="stretch", key="fleet_table",
        column_config={
            "open": st.column_config.LinkColumn("open", display_text="open", width="small"),
            "age_hours": st.column_config.NumberColumn("age (h)", format="%.1f"),
            "proofs_per_hour": st.column_config.NumberColumn("proofs/hour", format="%.1f"),
            "cost_per_proof": st.column_config.NumberColumn("$/proof", format="$%.6f"),
            "complete": st.column_config.CheckboxColumn("evidence complete"),
        })


def render() -> None:
    """The Fleet page; the overview reruns on its own every few seconds while `live` is on."""
    st.title("Fleet")
    live = st.toggle("Refresh while the materializer runs", value=True, key="fleet_live",
                     help=f"Re-reads the database every {REFRESH_S:.0f} s")
    st.fragment(overview, run_every=REFRESH_S if live else None)()


if __name__ == "__main__":
    render()
