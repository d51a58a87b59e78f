"""A lake reader's copy of the shard tables (flightrec.db.lakecopy): the same answers as the lake itself and as the
file, each commit seen at the next statement, only what changed copied again, one snapshot per statement."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from flightrec.db import lake as lakes
from flightrec.db.lakestore import LakeStore
from flightrec.db.query import run_query
from flightrec.db.views import VIEWS, stored_views

from .conftest import _analytics_fixtures

SHARDS = (0, 1, 2)


@pytest.fixture
def sharded(lake: tuple[str, str], tmp_path: Path) -> Iterator[tuple[str, Path, LakeStore]]:
    """The dashboard tests' fleet in a lake of three shards, as members lay it out: (db, the same as a file, a
    store that writes to the lake)."""
    db, data_path = lake
    file = tmp_path / "fleet.duckdb"
    _analytics_fixtures().build_arrow_db(file)
    store = LakeStore(lakes.parse_db(db, data_path), "g", shards=SHARDS, views=stored_views())
    try:
        store.load_file(str(file))
        yield db, file, store
    finally:
        store.close()
        lakes.forget_reader(lakes.parse_db(db))


def _copy(db: str):
    return lakes._readers[lakes.parse_db(db)][1]


def _rows(db: str | Path, sql: str) -> list[str]:
    t = run_query(db, sql, prelude=VIEWS)
    key = [c for c in t.column_names if c not in ("now_us", "age_s", "silent_s", "age_hours")]
    return sorted(str([str(v) for v in row.values()]) for row in t.select(key).to_pylist())


def test_every_view_answers_the_same_from_the_copy_as_from_the_file(sharded):
    db, file, _ = sharded
    for name in ("fleet", "failure_context", "stage_runs", "log_view", "throughput_view", "gpu_throughput"):
        assert _rows(db, f"SELECT * FROM {name}") == _rows(file, f"SELECT * FROM {name}"), name
    assert _copy(db).copied, "the views were not answered from a copy"
    assert _rows(db, "SELECT * FROM lake.main.fleet") == _rows(file, "SELECT * FROM fleet")  # the lake's own views


def test_a_commit_is_seen_at_the_next_statement_and_only_what_it_changed_is_copied_again(sharded):
    db, _, store = sharded
    count = "SELECT count(*) AS n FROM fleet"
    n = run_query(db, count, prelude=VIEWS).to_pylist()[0]["n"]
    copy = _copy(db)
    before = copy.tables_copied
    assert run_query(db, count, prelude=VIEWS).to_pylist()[0]["n"] == n
    assert copy.tables_copied == before, "the same snapshot was copied again"
    store.con.execute("INSERT INTO part_1.instances (instance_id, boot_id, state) VALUES ('i-new', 'b', 'started')")
    assert run_query(db, count, prelude=VIEWS).to_pylist()[0]["n"] == n + 1
    assert copy.tables_copied == before + 1, "more than the one changed shard table was copied"
    run_query(db, "SELECT count(*) AS n FROM log_lines")
    store.con.execute("INSERT INTO part_2.failures (failure_id, instance_id) VALUES ('f-new', 'i-new')")
    assert run_query(db, "SELECT count(*) AS n FROM log_lines").num_rows == 1
    assert copy.tables_copied == before + 1, "a statement that reads no shard table copied one"


def test_a_new_shard_and_a_new_table_reach_a_reader_that_is_attached(sharded, lake):
    db, _, store = sharded
    assert run_query(db, "SELECT count(*) AS n FROM instances").to_pylist()[0]["n"] == 3
    store.add_shards([7])
    store.con.execute("INSERT INTO part_7.instances (instance_id, boot_id, state) VALUES ('i-7', 'b', 'started')")
    store.con.execute("CREATE TABLE main.later AS SELECT 42 AS answer")
    assert run_query(db, "SELECT count(*) AS n FROM instances").to_pylist()[0]["n"] == 4
    assert run_query(db, "SELECT answer FROM later").to_pylist() == [{"answer": 42}]
    assert run_query(db, "SELECT count(*) AS n FROM part_7.instances").to_pylist()[0]["n"] == 1


def test_one_statement_reads_one_snapshot_while_commits_land(sharded):
    """A writer adds an instance and its failure in one transaction, 30 times; every statement that counts both, in
    three threads at once, sees the two counts move together."""
    db, _, store = sharded
    base = run_query(db, "SELECT (SELECT count(*) FROM instances) - (SELECT count(*) FROM failures) AS d")
    diff = base.to_pylist()[0]["d"]
    done = threading.Event()
    errors: list[BaseException] = []

    def write() -> None:
        try:
            for i in range(30):
                shard = SHARDS[i % len(SHARDS)]
                store.con.execute("BEGIN TRANSACTION")
                store.con.execute(
                    f"INSERT INTO part_{shard}.instances (instance_id, boot_id, state) VALUES ('w-{i}', 'b', 'x')"
                )
                store.con.execute(
                    f"INSERT INTO part_{shard}.failures (failure_id, instance_id) VALUES ('f-{i}', 'w-{i}')"
                )
                store.con.execute("COMMIT")
        except BaseException as exc:  # reported by the test
            errors.append(exc)
        finally:
            done.set()

    def read() -> None:  # three readers at once, as a dashboard's sessions: one shared reader per process
        try:
            seen = 0
            while not done.is_set() or seen == 0:
                d = run_query(
                    db, "SELECT (SELECT count(*) FROM instances) - (SELECT count(*) FROM failures) AS d", prelude=VIEWS
                )
                assert d.to_pylist()[0]["d"] == diff
                seen += 1
        except BaseException as exc:  # reported by the test
            errors.append(exc)

    threads = [threading.Thread(target=write)] + [threading.Thread(target=read) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert run_query(db, "SELECT count(*) AS n FROM failures WHERE failure_id LIKE 'f-%'").to_pylist() == [{"n": 30}]


def test_a_copy_older_than_the_snapshots_maintenance_kept_is_made_afresh(sharded):
    """Maintenance expires old snapshots, and with them the record of what they changed: a copy older than the
    oldest kept snapshot cannot tell what changed since, so it is all copied again."""
    db, _, store = sharded
    count = "SELECT count(*) AS n FROM instances"
    n = run_query(db, count).to_pylist()[0]["n"]
    store.con.execute("INSERT INTO part_2.instances (instance_id, boot_id, state) VALUES ('i-x', 'b', 'started')")
    store.con.execute("INSERT INTO part_0.failures (failure_id, instance_id) VALUES ('f-x', 'i-x')")
    store.con.execute("CALL ducklake_expire_snapshots('lake', older_than => now())")
    assert run_query(db, count).to_pylist()[0]["n"] == n + 1


def test_however_a_statement_spells_a_name_it_reads_the_latest_snapshot(sharded):
    """Qualified, quoted, in another case: every spelling of a shard table or a view reads what was just committed
    (the copy is told what a statement reads from its words, not from one spelling)."""
    db, _, store = sharded
    spellings = [
        "SELECT count(*) AS n FROM main.instances",
        'SELECT count(*) AS n FROM "INSTANCES"',
        'SELECT count(*) AS n FROM part_1."instances"',
        "SELECT count(*) AS n FROM main.fleet",
    ]
    before = {sql: run_query(db, sql).to_pylist()[0]["n"] for sql in spellings}
    store.con.execute("INSERT INTO part_1.instances (instance_id, boot_id, state) VALUES ('i-spelled', 'b', 'x')")
    for sql in spellings:
        assert run_query(db, sql).to_pylist()[0]["n"] == before[sql] + 1, sql


def test_the_console_s_catalog_names_each_table_and_view_once(sharded):
    """The reader's copy defines the lake's names again in its own database: the console's help lists each once."""
    from flightrec.analytics import queries

    db, file, _ = sharded
    run_query(db, "SELECT count(*) FROM fleet, log_lines", prelude=VIEWS)  # the copy defines both
    names = [r["name"] for r in queries.catalog(db).to_pylist()]
    assert len(names) == len(set(names)), sorted(n for n in set(names) if names.count(n) > 1)
    assert {"fleet", "instances", "log_lines"} <= set(names)


