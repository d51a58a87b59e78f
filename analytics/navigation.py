"""The dashboard's page list and frame: page config, navigation, the database in the sidebar."""

from __future__ import annotations

from pathlib import Path

import streamlit as st
from flightrec.analytics.ui import db_path, disk_full_notice, freshness_caption, time_range_picker
from flightrec.db.lake import mask_password

# The page scripts sit next to this module. Not in a `pages/` folder: Streamlit treats
# one beside the entry script as a v1 multipage app and then never runs the entry script.
PAGES_DIR = Path(__file__).parent

# (file, title, icon, url path) in the order the sidebar shows them.
PAGES: tuple[tuple[str, str, str, str], ...] = (
    ("page_fleet.py", "Fleet", ":material/dns:", "fleet"),
    ("page_instance.py", "Instance", ":material/memory:", "instance"),
    ("page_failures.py", "Failures", ":material/error:", "failures"),
    ("page_kinds.py", "Failure kinds", ":material/category:", "kinds"),
    ("page_throughput.py", "Throughput", ":material/speed:", "throughput"),
    ("page_cost.py", "Cost", ":material/payments:", "cost"),
    ("page_sql.py", "SQL", ":material/terminal:", "sql"),
)


def main() -> None:
    """Run the app: configure the page, register the pages, run the selected one."""
    st.set_page_config(page_title="flightrec", page_icon=":material/flight:", layout="wide")
    # The first page is the default one, served at "/" (Streamlit gives it no path of its own).
    pages = [
        st.Page(PAGES_DIR / f, title=t, icon=i, default=True)
        if n == 0
        else st.Page(PAGES_DIR / f, title=t, icon=i, url_path=u)
        for n, (f, t, i, u) in enumerate(PAGES)
    ]
    nav = st.navigation(pages)
    time_range_picker()
    st.sidebar.caption(f"Database: `{mask_password(db_path())}`")
    st.sidebar.caption("Times are UTC.")
    disk_full_notice(db_path())
    freshness_caption()
    nav.run()
