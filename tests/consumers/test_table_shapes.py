"""Every materialized table has exactly the shape its writer's Arrow schema gives it, and the .avsc field types.

A DuckDB file is built by the real fold and store from real events (every event type, a dead
letter); then `DESCRIBE` of each table is compared with the Arrow schema that writes it
(names, order, types), and every column named like an event field has that field's type.
"""

from __future__ import annotations

from typing import Any

import duckdb
import pyarrow as pa
import pytest
from flightrec.db import derive
from flightrec.db import fold as fold_mod
from flightrec.db.filestore import FileStore
from flightrec.db.fold import RawMessage, fold
from flightrec.db.rowwriter import OFFSETS
from flightrec.schemas import EVENT_BY_NAME, EVENT_TYPES, Dropped, Heartbeat, ManagerEvent, encode
from flightrec.schemas.arrow import element_field, event_fields
from materializer_helpers import motivating_boot

# Tables written from an Arrow schema (the fold's, the derived tables', the offsets').
WRITTEN: dict[str, pa.Schema] = {
    **fold_mod.TABLES,
    "failures": derive.FAILURES,
    "boots": derive.BOOTS,
    "consumer_offsets": OFFSETS,
}
# Tables made by SQL over the others (their event-named columns are checked against the .avsc below).
BY_SQL = {"instances", "heartbeats", "running_stages", "materializer_runs", "materializer_progress", "schema_version"}
# LogBatch's per-line arrays land one element per log_lines row (line_ts_us as ts_us).
PER_LINE = {
    "line_no": "line_no",
    "ts_us": "line_ts_us",
    "text": "text",
    "truncated": "truncated",
    "invalid_utf8": "invalid_utf8",
    "late": "late",
}


@pytest.fixture(scope="module")
def con(tmp_path_factory: pytest.TempPathFactory) -> Any:
    b = motivating_boot()
    b.add(Heartbeat, stage="benchmark", interval_s=30.0, pid=100)
    b.add(
        Dropped,
        original_event_id="e-1",
        original_type="flightrec.v1.LogBatch",
        original_topic="flightrec.logs",
        original_bytes=2_000_000,
        stage="benchmark",
        reason="MessageSizeTooLargeError",
    )
    b.add(ManagerEvent, source_id="manager@ctl", kind="destroyed", detail="gone", attributes={"why": "test"})
    assert {type(e) for e in b.events} == set(EVENT_TYPES), "materialize every event type"
    msgs = [RawMessage(e.topic, 0, i, e.instance_id.encode(), encode(e)) for i, e in enumerate(b.events)]
    msgs.append(RawMessage("flightrec.logs", 0, len(msgs), b"x", b"not avro"))
    db = tmp_path_factory.mktemp("shapes") / "flightrec.duckdb"
    store = FileStore(db, group="shapes")
    try:
        store.commit(fold(msgs))
    finally:
        store.close()
    c = duckdb.connect(str(db), read_only=True)
    yield c
    c.close()


def _describe(con: Any, relation: str) -> list[tuple[str, str]]:
    return [(r[0], r[1]) for r in con.execute(f"DESCRIBE {relation}").fetchall()]


def _duckdb_types(schema: pa.Schema) -> list[tuple[str, str]]:
    """What DuckDB makes of an Arrow schema (names, order, types)."""
    c = duckdb.connect()
    c.register("_arrow", schema.empty_table())
    return _describe(c, "_arrow")


def test_the_fold_knows_every_event_type() -> None:
    assert set(fold_mod.KIND) == set(EVENT_BY_NAME), "give the new event type a kind in KIND of db/fold.py"


def test_every_table_is_written_from_an_arrow_schema_or_made_by_sql(con: Any) -> None:
    tables = {r[0] for r in con.execute("SELECT table_name FROM duckdb_tables()").fetchall()}
    assert tables == set(WRITTEN) | BY_SQL, "classify a new table here: written from an Arrow schema or made by SQL"


@pytest.mark.parametrize("table", sorted(WRITTEN))
def test_describe_equals_the_arrow_schema_that_writes_it(con: Any, table: str) -> None:
    assert con.execute(f"SELECT count(*) FROM {table}").fetchone()[0] > 0, f"no row reached {table}"
    assert _describe(con, table) == _duckdb_types(WRITTEN[table])


@pytest.mark.slow
@pytest.mark.parametrize("table", sorted(set(WRITTEN) | BY_SQL))
def test_columns_named_like_event_fields_have_the_avsc_type(con: Any, table: str) -> None:
    types: dict[str, pa.DataType] = {}
    for record in (
        "Lifecycle",
        "InstanceFacts",
        "ProcessExit",
        "Throughput",
        "BenchmarkResult",
        "Sealed",
        "Dropped",
        "Heartbeat",
        "ManagerEvent",
        "LogBatch",
    ):
        for f in event_fields(record):
            types.setdefault(f.name, f.type)
    if table == "log_lines":
        types.update({col: element_field("LogBatch", field).type for col, field in PER_LINE.items()})
    described = _describe(con, table)
    expected = [(name, _duckdb_types(pa.schema([(name, types[name])]))[0][1]) for name, _ in described if name in types]
    assert [(n, t) for n, t in described if n in types] == expected
