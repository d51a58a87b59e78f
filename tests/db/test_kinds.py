"""Failure kinds (db/kinds.py) and the failure_kinds view (db/views.py): the fingerprint's parts, and that any order
of arrival and any split of the failures between two stores give the same kinds."""

from __future__ import annotations

import random
import time
from typing import Any

import duckdb
import pyarrow as pa
from flightrec.db.classify import parse_rules
from flightrec.db.derive import FAILURES
from flightrec.db.failures import build_failure
from flightrec.db.kinds import QUIET_US, exit_kind, failure_kind, fingerprint, stage_kind
from flightrec.db.migrate import schema_sql
from flightrec.db.views import prelude_for
from hypothesis import given, settings
from hypothesis import strategies as st

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
