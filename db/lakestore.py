"""The lake edge: the Store's commit on a DuckLake shared by a consumer group, with claims, fencing and retries.

Layout of the lake. Every partition number p of the topics is a *shard*: the four topics are keyed by instance
id with equal partition counts, so partition p of each holds the same instances, and one group member owns all
four. The event tables (append-only) live in the lake's ``main`` schema, shared by every member: appends never
conflict in DuckLake. The state that is rewritten (the derived tables instances/boots/failures/heartbeats/
running_stages, the consumer offsets and the shard's claim) lives in a schema of its own per shard,
``part_<p>``, so two members never write the same table and never conflict; ``main`` holds one view per such
table (the union of the shards), so readers see one ``instances`` as on a file.

Guarantees: a commit writes its rows, the offsets after them and the check of its claims in one transaction.
When the catalog (PostgreSQL) does not answer, the transaction waits for it (attaching again, up to
``CATALOG_WAIT_S``) and runs again; running a commit again is harmless (events already stored are dropped by
event id, offsets are upserted), so one whose COMMIT reached the catalog before the connection broke is not
doubled.
The check updates the shard's claim row where this member's epoch still stands: a member that claimed the
shard since (epoch + 1) makes the check match nothing (Fenced, nothing written) or, if the two transactions
overlap, DuckLake's conflict check fails one of them (both wrote the claim table). A "Transaction conflict" is
retried (bounded, with jitter) and counted. Use one LakeStore from one thread (the writer thread).
"""

from __future__ import annotations

import contextlib
import logging
import random
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

import duckdb
import pyarrow as pa
import pyarrow.compute as pc
from flightrec.db import lake as lakes
from flightrec.db import lakelayout, migrate, retention
from flightrec.db.classify import RuleTable
from flightrec.db.derive import arrow_views
from flightrec.db.fold import Delta
from flightrec.db.keep import Keep
from flightrec.db.lakederive import OwnedRows, derive_together, join_shards
from flightrec.db.lakelayout import CLAIM_SQL, SHARD_TABLES, never_written, shard_schema
from flightrec.db.liveness import merge_heartbeats
from flightrec.db.nul import without_nul
from flightrec.db.reclassify import START, STEP_STAGES, Step, reclassify_stages
from flightrec.db.retention import StepResult
from flightrec.db.rowwriter import RowWriter, delta_views, offsets_table
from flightrec.db.stats import Stats

from flightrec.errors import Fenced, LakeError, MaterializeError

log = logging.getLogger(__name__)
T = TypeVar("T")

ALIAS = "lake"
RETRIES = 12  # attempts of one transaction that lost a DuckLake commit race
RETRY_BASE_S = 0.05  # first back-off; doubles, capped at 1 s, times a random factor in [0.5, 1.5)
CATALOG_WAIT_S = 120.0  # how long a transaction waits for a catalog that does not answer (under Kafka's 300 s
# max.poll.interval; a rebalance meanwhile stops the member, see docs/lake.md)
CATALOG_POLL_S = (0.5, 5.0)  # first and longest pause between attempts to reach the catalog again
RETAIN_BUDGET_S = 30.0  # retention steps at each maintenance, at most this long (the member's commits wait)
RETAIN_EVENTS = 20_000  # log events judged per step on a lake (each step is a catalog transaction)


def is_conflict(exc: BaseException) -> bool:
    """Whether a DuckDB error is DuckLake's commit race ("Transaction conflict …"): retry it."""
    return "conflict" in str(exc).lower()


