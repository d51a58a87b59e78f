"""Helpers every dashboard page shares: the database path, cached queries, errors, links."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import Any, Callable
from urllib.parse import quote

import streamlit as st

from flightrec.analytics import queries
from flightrec.errors import FlightrecError
from flightrec.lake import mask_password
from flightrec.settings import Settings

log = logging.getLogger(__name__)

# Seconds a query result is reused; also the Fleet page's refresh period.
REFRESH_S = 5.0

# Where `flightrec dashboard` passes the database (also read from `-- --db PATH`).
DB_ENV = "FLIGHTREC_DB"


def db_path() -> str:
    """The database this app reads: `--db` after `--` on the streamlit command line, else FLIGHTREC_DB."""
    argv = sys.argv[1:] if sys.argv and Path(sys.argv[0]).name == "app.py" else []
    for i, arg in enumerate(argv):
        if arg == "--db" and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("--db="):
            return arg.split("=", 1)[1]
    return os.environ.get(DB_ENV) or Settings.from_env().db


@st.cache_data(ttl=REFRESH_S, show_spinner=False, max_entries=512)
def _cached(name: str, db: str, args: tuple[Any, ...], kwargs: tuple[tuple[str, Any], ...]) -> Any:
    fn: Callable[..., Any] = getattr(queries, name)
    return fn(db, *args, **dict(kwargs))


def fetch(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Run a function of analytics.queries against the app's database (results reused for a few seconds).

    A FlightrecError (no database, the materializer unreachable, a refused query)
    is shown on the page with what to do, and the page stops there.
    """
    db = db_path()
    try:
        return _cached(fn.__name__, db, tuple(_freeze(a) for a in args),
                       tuple(sorted((k, _freeze(v)) for k, v in kwargs.items())))
    except FlightrecError as exc:
        log.warning("dashboard query %s failed: %s", fn.__name__, exc)
        st.error(f"Cannot read {mask_password(db)}: {exc}")
        st.stop()


def _freeze(value: Any) -> Any:
    if isinstance(value, (list, set)):
        return tuple(value)
    return value


def page_link_url(page: str, **params: str) -> str:
    """A relative URL to one of the app's pages with query parameters, for link columns."""
    query = "&".join(f"{k}={quote(str(v), safe='')}" for k, v in params.items())
    return f"{page}?{query}" if query else page


def query_param(name: str) -> str | None:
    """One query parameter of the page's URL, or None."""
    value = st.query_params.get(name)
    return str(value) if value else None


def remember_in_url(param: str, widget_key: str) -> None:
    """A widget callback: put the widget's new value in the URL, so the view can be linked and reloaded."""
    st.query_params[param] = str(st.session_state[widget_key])


def table_height(rows: int, cap: int = 420) -> int:
    """Pixels for a dataframe of ``rows`` rows: no empty rows below short tables, a scrollbar past ``cap``."""
    return min(cap, 35 * (rows + 1) + 3)


def fmt_money(value: float | None, digits: int = 4) -> str:
    """A price or cost in dollars, or a dash."""
    return "—" if value is None else f"${value:,.{digits}f}"


def fmt_num(value: float | None, digits: int = 1) -> str:
    """A number with thousands separators, or a dash."""
    return "—" if value is None else f"{value:,.{digits}f}"
