"""SQL page: a read-only console over the views and tables, with examples and CSV download."""

from __future__ import annotations

import streamlit as st
from flightrec.analytics import queries
from flightrec.analytics.ui import db_path, fetch

from flightrec.errors import FlightrecError


def run_console(sql: str) -> None:
    """Run the statement (read-only, no file access) and show the rows and a CSV download."""
    try:
        table, cut = queries.console(db_path(), sql)
    except FlightrecError as exc:
        st.error(f"Query refused or failed: {exc}")
        return
    note = f" (first {table.num_rows:,} shown; add a LIMIT or aggregate)" if cut else ""
    st.caption(f"{table.num_rows:,} rows{note}")
    frame = table.to_pandas()
    st.dataframe(frame, hide_index=True, width="stretch")
    st.download_button(
        "Download CSV",
        frame.to_csv(index=False).encode(),
        file_name="flightrec-query.csv",
        mime="text/csv",
        key="sql_csv",
    )


def render() -> None:
    """The SQL page."""
    st.title("SQL")
    st.caption(
        "Read-only: one SELECT (or EXPLAIN of one) at a time over the views and tables below; "
        "statements that write, change settings, attach or read files are refused with the reason. "
        'The same views work in `flightrec sql --db PATH "..."`.'
    )
    names = list(queries.EXAMPLES)
    example = st.selectbox("Example", names, key="sql_example")
    sql = st.text_area("Query", value=queries.EXAMPLES[example], height=160, key=f"sql_text_{example}")
    st.button("Run", type="primary", key="sql_run", help="Runs the query (so does Ctrl+Enter in the box)")
    if sql.strip():
        run_console(sql)
    with st.expander("Views and tables"):
        st.dataframe(fetch(queries.catalog), hide_index=True, width="stretch")


if __name__ == "__main__":
    render()