def test_the_small_event_tables_are_copied_and_a_commit_s_new_rows_appended(sharded):
    """The event tables of rows per boot (not per line) are read from the copy, not the lake: each statement on the
    lake pays catalog round trips per table (the Cost page's statements read instance_facts and manager_events). A
    commit that only added rows adds them to the copy (DuckLake's change feed); any other change copies it again."""
    db, file, store = sharded
    events = "SELECT count(*) AS n, count(DISTINCT event_id) AS ids FROM lifecycle_events"
    first = run_query(db, events).to_pylist()[0]
    copy = _copy(db)
    assert "lifecycle_events" in copy.copied, "lifecycle_events was read from the lake, not copied"
    assert _rows(db, "SELECT * FROM stage_runs") == _rows(file, "SELECT * FROM stage_runs")
    copied, appended = copy.tables_copied, copy.tables_appended
    store.con.execute(
        "INSERT INTO main.lifecycle_events SELECT * REPLACE (event_id || '-again' AS event_id) "
        "FROM main.lifecycle_events"
    )
    assert run_query(db, events).to_pylist()[0] == {"n": 2 * first["n"], "ids": 2 * first["ids"]}
    assert (copy.tables_copied, copy.tables_appended) == (copied, appended + 1), "the new rows were not appended"
    store.con.execute("INSERT INTO main.lifecycle_events SELECT * FROM main.lifecycle_events LIMIT 1")
    store.con.execute("DELETE FROM main.lifecycle_events WHERE event_id LIKE '%-again'")  # not only added: copied
    assert run_query(db, events).to_pylist()[0] == {"n": first["n"] + 1, "ids": first["ids"]}
    assert copy.tables_copied == copied + 1
    assert run_query(db, "SELECT count(*) AS n FROM lake.main.lifecycle_events").to_pylist()[0]["n"] == first["n"] + 1


