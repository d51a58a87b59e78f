"""Cost page: what failures cost (hours and dollars paid before each), by class, GPU model and host, and what to
avoid."""

from __future__ import annotations

import altair as alt
import streamlit as st
from flightrec.analytics import cost
from flightrec.analytics.ui import fetch, page_link_url, table_height
from flightrec.db.avoid import AVOID_RATE, MIN_INSTANCES
from flightrec.db.money import AVOID_TOP

MONEY = st.column_config.NumberColumn(format="$%.2f")
RATE = st.column_config.NumberColumn("failure rate", format="percent")


def headline() -> None:
    """Paid, lost, failed, and a word when prices are missing."""
    t = fetch(cost.totals).to_pylist()[0]
    if not t["instances"]:
        st.info("No instances yet.")
        st.stop()
    c = st.columns(4)
    c[0].metric("Paid", f"${t['dollars_paid']:,.2f}")
    c[1].metric("Lost before failures", f"${t['dollars_lost']:,.2f}", help="rented (or first boot) → first failure")
    c[2].metric("Hours lost", f"{t['hours_lost']:,.1f}")
    c[3].metric("Failed instances", f"{t['failed_instances']} of {t['instances']}")
    if t["unpriced"]:
        st.caption(
            f"{t['unpriced']} instance(s) have no price: send one with `flightrec manager event --instance ID "
            "--kind rented --attr price_per_hour=1.85` or `price_per_hour` in FLIGHTREC_FACTS."
        )


def avoid_these() -> None:
    """The ranked avoid list and the expression to paste into the provider's offer search."""
    st.subheader("Avoid these")
    f = fetch(cost.offer_filter).to_pylist()[0]
    st.caption(
        "Banned: a GPU model, driver or host after one failure of a class deterministic for it (rules.toml's "
        f"`deterministic`, e.g. gpu_arch_unsupported); anything else only after {MIN_INSTANCES} or more rentals "
        f"whose failure rate is at least {AVOID_RATE:.0%} with 95 % confidence (the low end of the Wilson "
        "interval). One flaky failure bans nothing. See docs/cost.md."
    )
    if f["items"]:
        st.caption(
            "Paste into vast.ai's offer search (`vastai search offers '…'`): the banned GPU models, hosts and "
            f"drivers (the {AVOID_TOP} of each kind that lost the most)."
        )
        st.code(f["offer_filter"], language=None)
    ranked = fetch(cost.avoid)
    if not ranked.num_rows:
        st.caption("Nothing failed: nothing to avoid.")
        return
    st.dataframe(
        ranked,
        hide_index=True,
        width="stretch",
        height=table_height(ranked.num_rows, 320),
        column_config={
            "banned": st.column_config.CheckboxColumn("banned"),
            "why": st.column_config.TextColumn("why", width="large"),
            "failed_instances": st.column_config.NumberColumn("failed"),
            "rate_low": st.column_config.NumberColumn("rate ≥ (95 %)", format="percent"),
            "rate_high": st.column_config.NumberColumn("rate ≤ (95 %)", format="percent"),
            "failure_rate": RATE,
            "dollars_lost": st.column_config.NumberColumn("$ lost", format="$%.2f"),
            "in_filter": st.column_config.CheckboxColumn("in filter"),
            "offer_filter": st.column_config.TextColumn("offer filter", width="medium"),
        },
    )


def breakdowns() -> None:
    """Dollars lost by failure class, GPU model and host."""
    st.subheader("Dollars lost by failure class")
    classes = fetch(cost.by_class)
    if classes.num_rows:
        st.altair_chart(
            alt.Chart(classes.to_pandas())
            .mark_bar()
            .encode(
                x=alt.X("dollars_lost:Q", title="$ lost before the failure"),
                y=alt.Y("failure_class:N", sort="-x", title=None, axis=alt.Axis(labelLimit=260)),
                tooltip=["failure_class", "instances", "failures", alt.Tooltip("dollars_lost:Q", format="$.2f")],
            ),
            width="stretch",
        )
        st.dataframe(classes, hide_index=True, width="stretch", column_config={"dollars_lost": MONEY})
    else:
        st.caption("No failures.")
    left, right = st.columns(2)
    with left:
        st.subheader("By GPU model")
        st.dataframe(
            fetch(cost.by_gpu),
            hide_index=True,
            width="stretch",
            column_config={"failure_rate": RATE, "dollars_paid": MONEY, "dollars_lost": MONEY},
        )
    with right:
        st.subheader("By host")
        st.dataframe(
            fetch(cost.by_host),
            hide_index=True,
            width="stretch",
            column_config={"failure_rate": RATE, "dollars_paid": MONEY, "dollars_lost": MONEY},
        )


def per_failure() -> None:
    """Every failure with the hours and dollars paid before it, linked to the Failures page."""
    st.subheader("Hours paid before each failure")
    rows = fetch(cost.failures).to_pandas()
    if rows.empty:
        st.caption("No failures.")
        return
    rows.insert(0, "open", [page_link_url("failures", failure=f) for f in rows["failure_id"]])
    st.dataframe(
        rows,
        hide_index=True,
        width="stretch",
        height=table_height(len(rows), 320),
        column_config={
            "open": st.column_config.LinkColumn("open", display_text="open", width="small"),
            "price_per_hour": st.column_config.NumberColumn("$/hour", format="$%.2f"),
            "hours_before_failure": st.column_config.NumberColumn("hours paid", format="%.2f"),
            "dollars_before_failure": st.column_config.NumberColumn("$ paid", format="$%.2f"),
        },
    )


def render() -> None:
    """The Cost page."""
    st.title("Cost")
    st.caption(
        "All time: the sidebar's time range does not apply here (an instance's cost runs over its whole "
        "rental). See docs/cost.md for how each figure is computed."
    )
    headline()
    avoid_these()
    breakdowns()
    per_failure()


if __name__ == "__main__":
    render()
