"""Failure kinds (db/kinds.py) and the failure_kinds view (db/views.py): the fingerprint's parts, and that any order
of arrival and any split of the failures between two stores give the same kinds."""

from __future__ import annotations

import random
import time
from typing import Any

import duckdb
import pyarrow as pa
import pytest
from flightrec.db.classify import parse_rules
from flightrec.db.derive import FAILURES
from flightrec.db.failures import build_failure
from flightrec.db.fold import RawMessage, fold
from flightrec.db.kinds import (
    DECISIONS_INSTANCE,
    NEW_WINDOW_US,
    QUIET_US,
    KindWindows,
    exit_kind,
    failure_kind,
    fingerprint,
    split_kind,
    stage_kind,
)
from flightrec.db.migrate import schema_sql
from flightrec.db.views import prelude_for
from flightrec.schemas import ManagerEvent, encode
from hypothesis import given, settings
from hypothesis import strategies as st

from flightrec.errors import ConfigError
from flightrec.settings import Settings

# One rule that matches none of the lines below: every failure unknown, so the statuses show (the class: below).
RULES = parse_rules('[[rule]]\nid = "never"\nclass = "never"\nhint = "h"\nlines = ["matches no line here"]\n')
DAY_US = 24 * 3600 * 10**6


def test_stage_kind_masks_numbers_and_uuids() -> None:
    assert stage_kind("bench-3") == stage_kind("bench-17") == "bench-<*>"
    assert stage_kind("fetch-3f2b8c1e-9a4d-4c2b-8e1f-0a1b2c3d4e5f") == "fetch-<*>"
    assert stage_kind("benchmark") == "benchmark"
    assert stage_kind(None) == ""


def test_exit_kind_by_what_ended_the_stage() -> None:
    assert exit_kind({"start_error": "No such file", "exit_code": 127}) == "start error"
    assert exit_kind({"signal": 9, "signal_name": "SIGKILL"}, timed_out=True) == "timeout"
    assert exit_kind({"signal": 11, "signal_name": "SIGSEGV"}) == "signal SIGSEGV"
    assert exit_kind({"exit_code": 3}) == exit_kind({"exit_code": 1}) == "code"
    assert exit_kind({"proofs_per_hour": 0.0, "min_rate": 10.0}) == "result"
    assert exit_kind({}) == "none"


def test_the_fingerprint_separates_its_parts() -> None:
    assert len(fingerprint("a", "code", "b")) == 16
    assert fingerprint("a b", "code", "c") != fingerprint("a", "code", "b c")
    one = {"stage": "bench-1", "exit_code": 1, "decisive_line": "CUDA error 700 on device 3 at 0x7f00"}
    two = {"stage": "bench-9", "exit_code": 2, "decisive_line": "CUDA error 719 on device 0 at 0x1"}
    assert failure_kind(one) == failure_kind(two)
    assert failure_kind(one)[1] == "CUDA error <*> on device <*> at <hex>"
    assert failure_kind({**one, "signal": 6, "signal_name": "SIGABRT"})[0] != failure_kind(one)[0]
    assert failure_kind({**one, "stage": "fetch"})[0] != failure_kind(one)[0]


# --- any order, any split ---------------------------------------------------------------------------------------------
CAUSES = [
    "error: cannot open /var/lib/params/{n}.bin: No such file or directory",
    "thread 'main' panicked at 'proof {n} failed: msm mismatch at 0x{n:x}', src/prove.rs:{n}:9",
    "NCCL WARN rank {n}: connection to 10.0.{n}.7:5{n} timed out after {n}s",
]


def _events(i: int, cause: int, t0: int) -> tuple[str, list[dict[str, Any]], list[dict[str, Any]]]:
    """One failed stage's lifecycle and exit rows (instance inst-i, stage bench-i)."""
    inst, stage, ts = f"inst-{i % 7}", f"bench-{i}", t0 + i * 1000
    life = [
        {"event_id": f"{inst}-{i}-s", "seq": 1, "ts_us": ts, "stage": stage, "state": "started", "kind": "lifecycle"},
        {
            "event_id": f"{inst}-{i}-f",
            "seq": 3,
            "ts_us": ts + 2,
            "stage": stage,
            "state": "failed",
            "kind": "lifecycle",
        },
    ]
    line = CAUSES[cause].format(n=i + 1)
    exits = [
        {"event_id": f"{inst}-{i}-x", "seq": 2, "ts_us": ts + 1, "exit_code": 1, "stderr_tail": ["starting", line]}
    ]
    return inst, life, exits


