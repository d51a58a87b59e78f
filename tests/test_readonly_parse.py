"""The statement check is DuckDB's parse, not a pattern: comments, nesting, casing and whitespace change no verdict."""

from __future__ import annotations

import duckdb
import pytest
from flightrec.db.readonly import check_read_only
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flightrec.errors import QueryError

# What the check must refuse: statements that change state, and reads that call what changes state or runs SQL text.
REFUSED = [
    "CHECKPOINT",
    "SELECT * FROM checkpoint()",
    "SELECT * FROM force_checkpoint()",
    "SELECT * FROM enable_logging()",
    "SELECT * FROM disable_logging()",
    "SELECT * FROM truncate_duckdb_logs()",
    "CALL enable_logging()",
    "SELECT * FROM query('SELECT 7')",
    "SELECT * FROM query($$SELECT 7$$)",
    "SELECT * FROM query_table('instances')",
    "SELECT nextval('s')",
    "SELECT setseed(0.5)",
    "SET threads = 1",
    "PRAGMA enable_profiling",
    "DELETE FROM instances",
    "EXPLAIN ANALYZE CHECKPOINT",
    "EXPLAIN ANALYZE SELECT * FROM enable_logging()",
    "EXPLAIN ANALYZE DELETE FROM instances",
    "INSERT INTO t VALUES (1)",
    "ATTACH ':memory:' AS x",
]
ALLOWED = [
    "SELECT 1",
    "PRAGMA version",
    "PRAGMA show_tables",
    "PRAGMA table_info('t')",
    "EXPLAIN SELECT 1",
    "EXPLAIN ANALYZE SELECT 1",
    "SELECT * FROM range(3)",
]

# The attacks that fooled the text patterns (DuckDB nests /* */ comments; a regex did not).
TRICKS = [
    "/* /* */ PRAGMA version(' */ SELECT * FROM query($$SELECT 7$$) --')",
    "EXPLAIN ANALYZE /* /* */ SELECT 1 --*/ CHECKPOINT",
    "EXPLAIN ANALYZE /* /* */ SELECT 1 --*/ SELECT * FROM enable_logging()",
    "/* /* */ PRAGMA version(' */ SELECT * FROM enable_logging() --')",
    "EXPLAIN /* /* */ SELECT 1 --*/ ANALYZE SELECT * FROM checkpoint()",
    "/**/PRAGMA/**/version/* /* */ */; CHECKPOINT",
]


@pytest.mark.parametrize("sql", TRICKS)
def test_nested_comment_tricks_are_refused(sql: str) -> None:
    with pytest.raises(QueryError):
        check_read_only(sql)


@pytest.mark.parametrize("sql", ALLOWED)
def test_reads_still_pass(sql: str) -> None:
    check_read_only(sql)


# Wrappers DuckDB's lexer takes as blanks: comments (nested too), whitespace; and keyword casing.
_blank = st.one_of(
    st.sampled_from([" ", "\n", "\t", "  \n "]),
    st.builds(lambda t: f"-- {t}\n", st.text(alphabet="abc */'$-;()", max_size=8)),
    st.builds(lambda t: f"/* {t} */", st.text(alphabet="abc'$-;()", max_size=8)),
    st.builds(lambda t: f"/* /* {t} */ */", st.text(alphabet="abc'$-;()", max_size=8)),
    st.just("/* PRAGMA version */"),
    st.just("/* /* */ PRAGMA version ' */"),
)
_blanks = st.lists(_blank, min_size=1, max_size=4).map("".join)


def _recase(sql: str, flips: list[bool]) -> str:
    out = []
    quoted = False
    for i, ch in enumerate(sql):
        quoted ^= ch == "'"
        out.append(ch.swapcase() if not quoted and flips[i % len(flips)] and ch.isalpha() and i < 12 else ch)
    return "".join(out)


def _wrap(sql: str, before: str, after: str, flips: list[bool]) -> str:
    words = _recase(sql, flips).split(" ")
    return before + words[0] + after + " " + " ".join(words[1:])


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sql=st.sampled_from(REFUSED), before=_blanks, after=_blanks, flips=st.lists(st.booleans(), min_size=1))
def test_no_wrapping_of_a_refused_statement_passes(sql: str, before: str, after: str, flips: list[bool]) -> None:
    text = _wrap(sql, before, after, flips)
    try:
        duckdb.extract_statements(text)
    except duckdb.Error:
        return  # not SQL any more: DuckDB would not run it either
    with pytest.raises(QueryError):
        check_read_only(text)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sql=st.sampled_from(ALLOWED), before=_blanks, after=_blanks, flips=st.lists(st.booleans(), min_size=1))
def test_no_wrapping_changes_the_verdict_on_a_read(sql: str, before: str, after: str, flips: list[bool]) -> None:
    text = _wrap(sql, before, after, flips)
    try:
        duckdb.extract_statements(text)
    except duckdb.Error:
        return
    check_read_only(text)