def test_an_event_table_s_copy_holds_each_row_once_across_maintenance(sharded):
    """Maintenance moves rows the catalog inlined out to Parquet and merges files: the same rows in new places,
    which the copy must not take for added ones."""
    db, _, store = sharded
    events = "SELECT count(*) AS n FROM lifecycle_events"
    n = run_query(db, events).to_pylist()[0]["n"]
    for i in range(3):  # small commits: inlined in the catalog
        store.con.execute(
            f"INSERT INTO main.lifecycle_events SELECT * REPLACE (event_id || '-{i}' AS event_id) "
            "FROM main.lifecycle_events LIMIT 2"
        )
        assert run_query(db, events).to_pylist()[0]["n"] == n + 2 * (i + 1)
    done = lakes.maintain(store.con, "lake", keep_snapshots=timedelta(days=1))
    assert done.rows_flushed or done.files_merged, done  # maintenance moved something: the case this test is for
    assert run_query(db, events).to_pylist()[0]["n"] == n + 6
    store.con.execute("INSERT INTO main.lifecycle_events SELECT * FROM main.lifecycle_events LIMIT 1")
    assert run_query(db, events).to_pylist()[0]["n"] == n + 7
    assert run_query(db, "SELECT count(*) AS n FROM lake.main.lifecycle_events").to_pylist()[0]["n"] == n + 7


def test_a_table_never_written_is_copied_without_a_scan_and_its_first_rows_are_seen(sharded):
    """A shard table that never held a row is copied empty, its columns only (DuckLake's scan of an empty table costs
    ~30-60 ms of catalog round trips, ~0.5 s of a cold page over six shards); the first rows a small commit writes
    into it (inlined in the catalog) are seen at the next statement."""
    db, _, store = sharded
    empty = [s for s in SHARDS if not store.con.execute(f"SELECT count(*) FROM part_{s}.heartbeats").fetchone()[0]]
    assert empty, "the fixture's heartbeats are in every shard: this test needs an empty one"
    count = "SELECT count(*) AS n FROM heartbeats"
    n = run_query(db, count).to_pylist()[0]["n"]
    copy = _copy(db)
    assert {f"part_{s}" for s in empty} <= {schema for schema, table in copy.copied_empty if table == "heartbeats"}
    columns = "SELECT column_name, data_type FROM duckdb_columns() WHERE schema_name = ? AND table_name = 'heartbeats'"
    lake_columns = store.con.execute(columns.replace("WHERE", "WHERE database_name = 'lake' AND"), [f"part_{empty[0]}"])
    copy_columns = run_query(
        db, columns.replace("?", f"'part_{empty[0]}'").replace("WHERE", "WHERE database_name = 'memory' AND")
    )
    assert [tuple(r.values()) for r in copy_columns.to_pylist()] == lake_columns.fetchall()
    store.con.execute(
        f"INSERT INTO part_{empty[0]}.heartbeats (instance_id, boot_id) VALUES ('i-first', 'b')"
    )  # one row: inlined in the catalog
    assert run_query(db, count).to_pylist()[0]["n"] == n + 1
    assert run_query(db, "SELECT instance_id FROM heartbeats WHERE instance_id = 'i-first'").num_rows == 1
