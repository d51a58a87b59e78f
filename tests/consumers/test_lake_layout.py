"""A writer opening a lake whose layout (shard tables, views) it would make the same leaves it as it is: no catalog
change, so attached readers keep their copies; a layout that differs (a new release's tables or views, a new shard) is
made again."""

from __future__ import annotations

from flightrec.db import lake as lakes
from flightrec.db import lakelayout
from flightrec.db.lakestore import LakeStore
from flightrec.db.query import run_query
from lake_helpers import lake_con

LAYOUT_KINDS = ("created", "altered", "dropped")  # ducklake_snapshots' kinds of a layout change: views_created, …
VIEWS = ("CREATE OR REPLACE VIEW v AS SELECT count(*) AS n FROM instances",)


def _layout_changes(db: str, after: int) -> list[dict]:
    con = lake_con(db)
    try:
        rows = con.execute(
            "SELECT changes FROM ducklake_snapshots('lake') WHERE snapshot_id > ? ORDER BY snapshot_id", [after]
        ).fetchall()
    finally:
        con.close()
    return [c for (c,) in rows if any(k.endswith(LAYOUT_KINDS) for k in c)]


def _latest(db: str) -> int:
    con = lake_con(db)
    try:
        return int(con.execute("SELECT id FROM lake.current_snapshot()").fetchone()[0])
    finally:
        con.close()


def test_a_writer_opening_a_lake_of_its_own_layout_changes_nothing_and_readers_keep_their_copies(lake):
    db, data_path = lake
    loc = lakes.lake_location(db, data_path, writing=True)
    LakeStore(loc, "g", shards=range(3), views=VIEWS).close()
    assert run_query(db, "SELECT n FROM v").to_pylist() == [{"n": 0}]
    copy = lakes._readers[lakes.parse_db(db)][1]
    copied = copy.tables_copied
    before = _latest(db)
    for shards in (range(3), (1,), ()):  # members restarting, with all shards, one, none
        LakeStore(loc, "g", shards=shards, views=VIEWS).close()
    assert _layout_changes(db, before) == []
    assert run_query(db, "SELECT n FROM v").to_pylist() == [{"n": 0}]
    assert copy.tables_copied == copied, "a writer's start made the reader copy the lake again"
    lakes.forget_reader(lakes.parse_db(db))


def test_a_new_release_s_tables_views_and_shards_are_made_on_a_lake_laid_out_before(lake, monkeypatch):
    db, data_path = lake
    loc = lakes.lake_location(db, data_path, writing=True)
    LakeStore(loc, "g", shards=range(2), views=VIEWS).close()
    ddl = lakelayout.ddl()
    monkeypatch.setattr(  # the next release adds a column to a shard table
        lakelayout,
        "ddl",
        lambda: {**ddl, "boots": ddl["boots"] + "ALTER TABLE {schema}.boots ADD COLUMN IF NOT EXISTS later BIGINT;\n"},
    )
    newer = ("CREATE OR REPLACE VIEW v AS SELECT count(*) + 100 AS n FROM instances",)
    store = LakeStore(loc, "g", shards=(1,), views=newer)  # a member of the new release owning shard 1 only
    store.add_shards([2])  # and a new shard
    store.close()
    con = lake_con(db)
    try:
        with_later = {
            r[0]
            for r in con.execute(
                "SELECT schema_name FROM duckdb_columns() WHERE database_name = 'lake' AND table_name = 'boots' "
                "AND column_name = 'later'"
            ).fetchall()
        }
        assert {"part_1", "part_2"} <= with_later, with_later
        assert con.execute("SELECT n FROM v").fetchone()[0] == 100
        assert con.execute("SELECT count(*) FROM claims").fetchone()[0] == 0  # the union reads all 3 shards
        assert con.execute("SELECT count(*) FROM instances").fetchone()[0] == 0
    finally:
        con.close()
    unions = run_query(db, "SELECT sql FROM duckdb_views() WHERE view_name = 'instances' AND database_name = 'lake'")
    assert "part_2" in unions.to_pylist()[0]["sql"]
    lakes.forget_reader(lakes.parse_db(db))


def test_shard_tables_made_by_a_writer_that_died_before_its_views_join_the_views_at_the_next_start(lake, monkeypatch):
    db, data_path = lake
    loc = lakes.lake_location(db, data_path, writing=True)
    LakeStore(loc, "g", shards=range(2), views=VIEWS).close()
    with monkeypatch.context() as m:
        m.setattr(LakeStore, "_create_views", lambda self: None)  # killed between the two transactions
        LakeStore(loc, "g", shards=(2,), views=VIEWS).close()
    LakeStore(loc, "g", shards=(0,), views=VIEWS).close()  # another member's start, owning a shard made before
    con = lake_con(db)
    try:
        sql = con.execute("SELECT sql FROM duckdb_views() WHERE database_name = 'lake' AND view_name = 'instances'")
        assert "part_2" in sql.fetchone()[0]
    finally:
        con.close()
