"""Throughput page: proofs/hour by GPU model against the minimum rate, per instance, over time, cost per proof."""

from __future__ import annotations

import altair as alt
import pandas as pd
import streamlit as st
from flightrec.analytics import queries
from flightrec.analytics.ui import bucket_unit, fetch, page_link_url, rows_height, since_us, table_height

MAX_POINTS = 5000  # instances drawn in the distribution chart (all are in the table)


def by_gpu(gpus: list[str], since: int | None) -> pd.DataFrame:
    """The per-model summary and the distribution of each instance's latest rate against the minimum."""
    summary = fetch(queries.gpu_throughput)
    if not summary.num_rows:
        st.info("No throughput measured yet: the benchmark stage emits it.")
        st.stop()
    st.subheader("By GPU model")
    st.dataframe(
        summary,
        hide_index=True,
        width="stretch",
        column_config={
            "median_cost_per_proof": st.column_config.NumberColumn("median $/proof", format="$%.6f"),
            "median_price_per_hour": st.column_config.NumberColumn("median $/hour", format="$%.2f"),
        },
    )
    rates = fetch(queries.instance_rates, gpu_models=gpus, since_us=since)
    frame = rates.to_pandas()
    if frame.empty:
        st.info("No instance measured in this time range (sidebar) for these GPU models: widen it.")
        return frame
    points = frame.sample(MAX_POINTS, random_state=0) if len(frame) > MAX_POINTS else frame
    dots = (
        alt.Chart(points)
        .mark_tick(thickness=2)
        .encode(
            x=alt.X("proofs_per_hour:Q", title="proofs/hour (latest per instance)"),
            y=alt.Y("gpu_model:N", title=None, axis=alt.Axis(labelLimit=0, labelOverlap=False)),
            color=alt.Color(
                "meets_min_rate:N",
                title="meets minimum",
                scale=alt.Scale(domain=[True, False], range=["#2e7d32", "#c62828"]),
            ),
            tooltip=["instance_id", "gpu_model", "proofs_per_hour", "min_rate", "cost_per_proof"],
        )
    )
    floor = (
        alt.Chart(points.dropna(subset=["min_rate"]).groupby("gpu_model", as_index=False)["min_rate"].max())
        .mark_tick(color="black", thickness=3, size=30)
        .encode(x="min_rate:Q", y="gpu_model:N", tooltip=["gpu_model", "min_rate"])
    )
    n_models = points["gpu_model"].nunique()
    st.altair_chart(
        alt.layer(dots, floor).properties(
            title="Distribution against the minimum rate (black)", height=rows_height(n_models, 40)
        ),
        width="stretch",
        height=rows_height(n_models, 40),
    )
    return frame


def per_instance(frame: pd.DataFrame) -> None:
    """Every instance's latest rate and cost per proof."""
    st.subheader("Per instance")
    frame = frame.copy()
    frame.insert(0, "open", [page_link_url("instance", instance=i) for i in frame["instance_id"]])
    st.dataframe(
        frame,
        hide_index=True,
        width="stretch",
        height=table_height(len(frame), 320),
        column_config={
            "open": st.column_config.LinkColumn("open", display_text="open", width="small"),
            "proofs_per_hour": st.column_config.NumberColumn("proofs/hour", format="%.1f"),
            "price_per_hour": st.column_config.NumberColumn("$/hour", format="$%.2f"),
            "cost_per_proof": st.column_config.NumberColumn("$/proof", format="$%.6f"),
        },
    )


def over_time(gpus: list[str], since: int | None) -> None:
    """Median measured proofs/hour per GPU model and minute, hour or day (whichever says something)."""
    st.subheader("Over time")
    span = fetch(queries.throughput_span, gpu_models=gpus, since_us=since).to_pylist()[0]
    unit = bucket_unit(span["first_us"], span["last_us"])
    series = fetch(queries.throughput_over_time, gpu_models=gpus, since_us=since, unit=unit)
    if not series.num_rows:
        st.caption("No measured samples in this time range.")
        return
    fmt = "%H:%M" if unit == "minute" else "%m-%d %H:%M" if unit == "hour" else "%Y-%m-%d"
    st.altair_chart(
        alt.Chart(series.to_pandas(), title=f"Median proofs/hour per {unit}")
        .mark_line(point=True)
        .encode(
            x=alt.X("bucket:T", title=f"{unit} (UTC)", axis=alt.Axis(format=fmt, labelAngle=0)),
            y=alt.Y("proofs_per_hour:Q", title="median proofs/hour"),
            color="gpu_model:N",
            tooltip=["bucket", "gpu_model", "proofs_per_hour", "samples"],
        ),
        width="stretch",
    )


def render() -> None:
    """The Throughput page."""
    st.title("Throughput")
    options = fetch(queries.fleet_filter_options).to_pylist()[0]
    gpus = st.multiselect("GPU model", options["gpu_models"] or [], key="throughput_gpus")
    since = since_us()
    frame = by_gpu(gpus, since)
    if not frame.empty:
        per_instance(frame)
    over_time(gpus, since)


if __name__ == "__main__":
    render()
