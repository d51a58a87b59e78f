"""The Streamlit dashboard: its pages and the queries they run over the database's views (flightrec.db)."""

from __future__ import annotations

from pathlib import Path

# The script `streamlit run` is given; `flightrec dashboard` starts it.
ENTRY_SCRIPT: Path = Path(__file__).with_name("app.py")
