"""The steps of one commit that both stores share (RowWriter), and the names of what a commit writes.

A commit, on a file (db/filestore.py, ``FileStore``) or a lake (db/lakestore.py, ``LakeStore``), runs the same steps in
statements both engines take: the batch's events stored once by event id, their rows, the derived tables, manager
events, dead letters, the offsets after the batch, this run's row of materializer_runs. Each store supplies how it
opens, retries and ends the transaction, and how it stores the batch's event ids (``_insert_events``).
"""

from __future__ import annotations

import logging
import time
import uuid

import duckdb
import pyarrow as pa
from flightrec.db.classify import RuleTable, load_rules
from flightrec.db.derive import affected_keys, arrow_views, recompute
from flightrec.db.fold import DEAD, UNCOMPARED, Delta, reused
from flightrec.db.liveness import merge_heartbeats
from flightrec.db.stats import Stats

log = logging.getLogger(__name__)

# The materialized tables (what replay must reproduce), in comparison order.
MATERIALIZED_TABLES: tuple[str, ...] = (
    "instances",
    "boots",
    "lifecycle_events",
    "instance_facts",
    "log_lines",
    "process_exits",
    "throughput",
    "failures",
    "dead_letters",
    "events_seen",
    "heartbeats",
    "manager_events",
    "running_stages",
)
# The tables whose rows are written with their event (same transaction as its events_seen row), keyed by event_id.
ROWS_BY_EVENT: tuple[str, ...] = ("log_lines", "lifecycle_events", "instance_facts", "process_exits", "throughput")
# The Delta's row batches, registered as _d_<name> for the duration of a commit.
DELTA_TABLES: tuple[str, ...] = (
    "events",
    "lifecycle",
    "facts",
    "exits",
    "throughput",
    "logs",
    "dead",
    "heartbeats",
    "manager",
)
OFFSETS = pa.schema(
    [("consumer_group", pa.string()), ("topic", pa.string()), ("partition", pa.int32()), ("next_offset", pa.int64())]
)


def delta_views(delta: Delta) -> dict[str, pa.Table]:
    """The Delta's row batches by the names a commit's statements read them under (``_d_<name>``)."""
    return {f"_d_{name}": getattr(delta, name) for name in DELTA_TABLES}


def offsets_table(group: str, offsets: dict[tuple[str, int], int]) -> pa.Table:
    """The next offset per (topic, partition) as rows of consumer_offsets."""
    return pa.Table.from_pylist(
        [
            {"consumer_group": group, "topic": t, "partition": p, "next_offset": o}
            for (t, p), o in sorted(offsets.items())
        ],
        schema=OFFSETS,
    )


# A dead letter not stored yet (RowWriter._insert_dead): two NOT EXISTS, each an equality join (hashed); one NOT EXISTS
# with an OR was planned as a nested loop over the whole table, whose cost grew with every dead letter stored.
DEAD_INSERT_SQL = """INSERT INTO main.dead_letters BY NAME SELECT * FROM {view} v
    WHERE NOT EXISTS (SELECT 1 FROM main.dead_letters t
                      WHERE t.topic = v.topic AND t."partition" = v."partition" AND t."offset" = v."offset")
      AND NOT EXISTS (SELECT 1 FROM main.dead_letters t
                      WHERE t.event_id = v.event_id AND t.value = v.value AND t.reason = v.reason)"""


# the commit's new lines when it has none: a relation of the columns derive._last_lines reads, without a row
_NO_LINES = (
    "(SELECT NULL::VARCHAR AS instance_id, NULL::VARCHAR AS boot_id, NULL::VARCHAR AS stage, NULL::BIGINT AS seq, "
    "NULL::BIGINT AS line_no, NULL::VARCHAR AS source, NULL::VARCHAR AS text WHERE false)"
)