def test_tricks_change_nothing_on_the_snapshot_path(tmp_path) -> None:
    """While a materializer holds the file: every trick refused, in this process and in a read's own process; the
    writer's settings and logs, and the snapshot copy's bytes, are as they were."""
    import hashlib

    from flightrec.db import snapshot
    from flightrec.db.filestore import FileStore
    from flightrec.db.query import run_query
    from flightrec.db.sandbox import ReadLimits

    db = tmp_path / "fr.duckdb"
    store = FileStore(db, "g")
    try:

        def state() -> tuple:
            published = snapshot.current(db)
            assert published is not None and published.path is not None
            return (
                store.con.execute("SELECT name, value FROM duckdb_settings() ORDER BY name").fetchall(),
                store.con.execute("SELECT count(*) FROM duckdb_logs").fetchall(),
                hashlib.sha256(published.path.read_bytes()).hexdigest(),
            )

        before = state()
        for limits in (None, ReadLimits(seconds=20)):
            for sql in TRICKS:
                with pytest.raises(QueryError):
                    run_query(db, sql, limits=limits)
            assert run_query(db, "PRAGMA version", limits=limits).num_rows == 1
        assert state() == before
    finally:
        store.close()


# Found by review: a comment's parentheses counted as the option list's; the explained statement cut in the wrong
# place let enable_logging(), checkpoint(), query() and writes through. And the other wrappers DuckDB knows.
REVIEW = [
    "EXPLAIN (ANALYZE) /* ( */ SELECT * FROM enable_logging() WHERE 1 = /* ) */ (SELECT 1)",
    "EXPLAIN (ANALYZE) /* ( */ SELECT * FROM checkpoint() WHERE 1 = /* ) */ (SELECT 1)",
    "EXPLAIN (ANALYZE) /* ( */ SELECT * FROM query('SELECT 1') WHERE 1 = /* ) */ (SELECT 1)",
    "EXPLAIN (ANALYZE) /* ( */ SELECT nextval('s') WHERE 1 = /* ) */ (SELECT 1)",
    "EXPLAIN (ANALYZE) /* ( */ UPDATE t SET a = /* ) */ (SELECT 1)",
    "EXPLAIN ANALYZE (FORMAT json) /* ( */ INSERT INTO t ( /* ) ) */ SELECT 1)",
    "EXPLAIN (FORMAT json) /* ( */ CREATE TEMP TABLE x AS /* ) */ SELECT 1",
    "EXPLAIN (ANALYZE, FORMAT json) -- (\n SELECT * FROM enable_logging() WHERE 1 = -- )\n (SELECT 1)",
    "SUMMARIZE SELECT * FROM query('CHECKPOINT')",
    "DESCRIBE SELECT * FROM query('CHECKPOINT')",
    "SUMMARIZE (SELECT * FROM query('CHECKPOINT'))",
    "SHOW SELECT * FROM query('SELECT 1')",
    "DESCRIBE FROM query_table('x')",
    "SUMMARIZE FROM checkpoint()",
    "FROM checkpoint()",
    "SELECT * FROM (FROM checkpoint())",
    "PIVOT (FROM query('SELECT 1 AS a, 2 AS b')) ON a USING sum(b)",
    "UNPIVOT (FROM query('SELECT 1 AS a')) ON a INTO NAME n VALUE v",
    "WITH x AS (FROM query('CHECKPOINT')) SELECT * FROM x",
    "WITH RECURSIVE x AS (SELECT 1 UNION ALL FROM query('SELECT 1')) SELECT * FROM x",
    "SELECT list_transform([1], x -> nextval('s'))",
    "SELECT (SELECT nextval('s'))",
    "SELECT * FROM range(1) WHERE EXISTS (FROM query('CHECKPOINT'))",
    "SELECT 1 UNION ALL FROM query('CHECKPOINT')",
]


@pytest.mark.parametrize("sql", REVIEW)
def test_what_the_review_tried_is_refused(sql: str) -> None:
    with pytest.raises(QueryError):
        check_read_only(sql)


@pytest.mark.parametrize(
    "stmt",
    [
        "CREATE TEMP VIEW v ( /* ) */ a) AS SELECT * FROM checkpoint()",
        "CREATE TEMP VIEW v /* AS SELECT 1 */ AS SELECT * FROM query('CHECKPOINT')",
        "CREATE TEMP VIEW v (a /* ( */) AS SELECT * FROM (SELECT 1) WHERE 1 = /* ) */ (SELECT * FROM enable_logging())",
    ],
)
def test_prelude_views_with_commented_parentheses_are_judged_whole(stmt: str) -> None:
    from flightrec.db.readonly import check_prelude

    with pytest.raises(QueryError):
        check_prelude(stmt)


_option_blank = st.sampled_from([" ", "/* ( */", "/* ) */", "-- (\n", "-- )\n", "/* /* ( */ ) */"])


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    a=_option_blank,
    b=_option_blank,
    c=_option_blank,
    bad=st.sampled_from(["enable_logging()", "checkpoint()", "query('SELECT 1')"]),
)
def test_comments_inside_explain_options_change_no_verdict(a: str, b: str, c: str, bad: str) -> None:
    text = f"EXPLAIN ({a}ANALYZE{b}){c} SELECT * FROM {bad} WHERE 1 = {b} (SELECT 1)"
    try:
        duckdb.extract_statements(text)
    except duckdb.Error:
        return
    with pytest.raises(QueryError):
        check_read_only(text)
