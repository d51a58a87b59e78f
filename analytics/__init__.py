"""The Streamlit dashboard and the SQL views and queries it shares with `flightrec sql`."""

from __future__ import annotations

from pathlib import Path

# The script `streamlit run` is given; `flightrec dashboard` starts it.
ENTRY_SCRIPT: Path = Path(__file__).with_name("app.py")