class RowWriter:
    """The steps of one commit shared by the file (FileStore) and the lake (LakeStore), in statements both engines take
    (DuckLake has no keys, ON CONFLICT or RETURNING: MERGE INTO and NOT EXISTS instead); each store supplies only
    how it stores the batch's event ids (``_insert_events``).

    Runs on ``self.con`` inside a transaction the store opened, with the Delta's tables registered as ``_d_<name>``.
    """

    con: duckdb.DuckDBPyConnection
    rules: RuleTable
    group: str
    run_id: str
    mode: str
    started_us: int
    last_commit_us: int
    totals: Stats

    def _begin_run(self, group: str, rules: RuleTable | None, mode: str) -> None:
        """This run's identity and counters (its row of materializer_runs), the same on a file and a lake."""
        self.group = group
        self.rules = rules or load_rules()
        self.mode = mode
        self.run_id = str(uuid.uuid4())
        self.totals = Stats()  # this run's commits, summed
        self.started_us = time.time_ns() // 1000
        self.last_commit_us = self.started_us

    def _write(self, delta: Delta) -> Stats:
        """The steps of one commit, in order: events, their rows, derived tables, manager events, dead letters."""
        new, conflicts, lines = self._write_events(delta)
        failures = self._write_derived(delta.heartbeats, new, bool(delta.logs.num_rows))
        dead = self._write_shared(delta)
        return self._stats(delta, new, conflicts, lines, failures, dead)

    def _write_events(self, delta: Delta) -> tuple[pa.Table, int, int]:
        """The batch's events and their rows (``_d_<name>`` registered): (the new events' keys, conflicts, lines)."""
        new = self._insert_events()
        conflicts = self._conflicts(delta, new) if new.num_rows < delta.events.num_rows else 0
        lines = 0
        if new.num_rows:
            first_sight = delta.duplicates == 0 and new.num_rows == delta.events.num_rows
            lines = self._insert_rows(delta, new, first_sight)
        return new, conflicts, lines

    def _write_derived(self, heartbeats: pa.Table, new: pa.Table, lines: bool = False) -> int:
        """The derived tables for the new events ``new`` (and their ``heartbeats``; ``lines``: the batch's lines are
        registered as ``_d_logs``); returns failure rows written."""
        if not new.num_rows:
            return 0
        if heartbeats.num_rows:
            merge_heartbeats(self.con, heartbeats, new)
        if not lines:  # no line came in: a failure's stored last lines stay as they are
            return recompute(self.con, self.rules, affected_keys(self.con, new), new_lines=_NO_LINES)
        with arrow_views(self.con, _derive_new=new.select(["event_id"])):
            return recompute(
                self.con,
                self.rules,
                affected_keys(self.con, new),
                new_lines="(SELECT * FROM _d_logs SEMI JOIN _derive_new USING (event_id))",
            )

    def _write_shared(self, delta: Delta) -> int:
        """Manager events and dead letters (``_d_<name>`` registered); returns dead letters written."""
        if delta.manager.num_rows:
            self._insert_new("manager_events", "_d_manager", ("event_id",))
        return self._insert_dead("_d_dead") if delta.dead.num_rows else 0

    @staticmethod
    def _stats(delta: Delta, new: pa.Table, conflicts: int, lines: int, failures: int, dead: int) -> Stats:
        return Stats(
            events_received=delta.messages,
            events_written=new.num_rows,
            lines_written=lines,
            duplicates_dropped=delta.duplicates
            + delta.events.num_rows
            - new.num_rows
            - conflicts
            + delta.dead.num_rows
            - dead,
            dead_letters=dead + conflicts,
            failures_written=failures,
            commits=1,
        )

    def _run_row(self) -> list[object]:
        """This run's row of materializer_runs, in the table's column order (the same on a file and a lake)."""
        t = self.totals
        return [
            self.run_id,
            self.group,
            self.mode,
            self.started_us,
            self.last_commit_us,
            t.commits,
            t.events_received,
            t.lines_written,
            t.duplicates_dropped,
            t.dead_letters,
        ]

    def _stored_events(self) -> str:
        """The relation of stored events_seen rows an id of this batch can be found in (the lake narrows it)."""
        return "main.events_seen"

    def _conflicts(self, delta: Delta, new: pa.Table) -> int:
        """The batch's events whose id is stored already with other bytes (fingerprint): each becomes a dead letter
        with the reason (it is not stored; the first stays). A true redelivery (same bytes) is a duplicate."""
        with arrow_views(self.con, _new_ids=new.select(["event_id"])):
            rows = self.con.execute(f"""SELECT d.event_id, s.seq, s.kind, d.seq, d.kind
                                        FROM (SELECT * FROM _d_events ANTI JOIN _new_ids USING (event_id)) d
                                        JOIN {self._stored_events()} s USING (event_id)
                                        WHERE s.fingerprint IS NOT NULL AND d.fingerprint <> s.fingerprint
                                          AND d.kind NOT IN {UNCOMPARED!r}
                                        """).fetchall()
        if not rows:
            return 0
        dead = []
        for event_id, stored_seq, stored_kind, seq, kind in rows:
            topic, partition, offset, key, value = delta.origins[event_id]
            dead.append(
                {
                    "topic": topic,
                    "partition": partition,
                    "offset": offset,
                    "key": key,
                    "value": value,
                    "reason": reused(event_id, (stored_seq, stored_kind), seq, kind),
                    "event_id": event_id,
                }
            )
        with arrow_views(self.con, _d_conflicts=pa.Table.from_pylist(dead, schema=DEAD)):
            n = self._insert_dead("_d_conflicts")
        log.warning("%d events came again with an event id already stored with other content: dead letters", n)
        return n

    def _insert_events(self) -> pa.Table:
        """Store the batch's event ids (``_d_events``); returns the keys of those stored for the first time:
        instance_id, boot_id, stage, event_id, kind."""
        raise NotImplementedError

    def _insert_new(self, table: str, view: str, key: tuple[str, ...]) -> int:
        """Insert the rows of ``view`` whose ``key`` is not in ``table`` yet (a lake has no keys, so no ON CONFLICT;
        the fold already dropped a batch's own repeats); returns how many."""
        on = " AND ".join(f't."{k}" = v."{k}"' for k in key)
        return int(
            self.con.execute(f"""INSERT INTO main.{table} BY NAME SELECT * FROM {view} v
                                        WHERE NOT EXISTS (SELECT 1 FROM main.{table} t WHERE {on})""").fetchall()[0][0]
        )

    def _insert_dead(self, view: str) -> int:
        """Insert the dead letters of ``view`` not stored yet; returns how many. Stored already: the same Kafka record
        (a replay), or the same event id with the same bytes and reason in another record (Kafka holds the event
        twice: a producer's retry), so each refused event is one dead letter however often it comes."""
        return int(self.con.execute(DEAD_INSERT_SQL.format(view=view)).fetchall()[0][0])

    def _store_offsets(self, delta: Delta) -> None:
        """The next offset per partition after this Delta (same transaction as its rows; MERGE: a lake has no keys)."""
        if not delta.offsets:
            return
        with arrow_views(self.con, _d_offsets=offsets_table(self.group, delta.offsets)):
            self.con.execute("""MERGE INTO consumer_offsets o USING _d_offsets d
                                ON o.consumer_group = d.consumer_group AND o.topic = d.topic
                                   AND o."partition" = d."partition"
                                WHEN MATCHED THEN UPDATE SET next_offset = d.next_offset
                                WHEN NOT MATCHED THEN INSERT BY NAME""")

    def _insert_rows(self, delta: Delta, new: pa.Table, first_sight: bool) -> int:
        """The rows of the new events (a stored event's rows are not written again); returns log lines written."""
        con = self.con
        lines = 0
        with arrow_views(con, _new=new):
            for table, name in (
                ("lifecycle_events", "lifecycle"),
                ("instance_facts", "facts"),
                ("process_exits", "exits"),
                ("throughput", "throughput"),
            ):
                if getattr(delta, name).num_rows:
                    con.execute(f"INSERT INTO {table} BY NAME SELECT * FROM _d_{name} SEMI JOIN _new USING (event_id)")
            if delta.logs.num_rows:
                if first_sight:  # every event of the batch is new: no join needed
                    con.execute("INSERT INTO log_lines BY NAME SELECT * FROM _d_logs")
                    lines = delta.logs.num_rows
                else:
                    lines = con.execute("""INSERT INTO log_lines BY NAME SELECT * FROM _d_logs
                                           SEMI JOIN _new USING (event_id)""").fetchall()[0][0]
        return lines
