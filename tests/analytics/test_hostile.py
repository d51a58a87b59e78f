"""The dashboard against hostile input: markup in ids and lines, huge lines, unknown links, empty databases."""

from __future__ import annotations

import re

import pytest
from streamlit.testing.v1 import AppTest

# Elements whose text Streamlit renders as Markdown (with $…$ as LaTeX).
MARKDOWN_KINDS = ("title", "header", "subheader", "markdown", "caption", "error", "warning", "info", "success")


def _markdown(at: AppTest) -> list[str]:
    """Every text Streamlit renders as Markdown, the metrics' help (their tooltips) included."""
    return [e.value for kind in MARKDOWN_KINDS for e in getattr(at, kind)] + [m.help for m in at.metric if m.help]


def _unescaped(texts: list[str], pattern: str) -> list[str]:
    """The texts where ``pattern`` occurs outside inline code and not backslash-escaped."""
    out = []
    for t in texts:
        prose = re.sub(r"```.*?```|`[^`\n]*`", "", t, flags=re.S)
        if re.search(rf"(?<!\\){pattern}", prose):
            out.append(t[:200])
    return out


@pytest.mark.slow
@pytest.mark.parametrize("page", ["fleet", "instance", "failures"])
def test_dollars_and_markup_in_ids_and_details_show_literally(hostile_db, open_page, page):
    """`$5 … $6` would render as LaTeX and `*x*` in italics: every such sign reaches Markdown escaped."""
    db, ids = hostile_db
    params = (
        {"instance": ids["id"]} if page == "instance" else {"failure": ids["failure"]} if page == "failures" else {}
    )
    at = open_page(db, page, **params)
    texts = _markdown(at)
    assert any("日本🚀" in t for t in texts), "the id is shown"
    assert _unescaped(texts, r"\$") == []
    assert _unescaped(texts, r"\*x\*") == []
    assert _unescaped(texts, r"\[l\]\(u\)") == []


@pytest.mark.slow
def test_instance_caption_prices_are_not_latex(arrow_db, open_page):
    """Two prices in one caption ("$2.49/hour · cost/proof $0.0017") are two dollar amounts, not a formula."""
    db, ids = arrow_db
    at = open_page(db, "instance", instance=ids["ok"])
    assert _unescaped(_markdown(at), r"\$") == []


@pytest.mark.parametrize("page", ["instance", "failures"])
def test_ten_thousand_character_lines_are_cut_in_prose(hostile_db, open_page, page):
    """Banners and captions cut a 10,000-character line and say so; the log viewers keep it whole."""
    db, ids = hostile_db
    params = {"instance": ids["id"]} if page == "instance" else {"failure": ids["failure"]}
    at = open_page(db, page, **params)
    texts = _markdown(at)
    assert max(len(t) for t in texts) < 2_000, [t[:80] for t in texts if len(t) >= 2_000]
    assert any("more characters" in t for t in texts)


@pytest.mark.parametrize("page,param", [("instance", "instance"), ("failures", "failure")])
def test_a_link_to_an_unknown_id_says_so_literally(arrow_db, open_page, page, param):
    """A link typed or pasted wrong: the page names the id it did not find, its signs not taken as Markdown."""
    db, _ = arrow_db
    at = open_page(db, page, **{param: "i-nope'%-$a$-*b*"})
    named = [w.value for w in at.warning if "i-nope'%" in w.value]
    assert named, [w.value for w in at.warning]
    assert _unescaped(named, r"\$") == [] and _unescaped(named, r"\*b\*") == [], named


def test_an_instance_known_only_from_the_manager(manager_only_db, open_page):
    """Rented, but its agent never spoke: the Fleet page names it, its Instance page shows the manager's events."""
    at = open_page(manager_only_db)
    info = " ".join(i.value for i in at.info)
    assert "m-1" in info and "manager" in info, info
    at = open_page(manager_only_db, "instance", instance="m-1")
    assert not at.warning, [w.value for w in at.warning]
    assert any("manager" in i.value and "m-1" in i.value for i in at.info)
    assert any("rented" in set(df.value["kind"]) for df in at.dataframe if "kind" in df.value.columns)


def test_fleet_of_an_empty_database_says_what_to_do(empty_db, open_page):
    at = open_page(empty_db)
    assert any("flightrec materialize" in i.value for i in at.info), [i.value for i in at.info]