def _rows(failures: list[tuple[int, int]], t0: int, rnd: random.Random) -> list[dict[str, Any]]:
    rows = []
    for i, cause in failures:
        inst, life, exits = _events(i, cause, t0)
        rnd.shuffle(life)  # events in any order of arrival
        row = build_failure(
            inst, "boot-1", f"bench-{i}", lifecycle=life, exits=exits, results=[], facts=None, log_tails={}, rules=RULES
        )
        assert row is not None
        rows.append({**row, "last_lines": []})
    return rows


def _store(rows: list[dict[str, Any]]) -> duckdb.DuckDBPyConnection:
    con = duckdb.connect()
    con.execute(schema_sql())
    con.register("arrow_rows", pa.Table.from_pylist(rows, schema=FAILURES))
    con.execute("INSERT INTO failures BY NAME SELECT * FROM arrow_rows")
    con.unregister("arrow_rows")
    return con


KINDS_SQL = "SELECT kind, template, status, failures, instances, example_failure_ids FROM failure_kinds ORDER BY kind"


def _kinds(con: duckdb.DuckDBPyConnection) -> list[tuple[Any, ...]]:
    for stmt in prelude_for(KINDS_SQL):
        con.execute(stmt)
    return con.execute(KINDS_SQL).fetchall()


def _union_kinds(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    """The kinds over two stores' failures read together, as a lake's reader reads its members' shards."""
    con = _store(a)
    con.register("arrow_rows", pa.Table.from_pylist(b, schema=FAILURES))
    con.execute("INSERT INTO failures BY NAME SELECT * FROM arrow_rows")
    return _kinds(con)


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.integers(0, len(CAUSES) - 1), min_size=1, max_size=24),
    st.randoms(use_true_random=False),
    st.data(),
)
def test_any_order_and_any_split_give_the_same_kinds(causes: list[int], rnd: random.Random, data: Any) -> None:
    t0 = int(time.time() * 1e6) - 3600 * 10**6
    failures = list(enumerate(causes))
    reference = _kinds(_store(_rows(failures, t0, random.Random(0))))
    shuffled = failures[:]
    rnd.shuffle(shuffled)
    cut = data.draw(st.integers(0, len(shuffled)))
    split = _union_kinds(_rows(shuffled[:cut], t0, rnd), _rows(shuffled[cut:], t0, rnd))
    assert split == reference
    assert len(reference) == len(set(causes))  # one kind per cause, whatever its numbers, paths and addresses
    assert sum(r[3] for r in reference) == len(causes)
    assert {r[2] for r in reference} == {"new"}


def test_statuses_by_time() -> None:
    now = int(time.time() * 1e6)
    rnd = random.Random(1)
    rows = _rows([(0, 0), (1, 0)], now - 30 * DAY_US, rnd)  # cause 0: a month ago, never since: ongoing
    rows += _rows([(2, 1)], now - 30 * DAY_US, rnd) + _rows([(3, 1)], now - 3600 * 10**6, rnd)  # back: regressed
    rows += _rows([(4, 2)], now - 3 * DAY_US, rnd) + _rows([(5, 2)], now - 3600 * 10**6, rnd)  # 3 days: ongoing
    status = {t.split()[0]: s for _, t, s, *_ in _kinds(_store(rows))}
    assert status == {"error:": "ongoing", "thread": "regressed", "NCCL": "ongoing"}
    assert QUIET_US == 7 * DAY_US


def test_a_class_from_a_rule_explains_the_kind() -> None:
    rows = _rows([(0, 0)], 0, random.Random(2))
    rows[0]["failure_class"] = "params_missing"
    assert [r[2] for r in _kinds(_store(rows))] == ["explained"]


def test_a_line_with_lone_surrogates_or_nul_has_a_kind() -> None:
    """What a decoder may leave in a line (a lone surrogate, NUL, U+FFFD) templates and hashes like any text."""
    for line in ("bad \udcff byte 3", "nul \x00 at 4", "\ufffd\ufffd 5", "", "x" * 70_000):
        kind, templated = failure_kind({"stage": "s", "exit_code": 1, "decisive_line": line})
        assert len(kind) == 16 and int(kind, 16) >= 0 and len(templated) <= 2048


# --- the windows as settings ------------------------------------------------------------------------------------------
def _kinds_with(con: duckdb.DuckDBPyConnection, windows: KindWindows) -> dict[str, str]:
    """Each kind's status (keyed by its template's first word) with the view built for ``windows``."""
    for stmt in prelude_for(KINDS_SQL, windows=windows):
        con.execute(stmt)
    return {t.split()[0]: s for _, t, s, *_ in con.execute(KINDS_SQL).fetchall()}


