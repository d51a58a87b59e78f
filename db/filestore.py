"""The DuckDB edge: schema, one transaction per Delta (rows + offsets together), run bookkeeping.

Guarantees: a Delta's rows, its dead letters and the consumer offsets after it
commit atomically or not at all, so a process killed at any moment restarts
from offsets that match the rows; an event_id already stored is dropped (its
rows are not written again). Rows go in as Arrow batches. Use one FileStore from
one thread (the writer thread); readers use their own cursors (see serve.py).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import time
from collections.abc import Mapping
from pathlib import Path

import duckdb
import pyarrow as pa
from flightrec.db import migrate
from flightrec.db.classify import RuleTable
from flightrec.db.derive import arrow_views, recompute_failures
from flightrec.db.fold import Delta
from flightrec.db.query import writer_notice_path
from flightrec.db.rowwriter import ROWS_BY_EVENT, RowWriter, delta_views
from flightrec.db.snapshot import Publisher
from flightrec.db.stats import Stats

from flightrec.errors import MaterializeError

log = logging.getLogger(__name__)
OOM_TRIES = 3  # a commit that meets "Out of Memory" is run again this often in all
# A snapshot's write-ahead log is replayed by each reader that opens it (its time grows with the log's size): past this
# much, the materializer checkpoints before it publishes (at today's rates every few seconds; a backlog's large commits
# are written straight into the file and leave the log small).
SNAPSHOT_WAL_BYTES = 4 << 20


def _ask_readers_to_leave(db: Path) -> Path | None:
    """Write the notice that makes flightrec's file-path readers give the file up."""
    notice = writer_notice_path(db)
    tmp = notice.with_name(notice.name + f".{os.getpid()}")
    try:
        tmp.write_text(f"{os.getpid()}\n")
        tmp.replace(notice)
    except OSError as exc:
        log.warning("cannot ask readers of %s to leave (%s); waiting for them", db, exc)
        return None
    return notice


class LockHeld(MaterializeError):
    """Another process held the file past the wait: ``holder`` says who (:func:`lock_holder`)."""

    def __init__(self, holder: str) -> None:
        super().__init__(f"held by {holder}")
        self.holder = holder


def connect_giving_way(path: Path, lock_wait: float, what: str) -> duckdb.DuckDBPyConnection:
    """The DuckDB file ``path`` opened for writing (a materializer's store, a compaction). flightrec's readers on the
    file leave when asked (the notice, flightrec.db.query.writer_notice_path); anything else holding it is waited for
    up to ``lock_wait`` s, then named (LockHeld, from DuckDB's lock error). Any other refusal: MaterializeError saying
    ``what`` the file was opened for ("for writing", "to compact it")."""
    deadline = time.monotonic() + lock_wait
    notice: Path | None = None
    try:
        while True:
            try:
                return duckdb.connect(str(path))
            except duckdb.IOException as exc:
                if "lock" not in str(exc).lower():
                    raise MaterializeError(f"cannot open {path} {what}: {exc}") from exc
                if notice is None:
                    notice = _ask_readers_to_leave(path)
                if time.monotonic() >= deadline:
                    raise LockHeld(lock_holder(str(exc))) from exc
                time.sleep(0.1)
    finally:
        if notice is not None:
            notice.unlink(missing_ok=True)


def lock_holder(message: str) -> str:
    """Who holds the file, from DuckDB's lock error: 'pid N (command line)' when it can tell."""
    m = re.search(r"PID (\d+)", message)
    if not m:
        return "another process"
    pid = int(m.group(1))
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        command = " ".join(a.decode("utf-8", "replace") for a in argv if a)
    except OSError:
        command = ""
    command = command if len(command) <= 200 else command[:199] + "…"
    return f"pid {pid} ({command})" if command else f"pid {pid}"


