"""SQL views shared by the Streamlit app and `flightrec sql` (run as a trusted prelude)."""

from __future__ import annotations

# Each entry is one `CREATE OR REPLACE TEMP VIEW ...` statement over the tables of
# consumers/schema.sql. `flightrec sql` and the app pass them to
# flightrec.query.run_query(prelude=VIEWS), so both speak the same names.
VIEWS: tuple[str, ...] = ()
