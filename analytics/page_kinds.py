"""Failure kinds page: failures grouped by kind (db/kinds.py, the failure_kinds view), new and regressed first, then
by the money lost to them; each kind opens its failures and their decisive lines."""

from __future__ import annotations

from typing import Any

import streamlit as st
from flightrec.analytics import queries
from flightrec.analytics.ui import (
    REFRESH_S,
    cut_line,
    fetch,
    md,
    md_money,
    page_link_url,
    query_param,
    remember_in_url,
    since_us,
    table_height,
)

STATUS_HELP = (
    "new: first seen within the last 24 h · regressed: seen again after 7 quiet days · ongoing: neither · "
    "explained: a rule of rules.toml covers it (its class)"
)
MONEY_HELP = (
    "Each failed instance's cost from its rental to its first failure, under that failure's kind (as the Cost page "
    "counts it under its class): a dollar counts once. Blank: no instance that lost money to the kind has a price."
)


def money(row: dict[str, Any]) -> str:
    """A kind's lost money in words: the sum, 'unknown' when no instance had a price, 'at least' when some had none."""
    if row["dollars_lost"] is None:
        return f"unknown ({row['unpriced']} instance(s) without a price)"
    if row["unpriced"]:
        return f"at least {md_money(row['dollars_lost'], 2)} ({row['unpriced']} instance(s) without a price)"
    return md_money(row["dollars_lost"], 2)


def when(at: Any) -> str:
    """A time as the page writes it; '?' for none (a failure whose own clock was far off: db/views.py's sane_us)."""
    return f"{at:%Y-%m-%d %H:%M:%S}" if at is not None else "?"


def headline(rows: list[dict[str, Any]]) -> None:
    """How many kinds, by status."""
    counts = {s: sum(1 for r in rows if r["status"] == s) for s in ("new", "regressed", "ongoing", "explained")}
    cols = st.columns(5)
    cols[0].metric("Kinds", f"{len(rows):,}")
    for col, (status, n) in zip(cols[1:], counts.items(), strict=True):
        col.metric(status.capitalize(), f"{n:,}", help=STATUS_HELP)


def listing(table: Any) -> None:
    """Every kind as a table row, with a link that opens it."""
    frame = table.to_pandas()
    frame.insert(0, "open", [page_link_url("kinds", kind=k) for k in frame["kind"]])
    st.dataframe(
        frame.drop(columns=["example_failure_ids", "first_us", "last_us", "first_failures"]),
        hide_index=True,
        width="stretch",
        height=table_height(len(frame), 420),
        placeholder="—",
        column_config={
            "open": st.column_config.LinkColumn("open", display_text="open", width="small"),
            "status": st.column_config.TextColumn("status", help=STATUS_HELP),
            "dollars_lost": st.column_config.NumberColumn("$ lost", format="$%.2f", help=MONEY_HELP),
            "hours_lost": st.column_config.NumberColumn("hours lost", format="%.1f"),
            "unpriced": st.column_config.NumberColumn("unpriced", help="instances of the kind without a price"),
            "template": st.column_config.TextColumn("template", width="large"),
            "failure_class": st.column_config.TextColumn("class"),
        },
    )


def kind_label(row: dict[str, Any]) -> str:
    """How a kind reads in the picker: its id, status, count and the start of its template."""
    return f"{row['kind']} · {row['status']} · {row['failures']} failure(s) · {(row['template'] or '')[:80]}"


def pick(rows: list[dict[str, Any]]) -> str | None:
    """The kind to open: the URL's ``kind``, else the first listed (a kind linked from outside the list is kept)."""
    wanted = query_param("kind")
    labels = {r["kind"]: kind_label(r) for r in rows}
    ids = list(labels)
    if wanted and wanted not in labels:
        ids.insert(0, wanted)
    if not ids:
        return None
    key = f"kind_pick_{wanted}"
    return st.selectbox(
        "Kind",
        ids,
        index=ids.index(wanted) if wanted in ids else 0,
        format_func=lambda k: labels.get(k, k),
        key=key,
        on_change=remember_in_url,
        args=("kind", key),
    )


def kind_detail(row: dict[str, Any] | None, kind: str) -> None:
    """One kind: its template, counts and money, then its failures, each with its decisive line and links."""
    if row is None:
        st.warning(f"No failure kind {md(kind)} in this time range (sidebar), or none at all.")
        return
    st.subheader(f"Kind {md(kind)} · {md(row['status'])}")
    st.code(cut_line(row["template"] or "(no decisive line)"), language=None, wrap_lines=True)
    gpus = ", ".join(md(g) for g in row["gpu_models"] or []) or "unknown"
    st.caption(
        f"{row['failures']:,} failure(s) on {row['instances']:,} instance(s) and {row['hosts']:,} host(s) · "
        f"first seen {when(row['first_seen'])} · last seen {when(row['last_seen'])} UTC · "
        f"GPU models: {gpus} · class {md(row['failure_class'] or 'unknown')} · lost: {money(row)}"
    )
    failures(kind)


def failures(kind: str) -> None:
    """The kind's failures, the latest first: when, where, the decisive line, links to the Failures and Instance
    pages."""
    table = fetch(queries.kind_failures, kind)
    if not table.num_rows:
        st.caption("No failures of this kind.")
        return
    frame = table.to_pandas()
    frame.insert(0, "open", [page_link_url("failures", failure=f) for f in frame["failure_id"]])
    frame.insert(1, "instance", [page_link_url("instance", instance=i) for i in frame["instance_id"]])
    frame["decisive_line"] = [cut_line(line) if line else "" for line in frame["decisive_line"]]
    st.markdown("**Its failures and their decisive lines** (the latest first)")
    st.dataframe(
        frame.drop(columns=["failure_id", "more"]),
        hide_index=True,
        width="stretch",
        height=table_height(len(frame), 420),
        placeholder="—",
        column_config={
            "open": st.column_config.LinkColumn("failure", display_text="open", width="small"),
            "instance": st.column_config.LinkColumn("instance", display_text="open", width="small"),
            "failed_at": st.column_config.DatetimeColumn("failed at (UTC)", format="YYYY-MM-DD HH:mm:ss"),
            "decisive_line": st.column_config.TextColumn("decisive line", width="large"),
        },
    )
    more = int(frame["more"].iloc[0])
    if more > 0:
        st.caption(f"{more:,} older failure(s) of this kind not listed: `flightrec kinds` and the SQL page have all.")


def body() -> None:
    """The headline, the kinds and the chosen one (rerun by itself every few seconds while `live` is on)."""
    table = fetch(queries.failure_kinds, since_us=since_us())
    rows = table.to_pylist()
    headline(rows)
    if not rows and not query_param("kind"):
        st.info("No failure kinds in this time range: no failures, or none folded since failures.kind was added.")
        return
    listing(table)
    chosen = pick(rows)
    if chosen:
        kind_detail(next((r for r in rows if r["kind"] == chosen), None), chosen)


def render() -> None:
    """The Failure kinds page."""
    st.title("Failure kinds")
    st.caption(
        "Failures grouped by kind: the stage, how it ended and the shape of its decisive line (numbers, paths, ids "
        "and the like as placeholders). New and regressed kinds first, then those that lost the most money. "
        "`flightrec kinds` prints the same."
    )
    live = st.toggle(
        "Refresh while the materializer runs",
        value=True,
        key="kinds_live",
        help=f"Re-reads the database every {REFRESH_S:.0f} s",
    )
    st.fragment(body, run_every=REFRESH_S if live else None)()


if __name__ == "__main__":
    render()
