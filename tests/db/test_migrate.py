"""Schema migrations: a new column added by version, the same way, on a file and on a lake; versions recorded."""

from __future__ import annotations

import duckdb
import pytest
from flightrec.db import lake as lakes
from flightrec.db import migrate
from flightrec.db.filestore import FileStore
from flightrec.db.lakestore import LakeStore

from flightrec.errors import MaterializeError


def _with_a_new_column(monkeypatch: pytest.MonkeyPatch, **extra: object) -> migrate.Migration:
    new = migrate.Migration(
        migrate.latest() + 1,
        "a test column",
        (
            migrate.Column("instances", "test_note", "VARCHAR DEFAULT 'noted'"),
            migrate.Column("log_lines", "test_flag", "BOOLEAN"),
        ),
        **extra,
    )
    monkeypatch.setattr(migrate, "MIGRATIONS", migrate.MIGRATIONS + (new,))
    return new


def _versions(con: duckdb.DuckDBPyConnection) -> list[int]:
    return [r[0] for r in con.execute("SELECT version FROM schema_version ORDER BY version").fetchall()]


def _columns(con: duckdb.DuckDBPyConnection, table: str) -> set[str]:
    return {r[0] for r in con.execute(f"DESCRIBE SELECT * FROM {table}").fetchall()}


def test_a_new_file_records_the_latest_version_once(tmp_path):
    db = tmp_path / "f.duckdb"
    FileStore(db, group="t").close()
    FileStore(db, group="t").close()
    con = duckdb.connect(str(db), read_only=True)
    assert _versions(con) == [migrate.latest()]
    con.close()


def test_a_migration_adds_its_column_to_a_file_made_before_it(tmp_path, monkeypatch):
    db = tmp_path / "f.duckdb"
    FileStore(db, group="t").close()
    new = _with_a_new_column(monkeypatch)
    FileStore(db, group="t").close()
    con = duckdb.connect(str(db), read_only=True)
    assert {"test_note"} <= _columns(con, "instances") and {"test_flag"} <= _columns(con, "log_lines")
    assert _versions(con) == [migrate.latest() - 1, new.version]
    con.close()


def test_a_file_from_before_versions_is_placed_by_its_columns():
    assert migrate.baseline(set()) == migrate.latest()  # a new database: nothing to run
    assert migrate.baseline({"stage", "killed_by"}) == migrate.RECORDED_FROM
    assert migrate.baseline({"stage"}) == 0  # before failures.killed_by: every migration runs
    assert [m.version for m in migrate.pending(0)] == sorted(m.version for m in migrate.MIGRATIONS)


def test_every_migration_column_is_in_the_tables_a_new_file_gets(tmp_path):
    db = tmp_path / "f.duckdb"
    FileStore(db, group="t").close()
    con = duckdb.connect(str(db), read_only=True)
    missing = [
        f"{c.table}.{c.name}" for m in migrate.MIGRATIONS for c in m.columns if c.name not in _columns(con, c.table)
    ]
    con.close()
    assert missing == []


@pytest.mark.integration
def test_a_migration_adds_its_column_to_a_lake_made_before_it_in_every_shard(lake, monkeypatch):
    db, data_path = lake
    loc = lakes.lake_location(db, data_path, writing=True)
    LakeStore(loc, "g", shards=[0, 1]).close()
    new = _with_a_new_column(monkeypatch)
    store = LakeStore(loc, "g", shards=[0, 1])
    try:
        assert {"test_note"} <= _columns(store.con, "instances")  # the union of the shards' tables
        for shard in (0, 1):
            assert {"test_note"} <= _columns(store.con, f"part_{shard}.instances")
        assert {"test_flag"} <= _columns(store.con, "log_lines")
        assert _versions(store.con)[-1] == new.version
    finally:
        store.close()


@pytest.mark.integration
def test_a_lake_refuses_a_rebuild_it_cannot_do_and_says_how(lake, monkeypatch):
    from flightrec.db.fold import RawMessage, fold
    from flightrec.schemas import Lifecycle, encode

    db, data_path = lake
    loc = lakes.lake_location(db, data_path, writing=True)
    LakeStore(loc, "g", shards=[0]).close()
    _with_a_new_column(monkeypatch, rebuild_failures=True)
    store = LakeStore(loc, "g", shards=[0])  # no failures rows yet: none to build again, it opens
    try:
        store.claim([0])
        env = dict(instance_id="i-1", boot_id="b-1", ts_us=1_760_000_000_000_000)
        events = [
            Lifecycle(event_id="e-0", seq=0, stage="benchmark", state="started", **env),
            Lifecycle(event_id="e-1", seq=1, stage="benchmark", state="failed", **env),
        ]
        store.commit({0: fold([RawMessage(e.topic, 0, n, None, encode(e)) for n, e in enumerate(events)])})
        assert store.con.execute("SELECT count(*) FROM failures").fetchone() == (1,)
        store.con.execute(f"DELETE FROM main.schema_version WHERE version = {migrate.latest()}")
    finally:
        store.close()
    with pytest.raises(MaterializeError, match="replay the topics into a new lake"):
        LakeStore(loc, "g", shards=[0])
