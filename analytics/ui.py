"""Helpers every dashboard page shares: the database path, cached queries, errors, links."""

from __future__ import annotations

import importlib
import logging
import os
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import quote

import streamlit as st
from flightrec.db.lake import mask_password

from flightrec.errors import FlightrecError
from flightrec.settings import Settings

log = logging.getLogger(__name__)

# The pages' refresh period (while `live` is on); a query result is reused for less than that, so each refresh
# reads what was committed since the one before (a new failure shows within one period).
REFRESH_S = 5.0
CACHE_S = REFRESH_S - 1.0

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


@st.cache_data(ttl=CACHE_S, show_spinner=False, max_entries=512)
def _cached(module: str, name: str, db: str, args: tuple[Any, ...], kwargs: tuple[tuple[str, Any], ...]) -> Any:
    fn: Callable[..., Any] = getattr(importlib.import_module(module), name)
    return fn(db, *args, **dict(kwargs))


def fetch(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Run a query function (of analytics.queries or analytics.cost: ``fn(db, ...)``) against the app's database;
    results are reused for a few seconds.

    A FlightrecError (no database, the materializer unreachable, a refused query)
    is shown on the page with what to do, and the page stops there.
    """
    db = db_path()
    try:
        return _cached(
            fn.__module__,
            fn.__name__,
            db,
            tuple(_freeze(a) for a in args),
            tuple(sorted((k, _freeze(v)) for k, v in kwargs.items())),
        )
    except FlightrecError as exc:
        log.warning("dashboard query %s failed: %s", fn.__name__, exc)
        st.error(f"Cannot read {mask_password(db)}: {exc}")
        st.stop()


def disk_full_notice(db: str) -> None:
    """A banner while the materializer of a database file waits for disk space (its marker, db/markers.py)."""
    from flightrec.db.markers import disk_full_path

    if db.startswith("ducklake:"):
        return
    try:
        since = disk_full_path(db).stat().st_mtime
    except OSError:
        return
    st.error(
        f"The materializer's disk is full since {time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(since))} UTC: it "
        "holds its last batch and takes no more, so what you see stops there. Nothing is lost (Kafka keeps the "
        "rest); free space and it goes on by itself (docs/retention.md)."
    )


def freshness_caption() -> None:
    """The sidebar's line saying how fresh every page's data is (nothing when the database cannot be read: the page
    says why)."""
    try:
        line = _cached("flightrec.analytics.queries", "data_freshness", db_path(), (), ())
    except FlightrecError:
        return
    if line:
        st.sidebar.caption(f"Data {line}.")


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


ROW_PX = 35  # a dataframe row (and its header) in pixels
FIT_ROWS = 25  # tables show this many rows without a scrollbar


def table_height(rows: int, cap: int = ROW_PX * (FIT_ROWS + 1) + 3) -> int:
    """Pixels for a dataframe of ``rows`` rows: no empty rows below short tables, a scrollbar past ``cap``."""
    return min(cap, ROW_PX * (rows + 1) + 3)


def rows_height(rows: int, per_row: int = 30) -> int:
    """Pixels for a chart with ``rows`` labelled rows (bars, stages, GPU models): every label has room."""
    return max(180, 90 + per_row * rows)


def fmt_money(value: float | None, digits: int = 4) -> str:
    """A price or cost in dollars, or a dash."""
    return "—" if value is None else f"${value:,.{digits}f}"


def fmt_num(value: float | None, digits: int = 1) -> str:
    """A number with thousands separators, or a dash."""
    return "—" if value is None else f"{value:,.{digits}f}"


# ---- text from the database inside Markdown ------------------------------------------


def fmt_offset(seconds: float | None) -> str:
    """A clock offset in words: '1 h 0 min ahead', '42.0 s behind', '0.3 s ahead', '55 y behind'; '—' when unknown."""
    if seconds is None:
        return "—"
    side = "ahead" if seconds >= 0 else "behind"
    s = abs(float(seconds))
    if s < 120:
        amount = f"{s:.1f} s"
    elif s < 3600:
        amount = f"{int(s // 60)} min {int(s % 60)} s"
    elif s < 172800:
        amount = f"{int(s // 3600)} h {int(s % 3600 // 60)} min"
    elif s < 2 * 365 * 86400:
        amount = f"{int(s // 86400)} d"
    else:
        amount = f"{int(s // (365.25 * 86400))} y"
    return f"{amount} {side}"


HINT_CHARS = 1000  # a failure class's hint (from the rule table) is prose of its own: longer
MAX_PROSE = 300  # characters of one database value in a banner or caption (the log viewers show it whole)
# Signs that change Markdown inline (`$…$` is LaTeX in Streamlit; `[` also starts `:red[…]`);
# `_` only where it can start or end an emphasis (not inside gpu_arch_unsupported).
_MD_SIGNS = re.compile(r"([\\`*\[\]$<>~|])|(?<![A-Za-z0-9])_|_(?![A-Za-z0-9])")
_MD_LEAD = re.compile(r"^([#+\-=](?=\s|$)|>|\d+(?=[.)](?:\s|$)))")  # a heading, list or quote


def md(text: Any, limit: int = MAX_PROSE) -> str:
    """A database value shown literally in Markdown: one line, signs escaped, cut to ``limit`` characters."""
    if text is None:
        return ""
    one = " ".join(str(text).split())
    more = len(one) - limit
    if more > 0:
        one = one[:limit]
    out = _MD_SIGNS.sub(lambda m: "\\" + m.group(0), one)
    out = _MD_LEAD.sub(lambda m: m.group(0) + "\\" if m.group(0)[0].isdigit() else "\\" + m.group(0), out)
    return out + (f"… ({more:,} more characters)" if more > 0 else "")


def md_code_block(text: str | None, limit: int = MAX_PROSE) -> str:
    """A database value as a fenced code block inside Markdown (a banner): cut to ``limit`` characters."""
    one = " ".join(str(text or "").split())
    more = len(one) - limit
    fence = "~~~" if "```" in one else "```"
    cut = f"{one[:limit]}" if more > 0 else one
    return f"{fence}\n{cut}\n{fence}" + (f"\n\n… ({more:,} more characters)" if more > 0 else "")


def md_money(value: float | None, digits: int = 4) -> str:
    """fmt_money for Markdown: the dollar sign escaped (two of them would make a formula)."""
    return fmt_money(value, digits).replace("$", "\\$")


# ---- the time range every page shares -------------------------------------------------

TIME_RANGE_KEY = "time_range"
TIME_RANGES: dict[str, float | None] = {
    "Last 15 min": 15 * 60,
    "Last 1 h": 3600,
    "Last 6 h": 6 * 3600,
    "Last 24 h": 24 * 3600,
    "All time": None,
}
DEFAULT_TIME_RANGE = "All time"


def time_range_picker() -> None:
    """The sidebar's time range (kept in st.session_state, so every page reads the same one)."""
    labels = list(TIME_RANGES)
    current = st.session_state.get(TIME_RANGE_KEY, DEFAULT_TIME_RANGE)
    st.sidebar.selectbox(
        "Time range",
        labels,
        index=labels.index(current) if current in labels else len(labels) - 1,
        key=TIME_RANGE_KEY,
        help="What every page shows: instances active, failures and samples within this range",
    )


def since_us(now_s: float | None = None) -> int | None:
    """The start of the chosen time range in µs since the epoch, or None for all time."""
    seconds = TIME_RANGES.get(st.session_state.get(TIME_RANGE_KEY, DEFAULT_TIME_RANGE))
    if seconds is None:
        return None
    return int(((time.time() if now_s is None else now_s) - seconds) * 1e6)


def bucket_unit(first_us: int | None, last_us: int | None) -> str:
    """The time bucket that says something for a span: minutes within 3 h, hours within 3 days, else days."""
    if first_us is None or last_us is None:
        return "hour"
    span_s = (last_us - first_us) / 1e6
    return "minute" if span_s <= 3 * 3600 else "hour" if span_s <= 3 * 86400 else "day"


# ---- small pure helpers of the pages ---------------------------------------------------


def short_source(source: str | None) -> str | None:
    """A log source as the grid shows it: stdout/stderr as they are, a followed file by its base name."""
    if not source or source in ("stdout", "stderr"):
        return source
    return PurePosixPath(source).name or source


CONTEXT_LINES = 10  # lines kept on each side of the decisive line when a tail is collapsed
MARK = "▶ "


TAIL_LINE_CHARS = 1000  # a tail's block cuts each line here (its "All N lines" expander shows it whole)


def cut_line(line: str, limit: int = TAIL_LINE_CHARS) -> str:
    """One log line as a tail block shows it: cut at ``limit`` characters, saying how many more there are."""
    more = len(line) - limit
    return line if more <= 0 else f"{line[:limit]}… ({more:,} more characters)"


def collapse(lines: list[str], at: int | None, context: int = CONTEXT_LINES) -> tuple[list[str], bool]:
    """A tail as shown: its line number ``at`` (the decisive line) marked with ▶, and only ``context`` lines
    around it when longer.

    Returns (lines to show, whether lines were left out).
    """
    if at is None or not 0 <= at < len(lines):
        return list(lines), False
    shown = [MARK + line if n == at else line for n, line in enumerate(lines)]
    if len(lines) <= 2 * context + 1:
        return shown, False
    lo = max(0, min(at - context, len(lines) - 2 * context - 1))
    return shown[lo : lo + 2 * context + 1], True
