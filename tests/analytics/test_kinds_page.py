"""The Failure kinds page and the Fleet page's count of new kinds: the pages' queries on a real DuckDB file folded
from events (money_db's explained kinds and two new ones, kind_boots), then the pages rendered with AppTest."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import quote

from flightrec.analytics import queries
from streamlit.testing.v1 import AppTest

QUORUM = "zorblax quorum gone: peer <ip> answered <*> frames"
LEDGER = "zorblax ledger <hex> turned away after <duration>"


def _kinds(db: Path) -> list[dict]:
    return queries.failure_kinds(db).to_pylist()


def _metric(at: AppTest, label: str) -> str:
    return next(m.value for m in at.metric if m.label == label)


def test_new_kinds_come_first_then_the_money_lost(kinds_db):
    rows = _kinds(kinds_db)
    assert [(r["template"][:60], r["status"]) for r in rows] == [
        (QUORUM, "new"),  # $2 lost, one instance without a price
        (LEDGER, "new"),  # its only instance has no price: unknown, after the known
        ("CUDA error: no kernel image is available for execution on th", "explained"),  # fa: $0.40
        ("RuntimeError: CUDA out of memory. Tried to allocate <size>", "explained"),  # fb1: $0.25
        ("<*> proofs/hour < MIN_RATE <*>", "explained"),  # fb2: b's loss went to fb1's kind
    ]
    quorum, ledger, fa, fb1, fb2 = rows
    assert (quorum["failures"], quorum["instances"], round(quorum["dollars_lost"], 2), quorum["unpriced"]) == (
        3,
        3,
        2.0,
        1,
    )
    assert (ledger["dollars_lost"], ledger["unpriced"]) == (None, 1)  # unknown, not $0
    assert [round(r["dollars_lost"], 2) for r in (fa, fb1, fb2)] == [0.4, 0.25, 0.0]
    # the same money as the Cost page gives each class: no dollar counted twice
    assert round(sum(r["dollars_lost"] or 0 for r in rows), 2) == 2.65


def test_a_kind_lists_its_failures_with_their_decisive_lines(kinds_db):
    quorum = _kinds(kinds_db)[0]
    failures = queries.kind_failures(kinds_db, quorum["kind"]).to_pylist()
    assert sorted(f["failure_id"] for f in failures) == ["kq1", "kq2", "kq3"]
    assert all(f["decisive_line"].startswith("zorblax quorum gone: peer 10.0.") for f in failures)
    assert failures[0]["more"] < 0
    assert queries.kind_failures(kinds_db, quorum["kind"], limit=1).to_pylist()[0]["more"] == 2
    assert queries.kind_failures(kinds_db, "' OR 1=1 --").num_rows == 0  # a parameter, never SQL
    assert queries.new_kinds(kinds_db) == 2


def test_the_kinds_page_lists_kinds_and_opens_one(kinds_db, open_page):
    at = open_page(kinds_db, "kinds")
    assert at.title[0].value == "Failure kinds"
    assert (_metric(at, "Kinds"), _metric(at, "New"), _metric(at, "Explained")) == ("5", "2", "3")
    table = at.dataframe[0].value
    assert list(table["status"]) == ["new", "new", "explained", "explained", "explained"]
    assert table["open"].iloc[0] == f"kinds?kind={table['kind'].iloc[0]}"
    # the first kind is open: its template, money and failures with their decisive lines, linked
    assert any(QUORUM in c.value for c in at.code)
    assert any("lost: at least \\$2.00 (1 instance(s) without a price)" in c.value for c in at.caption)
    failures = at.dataframe[1].value
    assert sorted(failures["open"]) == ["failures?failure=kq1", "failures?failure=kq2", "failures?failure=kq3"]
    assert set(failures["instance"]) == {"instance?instance=k1", "instance?instance=k2", "instance?instance=k3"}
    assert failures["decisive_line"].str.startswith("zorblax quorum gone").all()


def test_a_kind_linked_by_its_id_opens_it(kinds_db, open_page):
    ledger = _kinds(kinds_db)[1]["kind"]
    at = open_page(kinds_db, "kinds", kind=ledger)
    assert any(ledger in h.value for h in at.subheader)
    assert any("lost: unknown (1 instance(s) without a price)" in c.value for c in at.caption)
    assert list(at.dataframe[1].value["open"]) == ["failures?failure=kl4"]
    at = open_page(kinds_db, "kinds", kind="no-such-kind")
    assert any("No failure kind no-such-kind" in w.value for w in at.warning)


def test_the_kinds_page_of_an_empty_database_says_so(empty_db, open_page):
    at = open_page(empty_db, "kinds")
    assert any("No failure kinds" in i.value for i in at.info)


def test_the_fleet_headline_counts_new_kinds(kinds_db, money_db, open_page):
    assert _metric(open_page(kinds_db), "New failure kinds (24 h)") == "2"
    assert _metric(open_page(money_db), "New failure kinds (24 h)") == "0"  # 2025's kinds are not new


def test_markup_and_long_lines_in_a_kind_show_literally(hostile_db, open_page):
    """A kind whose instance, GPU model and decisive line carry $, *, [l](u) and 10,000 characters: no formula, no
    italics, no link in Markdown; long text cut."""
    db, ids = hostile_db
    (row,) = queries.failure_kinds(db).to_pylist()
    at = open_page(db, "kinds", kind=row["kind"])
    prose = [str(e.value) for part in ("markdown", "caption", "subheader", "warning") for e in getattr(at, part)]
    assert any("NVIDIA 'GPU' \\$9 \\*9\\*" in t for t in prose), prose  # the GPU model, escaped
    assert all(len(t) < 2_000 for t in prose + [c.value for c in at.code])
    assert list(at.dataframe[1].value["instance"]) == [f"instance?instance={quote(ids['id'], safe='')}"]


def test_a_kind_without_a_sane_time_reads_as_unknown():
    """first_seen / last_seen are NULL when the failures' own clock was absurd (db/views.py's sane_us)."""
    import datetime

    from flightrec.analytics.page_kinds import when

    assert when(None) == "?"
    assert when(datetime.datetime(2026, 1, 2, 3, 4, 5)) == "2026-01-02 03:04:05"


def test_a_decision_on_kinds_is_no_silent_rented_instance(tmp_path) -> None:
    """Decisions on kinds travel as manager events about the reserved id `failure-kinds`: never an instance the
    manager rented that stays silent (the Fleet page's list of paid-for, silent instances)."""
    from dashdata import BASE_US, commit, manager_events

    db = tmp_path / "m.duckdb"
    commit(
        db,
        [
            manager_events("silent-1", ("rented", BASE_US, {})),
            manager_events("failure-kinds", ("kind_muted", BASE_US, {"failure_kind": "0123456789abcdef"})),
        ],
    )
    assert [r["instance_id"] for r in queries.manager_only_instances(db).to_pylist()] == ["silent-1"]