@pytest.mark.slow
def test_a_time_range_with_no_rows_says_so_on_every_page(arrow_db, open_page):
    """The test data is from 2025: in the last 15 minutes nothing happened."""
    db, _ = arrow_db
    at = open_page(db)
    at.sidebar.selectbox(key="time_range").select("Last 15 min").run()
    assert any("time range" in i.value for i in at.info), [i.value for i in at.info]
    for page in ("page_instance.py", "page_failures.py", "page_kinds.py", "page_throughput.py"):
        at.switch_page(page).run()
        assert not at.exception, at.exception
        said = " ".join(e.value for e in [*at.info, *at.caption])
        assert "time range" in said or "match" in said, (page, said)
    at.switch_page("page_cost.py").run()
    assert any("all time" in c.value.lower() for c in at.caption), "the Cost page says it ignores the range"


def test_md_escapes_markup_and_keeps_plain_text():
    from flightrec.analytics.ui import md

    assert md("gpu_arch_unsupported 12.0 i-h100-ok") == "gpu_arch_unsupported 12.0 i-h100-ok"
    assert md("$5 and $6 *x* `t` [l](u) _e_") == r"\$5 and \$6 \*x\* \`t\` \[l\](u) \_e\_"
    assert md("- a list?") == r"\- a list?" and md("1. item") == r"1\. item"
    assert md("two\nlines") == "two lines" and md(None) == ""
    assert md("x" * 400, limit=300) == "x" * 300 + "… (100 more characters)"


@pytest.mark.parametrize(
    "sql", ["PRAGMA show_tables", "-- the tables\nPRAGMA show_tables", "pragma table_info('fleet')"]
)
def test_sql_console_runs_a_describing_pragma(arrow_db, open_page, sql):
    """A PRAGMA that describes is allowed (docs/dashboard.md): it must not be wrapped into a SELECT that cannot
    parse."""
    db, _ = arrow_db
    at = open_page(db, "sql")
    next(t for t in at.text_area).input(sql).run()
    assert not at.error, at.error[0].value
    assert len(at.dataframe[0].value) > 0


@pytest.mark.parametrize(
    "sql",
    [
        "/* /* */ PRAGMA version(' */ SELECT * FROM query($$SELECT 7$$) --')",
        "EXPLAIN ANALYZE /* /* */ SELECT 1 --*/ CHECKPOINT",
        "/* /* */ pragma version(' */ SELECT * FROM enable_logging() --')",
    ],
)
def test_sql_console_refuses_what_nested_comments_hide(arrow_db, open_page, sql):
    """DuckDB nests /* */ comments: the console's check is DuckDB's parse, so the hidden statement is refused."""
    db, _ = arrow_db
    at = open_page(db, "sql")
    next(t for t in at.text_area).input(sql).run()
    assert at.error, "the console ran it"
    said = at.error[0].value
    assert "refused" in said and ("read-only" in said or "may not" in said), said


@pytest.mark.parametrize("make", ["text", "empty", "directory"])
def test_a_path_that_is_no_database_says_so(tmp_path, open_page, make, monkeypatch):
    """Not "held by another process": the file is no DuckDB database (a typo in --db, a half-copied file)."""
    import flightrec.db.query

    # Each read retries for STARTING_S (a materializer may be starting): the message, not the wait, is tested.
    monkeypatch.setattr(flightrec.db.query, "STARTING_S", 0.3)
    db = tmp_path / "fleet.duckdb"
    if make == "directory":
        db.mkdir()
    else:
        db.write_text("not a database\n" * 100 if make == "text" else "")
    at = open_page(db)
    assert at.error, "the page says it cannot read the file"
    msg = at.error[0].value
    assert "held by another process" not in msg and "not a DuckDB database" in msg, msg


def test_a_ten_thousand_character_line_in_a_tail_is_cut_with_the_whole_below(hostile_db, open_page):
    """A tail's block stays readable (each line cut, saying so); the "All N lines" expander holds it whole."""
    db, ids = hostile_db
    at = open_page(db, "failures", failure=ids["failure"])
    stderr = next(c.value for c in at.code if "ünïcødé" in c.value and "more characters" in c.value)
    assert max(len(line) for line in stderr.splitlines()) < 1_200
    assert any(len(c.value) > 10_000 and "ünïcødé" in c.value for c in at.code), "the whole tail is there too"