class FileStore(RowWriter):
    """One writable DuckDB database holding the materialized tables and the consumer offsets (the commit's steps:
    RowWriter, db/rowwriter.py)."""

    def __init__(
        self,
        path: str | Path,
        group: str,
        rules: RuleTable | None = None,
        mode: str = "materialize",
        memory_limit: str = "512MB",
        lock_wait: float = 30.0,
        views: tuple[str, ...] = (),
        publish: bool = True,
        snapshots: Publisher | None = None,
    ) -> None:
        self.path = Path(path)
        self._begin_run(group, rules, mode)
        self._totals_before = self.totals
        self.publisher: Publisher | None = None  # the readers' snapshots (flightrec.db.snapshot)
        self._wrote = False  # written outside commit() since the last publish
        crashed = Path(f"{self.path}.wal").exists()  # the last writer did not close (checked before DuckDB replays it)
        self.con = self._connect(lock_wait)
        try:
            if snapshots is None and publish and str(path) != ":memory:":  # first: readers wait for its snapshot
                self.publisher = Publisher(self.path, self._block_size())
            self.con.execute(f"SET memory_limit = '{memory_limit}'")
            self.con.execute("SET checkpoint_threshold = '64MB'")
            self._migrate(self._columns("failures"))
            if crashed or self._lines_unaccounted():
                self._drop_rows_without_event()
            self._store_views(views)
            # Nothing the writer does needs files (readers never share this instance: they read snapshots).
            self.con.execute("SET enable_external_access = false")
            self.con.execute("SET autoload_known_extensions = false")
            self.con.execute("SET autoinstall_known_extensions = false")
            self.con.execute("SET python_enable_replacements = false")
            self.con.execute("SET GLOBAL TimeZone = 'UTC'")  # TIMESTAMPTZ in UTC, as readers see it
            # Last: from here on no connection of this database can change any setting
            # (memory_limit, threads, default_order ...).
            self.con.execute("SET lock_configuration = true")
            self._commits_before = int(
                self.con.execute("SELECT coalesce(sum(commits), 0) FROM materializer_runs").fetchall()[0][0]
            )
        except duckdb.Error as exc:
            self._close_all()
            raise MaterializeError(f"cannot prepare the tables in {self.path}: {exc}") from exc
        except BaseException:
            self._close_all()
            raise
        if snapshots is not None:
            self._adopt(snapshots)
        self.publish()

    def _adopt(self, snapshots: Publisher) -> None:
        """Take over the readers' snapshots of the store this one replaces (:meth:`detach`), once the file is open:
        readers kept reading them meanwhile. The next publish copies the file (whole when it is another file)."""
        try:
            snapshots.follow(self._block_size())
        except (OSError, duckdb.Error) as exc:
            self._close_all()
            raise MaterializeError(f"cannot publish snapshots of {self.path} again: {exc}") from exc
        self.publisher, self._wrote = snapshots, True

    def detach(self) -> Publisher | None:
        """Close the database but not the readers' snapshots (a compaction, a reopen after a full disk): the
        pointer stays, so readers go on reading the last copy rather than the file (which they would hold against
        the reopen), and the publisher keeps its descriptors. Hand it to the store opened next
        (``open_store(..., snapshots=)``), or :meth:`Publisher.close` and :meth:`Publisher.release` it."""
        publisher, self.publisher = self.publisher, None
        try:
            self.con.close()
        except duckdb.Error as exc:
            log.warning("closing %s: %s", self.path, exc)
        return publisher

    def _block_size(self) -> int:
        """The file's block size (what a snapshot copies in units of)."""
        return int(
            self.con.execute(
                "SELECT block_size FROM pragma_database_size() WHERE database_name = current_database()"
            ).fetchall()[0][0]
        )

    @property
    def commits(self) -> int:
        """The database's commit number: every run's commits, this one's included."""
        return self._commits_before + self.totals.commits

    def unpublished(self) -> bool:
        """Whether commits (or writes between them: :meth:`wrote`) wait for the readers' next snapshot."""
        return self.publisher is not None and (self._wrote or self.publisher.commits != self.commits)

    def wrote(self) -> None:
        """Say that the connection wrote outside :meth:`commit` (how far the input is read, the alerts' outbox):
        the next publish copies it though no commit was counted."""
        self._wrote = True

    def publish(self) -> bool:
        """Make the readers' snapshot hold every commit so far: the changed blocks of the file and its write-ahead log
        copied (flightrec.db.snapshot), after a CHECKPOINT when the log has grown past ``SNAPSHOT_WAL_BYTES`` (a
        reader replays the log when it opens the snapshot). False when it was skipped (readers hold every spare
        copy, the disk refused): nothing is lost, the next publish tries again."""
        if self.publisher is None or not self.unpublished():
            return self.publisher is not None
        try:
            if Path(f"{self.path}.wal").stat().st_size > SNAPSHOT_WAL_BYTES:
                self.con.execute("CHECKPOINT")
        except FileNotFoundError:
            pass
        except duckdb.Error as exc:  # another write under way (the alert sender): the log is copied as it is
            log.info("no CHECKPOINT before this snapshot (%s)", exc)
        wrote, self._wrote = self._wrote, False
        if self.publisher.publish(self.commits, wrote):
            return True
        self._wrote = wrote
        return False

    def _columns(self, table: str) -> set[str]:
        """The columns of ``table`` in the file (empty: a new database)."""
        return {
            r[0]
            for r in self.con.execute(
                "SELECT column_name FROM duckdb_columns() WHERE database_name = "
                "current_database() AND schema_name = 'main' AND table_name = ?",
                [table],
            ).fetchall()
        }

    def _migrate(self, failures_before: set[str]) -> None:
        """The tables and every migration's columns, then the migrations newer than the file's version (their
        rebuilt rows) and their versions recorded, in one transaction: a crash or an error in between leaves the
        file as it was, and the next open does it all again."""
        con = self.con
        con.execute("BEGIN TRANSACTION")
        try:
            con.execute(migrate.schema_sql())
            version = migrate.recorded(con)
            todo = migrate.pending(migrate.baseline(failures_before) if version is None else version)
            for m in todo:
                if m.rebuild_failures:
                    stages = con.execute("SELECT DISTINCT instance_id, boot_id, stage FROM failures").to_arrow_table()
                    n = recompute_failures(con, self.rules, stages)
                    log.info("%s: %d failures rows built again (%s)", self.path, n, m.what)
            if version is None or todo:
                migrate.record(con, todo or migrate.pending(0)[-1:], self.run_id, self.started_us)
            con.execute("COMMIT")
        except Exception as exc:
            con.execute("ROLLBACK")
            raise MaterializeError(
                f"cannot bring the tables of {self.path} to schema version {migrate.latest()}: "
                f"{exc}; the file is as it was (the flightrec that made it still reads it)"
            ) from exc

    def _lines_unaccounted(self) -> bool:
        """Whether log_lines holds another number of rows than the runs' commits wrote (materializer_runs.lines):
        a cut commit's rows kept even though the WAL is gone (e.g. DuckDB checkpointed it at an open that was
        itself killed before its clean-up committed). Two counts, no scan of the rows."""
        stored, written = self.con.execute(
            "SELECT (SELECT count(*) FROM log_lines), (SELECT coalesce(sum(lines), 0) FROM materializer_runs)"
        ).fetchall()[0]
        return bool(stored != written)

    def _drop_rows_without_event(self) -> int:
        """Delete the rows whose event is not in events_seen, after a writer that did not close; returns how many.

        Every row of these tables is written in the transaction that stores its event in events_seen, so such
        a row belongs to a commit a crash cut short. DuckDB 1.5.5 was seen to keep one (SIGKILL just after a large
        commit: its log_lines row groups, written to the file ahead of the commit, survived without the rest of
        the transaction); the restart resumes at the offsets stored before it and writes that batch again, so
        without this its lines would be counted twice. The delete is one anti-join per table, on restarts only.
        """
        con = self.con
        removed = 0
        con.execute("BEGIN TRANSACTION")
        try:
            for table in ROWS_BY_EVENT:
                removed += con.execute(f"""DELETE FROM {table} t WHERE NOT EXISTS
                                           (SELECT 1 FROM events_seen e WHERE e.event_id = t.event_id)""").fetchall()[
                    0
                ][0]
            con.execute("COMMIT")
        except duckdb.Error:
            con.execute("ROLLBACK")
            raise
        if removed:
            log.warning(
                "%s: removed %d rows of a commit cut short by the last writer's crash (their events were not "
                "stored); they are written again from the stored offsets",
                self.path,
                removed,
            )
        return removed

    def _store_views(self, views: tuple[str, ...]) -> None:
        """Create or replace the readers' shared views in the file, so any DuckDB client has them.

        The statements come from whoever wires the parts (the CLI hands analytics' views in);
        one that fails is logged and left out: readers bring their own copy of every view.
        """
        for stmt in views:
            try:
                self.con.execute(stmt)
            except duckdb.Error as exc:
                log.warning(
                    "could not store a view in %s (%s); flightrec readers still have it: %s",
                    self.path,
                    exc,
                    stmt.strip().splitlines()[0][:80],
                )

    def _connect(self, lock_wait: float) -> duckdb.DuckDBPyConnection:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            return connect_giving_way(self.path, lock_wait, "for writing")
        except LockHeld as held:
            raise MaterializeError(
                f"cannot open {self.path} for writing: {held.holder} held it for "
                f"{lock_wait:g}s; stop that process (or let it finish) and start again "
                "(flightrec readers leave by themselves; is another materializer running on it?)"
            ) from held.__cause__
        except (duckdb.Error, OSError) as exc:
            raise MaterializeError(f"cannot open {self.path} for writing: {exc}") from exc

    def offsets(self) -> dict[tuple[str, int], int]:
        """The next offset to read per (topic, partition) for this consumer group."""
        rows = self.con.execute(
            'SELECT topic, "partition", next_offset FROM consumer_offsets WHERE consumer_group = ?', [self.group]
        ).fetchall()
        return {(t, p): o for t, p, o in rows}

    def describe(self) -> str:
        """The database for messages."""
        return str(self.path)

    def commit(self, delta: Delta | Mapping[int, Delta]) -> Stats:
        """Write one Delta and the offsets after it in one transaction; returns what it wrote. Given Deltas by
        shard (the Store interface), each is committed so in turn: a file holds every shard.

        A commit that meets "Out of Memory" is rolled back and runs again, up to OOM_TRIES times; nothing of a
        failed try stays.
        """
        if not isinstance(delta, Delta):
            total = Stats()
            for _, one in sorted(delta.items()):
                total += self.commit(one)
            return total
        for attempt in range(1, OOM_TRIES + 1):
            try:
                return self._commit_once(delta) + Stats(oom_retried=attempt - 1)
            except duckdb.OutOfMemoryException as exc:
                if attempt == OOM_TRIES:
                    raise MaterializeError(
                        f"could not commit a batch to {self.path}: {exc} (tried {attempt} times); raise --memory-limit"
                    ) from exc
                log.warning("a commit ran out of memory (try %d of %d); committing again", attempt, OOM_TRIES)
                time.sleep(0.1 * attempt)
        raise AssertionError("unreachable")

    def _commit_once(self, delta: Delta) -> Stats:
        con = self.con
        self._totals_before = self.totals  # what a rolled-back try restores
        try:
            con.execute("BEGIN TRANSACTION")
            with arrow_views(con, **delta_views(delta)):
                stats = self._write(delta)
                self._store_offsets(delta)
                self._bookkeeping(stats)
            con.execute("COMMIT")
            if self.publisher is not None:
                self.publisher.committed(self.commits, self.last_commit_us)
        except duckdb.Error as exc:
            with contextlib.suppress(duckdb.Error):
                con.execute("ROLLBACK")
            if isinstance(exc, duckdb.OutOfMemoryException):
                self.totals = self._totals_before  # the bookkeeping of the rolled-back try is undone
                raise
            raise MaterializeError(f"could not commit a batch to {self.path}: {exc}") from exc
        return stats

    def _insert_events(self) -> pa.Table:
        return self.con.execute("""INSERT INTO events_seen BY NAME SELECT * FROM _d_events ON CONFLICT DO NOTHING
                                   RETURNING instance_id, boot_id, stage, event_id, kind""").to_arrow_table()

    def _bookkeeping(self, stats: Stats) -> None:
        self.totals = self.totals + stats
        self.last_commit_us = time.time_ns() // 1000
        self.con.execute(
            "INSERT OR REPLACE INTO materializer_runs VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", self._run_row()
        )

    def _close_all(self) -> None:
        if self.publisher is not None:
            self.publisher.close()
        try:
            self.con.close()
        finally:
            if self.publisher is not None:
                self.publisher.release()  # after DuckDB let the file go: closing a descriptor drops its lock

    def close(self) -> None:
        """Checkpoint and close the database; readers read the file itself from then on."""
        try:
            self._close_all()
        except duckdb.Error as exc:
            log.warning("closing %s: %s", self.path, exc)