def test_the_windows_are_settings() -> None:
    assert KindWindows.from_settings(Settings.from_env({})) == KindWindows(NEW_WINDOW_US, QUIET_US)
    s = Settings.from_env({"FLIGHTREC_KINDS_NEW_HOURS": "2", "FLIGHTREC_KINDS_QUIET_DAYS": "1.5"})
    assert KindWindows.from_settings(s) == KindWindows(2 * 3600 * 10**6, int(1.5 * DAY_US))
    for bad in ("0", "-1", "nan", "x"):
        with pytest.raises(ConfigError, match="FLIGHTREC_KINDS_NEW_HOURS"):
            Settings.from_env({"FLIGHTREC_KINDS_NEW_HOURS": bad})


def test_statuses_follow_the_windows_given() -> None:
    now = int(time.time() * 1e6)
    rnd = random.Random(3)
    rows = _rows([(0, 0)], now - 3 * 3600 * 10**6, rnd)  # first seen 3 h ago
    rows += _rows([(1, 1)], now - 3 * DAY_US, rnd) + _rows([(2, 1)], now - 3600 * 10**6, rnd)  # back after 3 days
    con = _store(rows)
    assert _kinds_with(con, KindWindows()) == {"error:": "new", "thread": "ongoing"}
    short = KindWindows(new_us=2 * 3600 * 10**6, quiet_us=2 * DAY_US)
    assert _kinds_with(con, short) == {"error:": "ongoing", "thread": "regressed"}


# --- regressed when the class changed after a rule explained it -------------------------------------------------------
def _classed(classes: list[str], t0: int) -> list[dict[str, Any]]:
    """Failures of one kind (cause 0), an hour apart from t0, classed as given in that order."""
    rows = _rows([(i, 0) for i in range(len(classes))], t0, random.Random(4))
    rows.sort(key=lambda r: r["ts_us"])
    for i, (row, cls) in enumerate(zip(rows, classes, strict=True)):
        row["ts_us"] = t0 + i * 3600 * 10**6
        row["failure_class"] = cls
    return rows


def test_a_kind_explained_and_then_classed_otherwise_is_regressed() -> None:
    now = int(time.time() * 1e6)
    recent = now - 10 * 3600 * 10**6  # all within the new window
    old = now - 20 * DAY_US
    status = {
        "unknown then a rule": ["unknown", "unknown", "params_missing"],
        "a rule then unknown again": ["params_missing", "params_missing", "unknown"],
        "a rule then another class": ["params_missing", "cuda_error"],
        "a rule then unknown, then the rule again": ["params_missing", "unknown", "params_missing"],
    }
    got = {what: _kinds(_store(_classed(classes, recent)))[0][2] for what, classes in status.items()}
    assert got == {
        "unknown then a rule": "explained",
        "a rule then unknown again": "regressed",
        "a rule then another class": "regressed",
        "a rule then unknown, then the rule again": "regressed",
    }
    # the change is old news after the new window, as a return after a quiet week is
    assert _kinds(_store(_classed(["params_missing", "unknown"], old)))[0][2] == "ongoing"
    assert _kinds(_store(_classed(["params_missing", "cuda_error"], old)))[0][2] == "explained"


# --- the operator's decisions: mute, merge, split (manager events) ----------------------------------------------------
def _decide(con: duckdb.DuckDBPyConnection, *decisions: tuple[str, dict[str, str]], t0: int = 10**15) -> None:
    """The decisions as manager events, folded by the real fold into manager_events (in the order given)."""
    events = [
        ManagerEvent(
            event_id=f"decision-{i}-{t0}",
            instance_id=DECISIONS_INSTANCE,
            boot_id="manager-boot",
            seq=i,
            ts_us=t0 + i,
            source_id="manager@test",
            kind=kind,
            attributes=attrs,
        )
        for i, (kind, attrs) in enumerate(decisions)
    ]
    delta = fold([RawMessage(e.topic, 0, n, e.instance_id.encode(), encode(e)) for n, e in enumerate(events)])
    assert delta.manager.num_rows == len(events)
    con.register("arrow_rows", delta.manager)
    con.execute("INSERT INTO manager_events BY NAME SELECT * FROM arrow_rows")
    con.unregister("arrow_rows")


DECISIONS_SQL = "SELECT kind, status, failures, instances, merged_kinds FROM failure_kinds ORDER BY failures DESC, kind"


def _decided(con: duckdb.DuckDBPyConnection) -> list[tuple[Any, ...]]:
    for stmt in prelude_for(DECISIONS_SQL):
        con.execute(stmt)
    return con.execute(DECISIONS_SQL).fetchall()


