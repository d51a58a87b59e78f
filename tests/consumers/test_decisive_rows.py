"""The decisive line in the failures rows: decisive_line, decisive_source, decisive_line_no, rule_id and rules_version
for every failure (unknown included), the same whatever the order events arrived in, filled in at a database's
first open after the upgrade, and shown by the timeline."""

from __future__ import annotations

import random

import duckdb
from flightrec.db.classify import load_rules, parse_rules
from flightrec.db.failures import build_failure
from flightrec.db.fold import RawMessage, fold
from flightrec.schemas import Lifecycle, encode
from materializer_helpers import Boot

RULES = load_rules()


def _events(b: Boot) -> list:
    return [RawMessage(e.topic, 0, n, e.instance_id.encode(), encode(e)) for n, e in enumerate(b.events)]


def _unknown_boot() -> Boot:
    b = Boot()
    b.add(Lifecycle, stage="benchmark", state="started")
    lines = ["loading circuit", "Error: witness column 7 has 3 rows, the circuit expects 4", "exit status 1"]
    b.lines("benchmark", "stderr", lines)
    b.exit("benchmark", 1, stderr=lines)
    b.add(Lifecycle, stage="benchmark", state="failed", detail="exit code 1; last stderr line: exit status 1")
    return b


def test_an_unknown_failure_keeps_its_decisive_line_in_its_row_and_the_timeline(tmp_path):
    from flightrec.consumers.timeline import from_db, render
    from flightrec.db.filestore import FileStore

    b = _unknown_boot()
    db = tmp_path / "f.duckdb"
    store = FileStore(db, group="t")
    try:
        store.commit(fold(_events(b)))
    finally:
        store.close()
    con = duckdb.connect(str(db), read_only=True)
    row = con.execute(
        "SELECT failure_class, decisive_line, decisive_source, decisive_line_no, rule_id, rules_version, matched_line "
        "FROM failures"
    ).fetchone()
    con.close()
    decisive = "Error: witness column 7 has 3 rows, the circuit expects 4"
    assert row == ("unknown", decisive, "stderr", 1, "unknown", RULES.version, decisive)
    failure = next(line for line in render(from_db(db, b.instance)[0]).splitlines() if "FAILURE" in line)
    assert decisive in failure


def test_the_same_events_in_any_order_give_the_same_decisive_line(tmp_path):
    from flightrec.db.filestore import FileStore

    b = _unknown_boot()
    got = set()
    for n in range(2):
        events = list(b.events)
        random.Random(n).shuffle(events)
        store = FileStore(tmp_path / f"{n}.duckdb", group="t")
        try:
            for e in events:  # one event per batch, in a shuffled order
                store.commit(fold([RawMessage(e.topic, 0, 0, e.instance_id.encode(), encode(e))]))
            got.add(store.con.execute("SELECT decisive_line, decisive_line_no FROM failures").fetchone())
        finally:
            store.close()
    assert len(got) == 1


def test_a_database_made_before_decisive_lines_gets_them_at_the_first_open(tmp_path):
    from flightrec.db.filestore import FileStore

    db = tmp_path / "old.duckdb"
    store = FileStore(db, group="t")
    try:
        store.commit(fold(_events(_unknown_boot())))
    finally:
        store.close()
    con = duckdb.connect(str(db))
    for column in ("rules_version", "rule_id", "decisive_line_no", "decisive_source", "decisive_line"):
        con.execute(f"ALTER TABLE failures DROP COLUMN {column}")  # as version 5 made it
    con.execute("UPDATE failures SET matched_line = NULL")  # an unknown failure had no line then
    con.execute("DELETE FROM schema_version WHERE version >= 6")
    con.close()
    FileStore(db, group="t").close()
    con = duckdb.connect(str(db), read_only=True)
    assert con.execute("SELECT decisive_line, decisive_line_no, matched_line FROM failures").fetchone() == (
        "Error: witness column 7 has 3 rows, the circuit expects 4",
        1,
        "Error: witness column 7 has 3 rows, the circuit expects 4",
    )
    assert con.execute("SELECT max(version) FROM schema_version").fetchone()[0] >= 6
    con.close()


def test_build_failure_records_the_rule_and_the_rules_version():
    b = _unknown_boot()
    recs = [e.to_record() for e in b.events]
    life = [{**r, "kind": "lifecycle"} for r, e in zip(recs, b.events, strict=True) if e.name.endswith("Lifecycle")]
    exits = [r for r, e in zip(recs, b.events, strict=True) if e.name.endswith("ProcessExit")]
    table = parse_rules('[[rule]]\nid = "witness"\nclass = "outside"\nhint = "h"\nlines = ["witness column"]\n')
    row = build_failure(
        b.instance, b.boot, "benchmark", lifecycle=life, exits=exits, results=[], facts=None, log_tails={}, rules=table
    )
    assert row is not None and (row["failure_class"], row["rule_id"], row["rules_version"]) == (
        "outside",
        "witness",
        table.version,
    )
    assert table.version != RULES.version and len(table.version) == 12