class LakeStore(RowWriter):
    """The materialized tables in a DuckLake, written by one member of a consumer group (or a replay); the commit's
    steps: RowWriter (db/rowwriter.py)."""

    def __init__(
        self,
        loc: lakes.LakeLocation,
        group: str,
        rules: RuleTable | None = None,
        mode: str = "materialize",
        memory_limit: str = "512MB",
        views: tuple[str, ...] = (),
        shards: Iterable[int] = (),
        owner: str | None = None,
        retries: int = RETRIES,
    ) -> None:
        self.loc = loc
        self._begin_run(group, rules, mode)
        self.owner = owner or f"{mode}-{uuid.uuid4()}"
        self.retries = retries
        self.epochs: dict[int, int] = {}  # shard -> the epoch this member claimed it at
        self._owned = OwnedRows()  # the owned shards' derived rows, kept between commits
        self._shards: set[int] = set()  # shard schemas known to exist
        self._views_due = False  # the views that unite the shards are not made as they stand (make_views)
        self._offsets_new: set[int] = set()  # claimed shards whose consumer_offsets never held a row (claim)
        self._views = views
        self._memory_limit = memory_limit
        self.catalog_wait = CATALOG_WAIT_S
        self.stop_waiting = threading.Event()  # set by a stopping materializer: a wait for the catalog ends
        self.con = self._attach()
        try:
            ddl = lakelayout.ddl()
            self._retrying("prepare the tables", lambda: self._in_transaction(lambda: self._migrate(ddl)))
            self.add_shards(shards)
        except BaseException:
            self.con.close()
            raise

    @property
    def path(self) -> str:
        """The lake for messages (any password masked)."""
        return self.loc.describe()

    def describe(self) -> str:
        """The lake for messages (any password masked)."""
        return self.loc.describe()

    def _migrate(self, ddl: dict[str, str]) -> None:
        """The lake's own tables and every migration's columns (each shard's tables get theirs in add_shards),
        then the versions newer than the lake's recorded (inside the caller's transaction)."""
        for name, stmt in ddl.items():
            if name not in SHARD_TABLES:
                self.con.execute(stmt.format(schema="main"))
        version = migrate.recorded(self.con)
        todo = migrate.pending(migrate.RECORDED_FROM if version is None else version)  # lakes came after killed_by
        rebuild = [m.what for m in todo if m.rebuild_failures]
        if rebuild and self._holds_failures():
            raise MaterializeError(
                f"the lake {self.path} needs its failures rows built again ({'; '.join(rebuild)}), "
                "which a lake does not do in place: replay the topics into a new lake "
                "(`flightrec replay --db NEW_LAKE`) and point the readers at it"
            )
        if version is None or todo:
            migrate.record(self.con, todo or migrate.pending(0)[-1:], self.run_id, self.started_us)

    def _holds_failures(self) -> bool:
        """Whether the lake has failures rows (a new one, or one whose shards show none, has none to build again)."""
        try:
            return self.con.execute("SELECT 1 FROM main.failures LIMIT 1").fetchone() is not None
        except duckdb.CatalogException:  # no shard yet: its view is made with the first
            return False

    def _attach(self) -> duckdb.DuckDBPyConnection:
        """Attach read-write; two members creating a new lake at once may race: the loser retries."""
        for attempt in range(self.retries + 1):
            try:
                con = lakes.connect(self.loc, alias=ALIAS)
                try:
                    con.execute(f"SET memory_limit = '{self._memory_limit}'")
                    con.execute("SET TimeZone = 'UTC'")
                except BaseException:
                    con.close()
                    raise
                return con
            except OSError as exc:  # the data path's folder cannot be made (a mount gone, no permission)
                raise MaterializeError(f"cannot open the lake for writing: its data path: {exc}") from exc
            except LakeError as exc:
                text = str(exc).lower()
                if attempt == self.retries or not any(
                    w in text for w in ("conflict", "duplicate", "already exists", "unique")
                ):
                    raise MaterializeError(f"cannot open the lake for writing: {exc}") from exc
                self._back_off(attempt)
        raise AssertionError("unreachable")

    # -- transactions -----------------------------------------------------------------------------------

    def _back_off(self, attempt: int) -> None:
        time.sleep(min(1.0, RETRY_BASE_S * 2**attempt) * random.uniform(0.5, 1.5))

    def _in_transaction(self, fn: Callable[[], T]) -> T:
        con = self.con
        con.execute("BEGIN TRANSACTION")
        try:
            out = fn()
            con.execute("COMMIT")
        except BaseException:
            try:  # on a connection the catalog dropped these fail too; the error to report is the first one
                con.execute("ROLLBACK")
                con.execute(f"SET search_path = '{ALIAS}.main'")
            except duckdb.Error:
                pass
            raise
        con.execute(f"SET search_path = '{ALIAS}.main'")
        return out

    def _retrying(self, what: str, fn: Callable[[], T], wait: bool = True) -> tuple[T, Stats]:
        """Run ``fn`` (a whole transaction) until it does not lose a commit race; (its result, the retries counted
        as ``conflicts_retried`` and ``catalog_waits``).

        With ``wait``, a catalog that does not answer is waited for (:meth:`_reattach`) and ``fn`` run again."""
        attempt = waits = 0
        away_since: float | None = None
        while True:
            try:
                return fn(), Stats(conflicts_retried=attempt, catalog_waits=waits)
            except duckdb.Error as exc:
                text = " ".join(lakes.mask_password(str(exc)).split())
                if wait and lakes.is_catalog_away(exc):
                    away_since = time.monotonic() if away_since is None else away_since
                    waits += 1
                    self._reattach(what, text, away_since)
                    continue
                if not is_conflict(exc) or attempt == self.retries:
                    raise MaterializeError(
                        f"could not {what} in the lake {self.path}: {text}"
                        + (f" (after {attempt} retries of a transaction conflict)" if attempt else "")
                    ) from exc
                log.debug("transaction conflict (%s), retry %d: %s", what, attempt + 1, exc)
                self._back_off(attempt)
                attempt += 1

    def _reattach(self, what: str, cause: str, away_since: float) -> None:
        """Wait for the catalog to answer again and attach afresh; MaterializeError after ``catalog_wait`` s."""
        self._offsets_new = set()  # a COMMIT may have reached the catalog before the connection broke: upsert
        log.warning(
            "the lake's catalog does not answer (%s; trying to %s): waiting up to %.0f s for it to come back",
            cause,
            what,
            self.catalog_wait,
        )
        with contextlib.suppress(duckdb.Error):
            self.con.close()
        pause = CATALOG_POLL_S[0]
        while True:
            waited = time.monotonic() - away_since
            if waited >= self.catalog_wait:
                raise MaterializeError(
                    f"could not {what} in the lake {self.path}: its catalog has not answered for {waited:.0f} s "
                    f"({cause}); start it again (`flightrec catalog status`) and restart this materializer: "
                    "nothing is lost, it goes on from the offsets stored with the rows"
                )
            if self.stop_waiting.wait(min(pause, max(0.0, self.catalog_wait - waited))):
                raise MaterializeError(
                    f"stopped while waiting for the catalog of the lake {self.path} ({cause}): the batch in hand is "
                    "read again at the next start from the offsets stored with the rows (what of it the catalog "
                    "had already committed is dropped then by event id)"
                )
            pause = min(CATALOG_POLL_S[1], pause * 2)
            try:
                self.con = self._attach()
            except MaterializeError as exc:
                log.debug("the lake's catalog still does not answer: %s", exc)
                continue
            log.warning("the lake's catalog answers again after %.1f s: %s again", time.monotonic() - away_since, what)
            return

    # -- shards, views, claims ---------------------------------------------------------------------------

    def add_shards(self, shards: Iterable[int], *, views: bool = True) -> None:
        """Make sure each shard's schema and tables exist, then the views that unite them (idempotent); with
        ``views=False`` the views wait for :meth:`make_views` (the first commit makes them at the latest).

        What a writer lays out is marked with a comment holding a hash of what made it (a shard's tables: on its
        ``claim``; the views: on ``main.claims``), and a part already marked as this writer would make it is left
        as it is: a member's start changes nothing in the catalog, so readers keep their copies (lakecopy.py)."""
        if want := set(shards) - self._shards:
            self._add_tables(want)
        if views:
            self.make_views()

    def make_views(self, wait: bool = True) -> None:
        """The views over every shard (main.log_lines...) and the readers' views, if add_shards left them due
        (``wait=False``: a catalog that is away is not waited for, as at close)."""
        if self._views_due:
            self._retrying("create the views", lambda: self._in_transaction(self._create_views), wait=wait)
            self._views_due = False

    def _add_tables(self, want: set[int]) -> None:
        ddl = lakelayout.ddl()
        tables = lakelayout.mark("tables", *(ddl[name] for name in SHARD_TABLES), CLAIM_SQL)
        marks = lakelayout.marks(self.con, ALIAS)
        make = sorted(s for s in want if marks.get(shard_schema(s)) != tables)

        def create() -> None:
            for shard in make:
                schema = shard_schema(shard)
                self.con.execute(f"CREATE SCHEMA IF NOT EXISTS {schema}")
                for name in SHARD_TABLES:
                    self.con.execute(ddl[name].format(schema=schema))
                self.con.execute(CLAIM_SQL.format(schema=schema))
                self.con.execute(f"COMMENT ON TABLE {schema}.claim IS '{tables}'")

        if make:
            self._retrying("create the shard tables", lambda: self._in_transaction(create))
        self._shards |= want
        self._views_due = self._views_due or bool(make) or marks.get("main") != self._views_mark()

    def _views_mark(self) -> str:
        return lakelayout.mark("views", *map(str, self._layout_shards()), *self._views)

    def _layout_shards(self) -> list[int]:
        return sorted(set(self._existing_shards()) | self._shards)

    def _existing_shards(self) -> list[int]:
        rows = self.con.execute(
            "SELECT schema_name FROM duckdb_schemas() WHERE database_name = ? AND schema_name LIKE 'part_%'", [ALIAS]
        ).fetchall()
        return sorted(int(r[0].split("_", 1)[1]) for r in rows if r[0].split("_", 1)[1].isdigit())

    def _create_views(self) -> None:
        """main.<table> for each shard table (and main.claims): the union of every shard's; then the readers' views."""
        for stmt in lakelayout.union_views(self._layout_shards()):
            self.con.execute(stmt)
        for stmt in self._views:
            self.con.execute(stmt)
        self.con.execute(f"COMMENT ON VIEW main.claims IS '{self._views_mark()}'")

    def claim(self, shards: Iterable[int]) -> dict[tuple[str, int], int]:
        """Take ownership of ``shards`` (epoch + 1 each, in one transaction); returns their stored next offsets."""
        shards = sorted(set(shards))
        if not shards:
            return {}
        self.add_shards(shards, views=False)  # the claim first: a member reads while the views are made
        now = time.time_ns() // 1000

        def take() -> tuple[dict[int, int], set[int], dict[tuple[str, int], int]]:
            epochs = {}
            empty = never_written(
                self.con, ALIAS
            )  # a new lake's or shard's tables are not read (lakelayout.never_written)
            for s in shards:
                schema = shard_schema(s)
                if (schema, "claim") in empty:
                    epoch = 1  # never claimed (a concurrent first claim conflicts at COMMIT, as any other)
                else:
                    epoch = int(
                        self.con.execute(f"SELECT coalesce(max(epoch), 0) + 1 FROM {schema}.claim").fetchall()[0][0]
                    )
                    self.con.execute(f"DELETE FROM {schema}.claim")
                self.con.execute(f"INSERT INTO {schema}.claim VALUES (?, ?, ?, ?)", [self.owner, epoch, now, now])
                epochs[s] = epoch
            new = {s for s in shards if (shard_schema(s), "consumer_offsets") in empty}
            return epochs, new, self._offsets(s for s in shards if s not in new)

        (epochs, new, offsets), retried = self._retrying("claim partitions", lambda: self._in_transaction(take))
        self.epochs.update(epochs)
        self._offsets_new = (self._offsets_new - set(shards)) | new
        self.totals += retried
        try:  # read the owned shards' derived rows now, not in the first commit (the first events wait less)
            self._owned.ready(self.con, self._owned_schemas(()))
        except duckdb.Error as exc:  # the first commit reads them (and waits for the catalog if it is away)
            self._owned.forget()
            log.warning("could not read the derived rows of shards %s yet: %s", shards, lakes.mask_password(str(exc)))
        log.info("claimed shards %s at epochs %s", shards, [epochs[s] for s in shards])
        return offsets

    def _owned_schemas(self, shards: Iterable[int]) -> dict[str, int]:
        """Each owned shard's schema (and those of ``shards``, a commit's) with the epoch it was claimed at."""
        return {f"{ALIAS}.{shard_schema(s)}": self.epochs.get(s, 0) for s in {*self.epochs, *shards}}

    def release(self, shards: Iterable[int]) -> None:
        """Forget ``shards`` (nothing is written: the next claimer bumps the epoch)."""
        for s in shards:
            self.epochs.pop(s, None)
            self._offsets_new.discard(s)

    def _offsets(self, shards: Iterable[int]) -> dict[tuple[str, int], int]:
        out: dict[tuple[str, int], int] = {}
        for s in shards:
            rows = self.con.execute(
                f'SELECT topic, "partition", next_offset FROM {shard_schema(s)}.consumer_offsets '
                "WHERE consumer_group = ?",
                [self.group],
            ).fetchall()
            out.update({(t, p): o for t, p, o in rows})
        return out

    def offsets(self) -> dict[tuple[str, int], int]:
        """The next offset to read per (topic, partition) for this group, every shard."""
        return self._offsets(sorted(set(self._existing_shards()) | self._shards))

    def holds_events(self) -> bool:
        """Whether any event is stored (a replay builds a new lake only)."""
        return bool(self.con.execute("SELECT count(*) FROM (SELECT 1 FROM main.events_seen LIMIT 1)").fetchall()[0][0])

    # -- commits -----------------------------------------------------------------------------------------

    def _check_claims(self, shards: Iterable[int], now: int) -> None:
        """In the commit's transaction: touch each shard's claim row where our epoch still stands; Fenced if not."""
        lost = []
        for s in shards:
            epoch = self.epochs.get(s)
            n = (
                0
                if epoch is None
                else self.con.execute(
                    f"UPDATE {shard_schema(s)}.claim SET last_commit_us = ? WHERE owner = ? AND epoch = ?",
                    [now, self.owner, epoch],
                ).fetchall()[0][0]
            )
            if n != 1:
                lost.append(s)
        if lost:
            raise Fenced(
                f"partitions {lost} were claimed by another member of group {self.group}; this member "
                "drops them and wrote nothing of the batch",
                tuple(lost),
            )

    def commit(self, deltas: Mapping[int, Delta], *, check_claims: bool = True) -> Stats:
        """Write each shard's Delta and the offsets after it, with the claim check, in one transaction.

        Raises Fenced (nothing written) when a shard was claimed by another member; retries a DuckLake
        transaction conflict. ``check_claims=False`` exists for the test that shows what the check prevents.
        """
        shards = sorted(s for s, d in deltas.items() if d.messages or d.offsets)
        if not shards:
            return Stats()
        self.make_views()  # readers find the rows through them

        # a lake's text holds no NUL (db/nul.py): made so once, not at every retry of the transaction
        views = {s: {k: without_nul(v) for k, v in delta_views(deltas[s]).items()} for s in shards}
        together = join_shards(shards, deltas, views)

        def write() -> Stats:
            total = Stats()
            if check_claims:
                self._check_claims(shards, time.time_ns() // 1000)
            if together is not None:
                return self._write_together(shards, deltas, views, *together)
            self._owned.forget()  # shard after shard writes derived rows past the kept ones: read them again
            for s in shards:
                delta = deltas[s]
                self.con.execute(f"SET search_path = '{ALIAS}.{shard_schema(s)},{ALIAS}.main'")
                with arrow_views(self.con, **views[s]):
                    total += self._write(delta)
                    self._store_shard_offsets(s, delta)
            return total

        def attempt() -> Stats:
            try:
                return self._in_transaction(write)
            except BaseException:
                self._owned.forget()  # its rows were written in the transaction that failed
                raise

        try:
            stats, retried = self._retrying("commit a batch", attempt)
        except Fenced:
            self.totals += Stats(fenced=1)
            raise
        stats += retried
        self.totals += stats
        self.last_commit_us = time.time_ns() // 1000
        self._offsets_new -= {s for s in shards if deltas[s].offsets}
        return stats

    def reclassify(self, shard: int, cursor: tuple[str, str, str] = START, limit: int = STEP_STAGES) -> Step:
        """One step of classing the stored failures of ``shard`` again by ``rules`` (db/reclassify.py), in one
        transaction with the check of this member's claim of it, as a commit's (Fenced: nothing written; a step that
        found nothing to write checks nothing); run again when it loses a commit race or the catalog is away."""
        schema = shard_schema(shard)

        def step() -> Step:
            self.con.execute(f"SET search_path = '{ALIAS}.{schema},{ALIAS}.main'")
            done = reclassify_stages(self.con, self.rules, cursor, limit)
            if done.stages:  # a step that wrote nothing needs no claim (a member's start looks at each shard)
                self._check_claims([shard], time.time_ns() // 1000)
            return done

        try:
            done = self.transaction(f"class the failures of shard {shard} again", step)
        except BaseException:
            self._owned.forget()
            raise
        if done.rows != done.stages:  # a stage lost its failures row: the kept keys (OwnedRows) are read again
            self._owned.forget()
        return done

    def _store_shard_offsets(self, shard: int, delta: Delta) -> None:
        """The next offsets of ``shard`` (its schema on the search path): an INSERT into a table empty at the claim (a
        MERGE costs more round trips), else a MERGE. Another writer would have claimed it: this commit's check fences
        it."""
        if shard not in self._offsets_new or not delta.offsets:
            return self._store_offsets(delta)
        with arrow_views(self.con, _d_offsets=offsets_table(self.group, delta.offsets)):
            self.con.execute("INSERT INTO consumer_offsets BY NAME SELECT * FROM _d_offsets")

    def _write_together(
        self,
        shards: list[int],
        deltas: Mapping[int, Delta],
        views: Mapping[int, dict[str, pa.Table]],
        delta: Delta,
        joined: dict[str, pa.Table],
    ) -> Stats:
        """One commit's shards with each shared table written once: the events and their rows, then manager events
        and dead letters, for all the shards' Deltas joined (``delta``, its views ``joined``), in ``main``; each
        shard's heartbeats and offsets in its own schema, for its own new events; the derived rows of all of them
        computed once and written to each instance's shard (lakederive.derive_together). The same rows as writing
        the shards one after another (RowWriter._write each), in a fraction of the statements."""
        self.con.execute(f"SET search_path = '{ALIAS}.main'")
        with arrow_views(self.con, **joined):
            new, conflicts, lines = self._write_events(delta)
        mine: dict[str, pa.Array] = {}  # each shard's schema: its instances among the new events
        for s in shards:
            self.con.execute(f"SET search_path = '{ALIAS}.{shard_schema(s)},{ALIAS}.main'")
            ids = deltas[s].events.column("event_id")
            new_s = new.filter(pc.is_in(new["event_id"], ids))
            if new_s.num_rows and views[s]["_d_heartbeats"].num_rows:
                merge_heartbeats(self.con, views[s]["_d_heartbeats"], new_s)
            mine[f"{ALIAS}.{shard_schema(s)}"] = pc.unique(new_s["instance_id"])
            self._store_shard_offsets(s, deltas[s])
        self.con.execute(f"SET search_path = '{ALIAS}.main'")
        owned = self._owned_schemas(shards)
        failures = (
            derive_together(self.con, self.rules, self._owned, owned, mine, new, f"{ALIAS}.main") if new.num_rows else 0
        )
        with arrow_views(self.con, **joined):
            dead = self._write_shared(delta)
        return self._stats(delta, new, conflicts, lines, failures, dead)

    def _stored_events(self) -> str:
        # as _insert_events: an id of this batch stored with the same ts_us sits in the files of its ts_us range (an
        # id reused with another ts_us is not found here: the lake stores it as a new event)
        return (
            "(SELECT * FROM main.events_seen WHERE ts_us BETWEEN (SELECT min(ts_us) FROM _d_events) "
            "AND (SELECT max(ts_us) FROM _d_events))"
        )

    def _insert_events(self) -> pa.Table:
        # A duplicate is the same event (same bytes, same ts_us), so only files whose ts_us range overlaps the
        # batch's can hold one: DuckLake prunes the others by the catalog's column statistics, so the check does not
        # grow with the lake.
        lo, hi = self.con.execute("SELECT min(ts_us), max(ts_us) FROM _d_events").fetchall()[0]
        new = self.con.execute(
            """SELECT instance_id, boot_id, stage, event_id, kind FROM _d_events
                                  ANTI JOIN (SELECT event_id FROM main.events_seen WHERE ts_us BETWEEN ? AND ?)
                                  USING (event_id)""",
            [lo, hi],
        ).to_arrow_table()
        if new.num_rows:
            with arrow_views(self.con, _new_events=new):
                self.con.execute(
                    "INSERT INTO main.events_seen BY NAME SELECT * FROM _d_events "
                    "SEMI JOIN _new_events USING (event_id)"
                )
        return new

    # -- bookkeeping, maintenance, close -----------------------------------------------------------------

    def record_run(self) -> None:
        """This run's row of materializer_runs (its own short transaction: the table is shared by members)."""
        row = self._run_row()

        def write() -> None:
            self.con.execute("DELETE FROM main.materializer_runs WHERE run_id = ?", [self.run_id])
            self.con.execute("INSERT INTO main.materializer_runs VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", row)

        try:  # not waited for: a run's row is bookkeeping, and close() must not hang on a catalog that is away
            self._retrying("record the run", lambda: self._in_transaction(write), wait=False)
        except MaterializeError as exc:
            log.warning("%s", exc)

    def transaction(self, what: str, fn: Callable[[], T]) -> T:
        """``fn`` in one transaction, run again when it loses a commit race or the catalog is away (a purge, a
        retention step); the retries are counted in ``totals``."""
        result, retried = self._retrying(what, lambda: self._in_transaction(fn))
        self.totals += retried
        return result

    def reopen(self) -> None:
        """Attach the lake afresh (after DuckDB invalidated the connection: a write that found no room)."""
        self._owned.forget()
        with contextlib.suppress(duckdb.Error):
            self.con.close()
        self.con = self._attach()

    def retain(self, keep: Keep, budget_s: float = RETAIN_BUDGET_S) -> StepResult:
        """Retention steps (db/retention.py) for up to ``budget_s``, each its own transaction; the rows they delete
        leave the Parquet files at the next maintain() (files mostly deleted are written anew)."""
        total = StepResult()
        deadline = time.monotonic() + budget_s
        while time.monotonic() < deadline:
            result = self.transaction(
                "expire old rows", lambda: retention.step(self.con, keep, max_events=RETAIN_EVENTS)
            )
            total += result
            if result.done:
                break
        if total.lines_deleted or total.samples_merged:
            log.info("retention: %d lines expired, %d samples merged", total.lines_deleted, total.samples_merged)
        return total

    def maintain(self) -> lakes.Maintenance | None:
        """One maintenance pass (flightrec.db.lake.maintain); a failure is logged, never fatal to the writer."""
        try:
            return lakes.maintain(self.con, ALIAS)
        except (LakeError, duckdb.Error) as exc:
            log.warning("lake maintenance failed (the writers are unaffected; next pass later): %s", exc)
            return None

    def load_file(self, path: str) -> dict[str, int]:
        """Copy the rows of every table of the DuckDB file ``path`` into the lake, in one transaction, laid out as
        members write them: the event tables into ``main``, each rewritten table's rows into the shard
        ``hash(instance_id) % shards`` (of the shards this store holds). For benchmarks and tests; returns rows by
        table."""
        shards = sorted(self._shards)
        if not shards:
            raise MaterializeError("load_file needs a store that holds shards (LakeStore(..., shards=[...]))")
        con, rows = self.con, {}
        con.execute(f"ATTACH {lakes._quote(path)} AS src (READ_ONLY)")
        try:
            tables = con.execute("SELECT table_name FROM duckdb_tables() WHERE database_name = 'src'").fetchall()

            def copy() -> None:
                for (table,) in tables:
                    if table not in SHARD_TABLES:
                        con.execute(f"INSERT INTO main.{table} BY NAME SELECT * FROM src.main.{table}")
                        continue
                    keyed = any(c[0] == "instance_id" for c in con.execute(f"DESCRIBE src.main.{table}").fetchall())
                    for i, shard in enumerate(shards):
                        where = f"hash(instance_id) % {len(shards)} = {i}" if keyed else ("true" if i == 0 else "false")
                        con.execute(
                            f"INSERT INTO {shard_schema(shard)}.{table} BY NAME SELECT * FROM src.main.{table} "
                            f"WHERE {where}"
                        )

            self._in_transaction(copy)
            for (table,) in tables:
                rows[table] = int(con.execute(f"SELECT count(*) FROM src.main.{table}").fetchall()[0][0])
        finally:
            con.execute("DETACH src")
        return rows

    def close(self) -> None:
        """Make the views if they are still due, record the run and detach."""
        try:
            try:
                self.make_views(wait=False)
            except MaterializeError as exc:  # the next writer makes them
                log.warning("%s", exc)
            self.record_run()
            self.con.close()
        except duckdb.Error as exc:
            log.warning("closing the lake %s: %s", self.path, exc)


def describe(con: duckdb.DuckDBPyConnection) -> list[dict[str, Any]]:
    """The claims of a lake (shard, owner, epoch), for tests and operators."""
    return con.execute("SELECT shard, owner, epoch FROM main.claims ORDER BY shard").to_arrow_table().to_pylist()