def _three_kinds() -> tuple[duckdb.DuckDBPyConnection, list[str]]:
    """Three new kinds: causes 0, 1 and 2 with 3, 2 and 1 failures; their kinds in that order."""
    now = int(time.time() * 1e6) - 3600 * 10**6
    con = _store(_rows([(0, 0), (1, 0), (2, 0), (3, 1), (4, 1), (5, 2)], now, random.Random(5)))
    kinds = [k for k, *_ in _decided(con)]
    return con, kinds


def test_a_muted_kind_is_muted_not_new() -> None:
    con, (a, b, c) = _three_kinds()
    _decide(con, ("kind_muted", {"failure_kind": b}))
    assert [(k, s) for k, s, *_ in _decided(con)] == [(a, "new"), (b, "muted"), (c, "new")]


def test_merged_kinds_show_as_their_target() -> None:
    con, (a, b, c) = _three_kinds()
    _decide(con, ("kind_merged", {"failure_kind": b, "into": a}), ("kind_merged", {"failure_kind": c, "into": b}))
    assert _decided(con) == [(a, "new", 6, 6, sorted([b, c]))]


def test_a_split_separates_failures_by_pattern_into_a_new_kind() -> None:
    con, (a, b, c) = _three_kinds()
    # cause 0's lines name /var/lib/params/1.bin, 2.bin and 3.bin: the split takes 1 and 3
    _decide(con, ("kind_split", {"failure_kind": a, "pattern": r"/params/[13]\.bin"}))
    rows = _decided(con)
    new = split_kind(a, r"/params/[13]\.bin")
    assert [(k, f) for k, _, f, *_ in rows] == sorted([(new, 2), (b, 2), (a, 1), (c, 1)], key=lambda r: (-r[1], r[0]))
    # a split's new kind can be muted and merged like any other
    _decide(con, ("kind_merged", {"failure_kind": new, "into": c}), ("kind_muted", {"failure_kind": c}), t0=10**15 + 9)
    assert {(k, s, f) for k, s, f, *_ in _decided(con)} == {(a, "new", 1), (b, "new", 2), (c, "muted", 3)}


def test_decisions_in_any_order_of_arrival_give_the_same_kinds() -> None:
    """The latest word wins by the decision's own time (ts_us, seq, event id), never by the order it was folded."""
    con, (a, b, c) = _three_kinds()
    _decide(con, ("kind_merged", {"failure_kind": b, "into": a}), t0=10**15 + 5)  # the later word, folded first
    _decide(con, ("kind_merged", {"failure_kind": b, "into": c}), t0=10**15)
    assert {(k, f) for k, _, f, *_ in _decided(con)} == {(a, 5), (c, 1)}


def test_hostile_decisions_never_break_the_view() -> None:
    con, (a, b, c) = _three_kinds()
    before = _decided(con)
    _decide(
        con,
        ("kind_split", {"failure_kind": a, "pattern": "(unclosed"}),  # not a regular expression
        ("kind_split", {"failure_kind": a, "pattern": "(?=lookahead)"}),  # Python's, not RE2's
        ("kind_split", {"failure_kind": a, "pattern": ""}),
        ("kind_merged", {"failure_kind": a}),  # no target
        ("kind_muted", {}),  # no kind
        ("kind_muted", {"failure_kind": "'; DROP TABLE failures; --"}),
    )
    assert _decided(con) == before
    cycle = (("kind_merged", {"failure_kind": a, "into": b}), ("kind_merged", {"failure_kind": b, "into": a}))
    _decide(con, *cycle, t0=2 * 10**15)
    rows = _decided(con)  # a cycle: resolved the same way every time, every failure counted once
    assert sum(f for _, _, f, *_ in rows) == 6 and rows == _decided(con)


def test_a_mute_and_a_merge_can_be_taken_back_and_the_latest_word_wins() -> None:
    con, (a, b, c) = _three_kinds()
    _decide(con, ("kind_muted", {"failure_kind": a}), ("kind_merged", {"failure_kind": c, "into": b}))
    _decide(con, ("kind_unmuted", {"failure_kind": a}), ("kind_unmerged", {"failure_kind": c}), t0=10**15 + 10)
    assert [(k, s, f) for k, s, f, *_ in _decided(con)] == [(a, "new", 3), (b, "new", 2), (c, "new", 1)]
    _decide(con, ("kind_muted", {"failure_kind": a}), t0=10**15 + 20)  # muted again, after the unmute
    _decide(con, ("kind_unmuted", {"failure_kind": b}), t0=10**15 - 20)  # an unmute before any mute: nothing
    assert [(k, s) for k, s, *_ in _decided(con)] == [(a, "muted"), (b, "new"), (c, "new")]
