"""A materializer on a full disk (consumers/diskfull.py): it holds its batch, says so once (log, /metrics, the marker
the dashboard shows, the webhook), and goes on by itself when there is room: no line lost, none doubled.

The disk is real: a tmpfs of a few MiB mounted for the test (mount(2) needs root, as CI runs; the test fails, never
skips, where it cannot mount), filled with a file the test removes to give the room back.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import duckdb
import pytest
from flightrec.broker.local import free_port
from flightrec.consumers.diskfull import is_disk_full, marker_path, needs_reopen
from flightrec.db.fold import Delta
from flightrec.db.stats import Stats
from materializer_helpers import Boot, publish
from test_metrics import scrape, value

from flightrec.errors import MaterializeError


def assert_every_line_once(db: Path, published: list) -> None:
    """Every line of the published ``full-*`` batches is in the file, and once."""
    con = duckdb.connect(str(db), read_only=True)
    try:
        got = con.execute(
            "SELECT count(*), count(DISTINCT (event_id, line_no)) FROM log_lines WHERE instance_id LIKE 'full-%'"
        ).fetchall()[0]
    finally:
        con.close()
    want = sum(len(e.text) for e in published)
    assert got == (want, want)


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 24 MiB tmpfs at tmp_path/disk, unmounted after."""
    where = tmp_path / "disk"
    where.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=24m", "flightrec-test", str(where)],
                          capture_output=True, text=True)  # fmt: skip
    if made.returncode != 0:
        pytest.fail(f"cannot mount a small tmpfs for the full-disk test (root is needed, as CI has): {made.stderr}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


class Hook:
    """A webhook receiver: the JSON bodies posted to it."""

    def __init__(self) -> None:
        self.bodies: list[dict] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                outer.bodies.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.http.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.http.server_address[1]}/hook"


def fill(disk: Path, leave: int) -> Path:
    """A file taking all the room of ``disk`` but ``leave`` bytes."""
    filler = disk / "filler"
    free = os.statvfs(disk).f_bavail * os.statvfs(disk).f_frsize
    with open(filler, "wb") as f:
        f.write(b"\0" * max(0, free - leave))
    return filler


def chatty(instances: int, batches: int) -> list:
    events = []
    for i in range(instances):
        b = Boot(instance=f"full-{i}-{time.time_ns()}")
        for k in range(batches):
            b.lines("supervisor", "stdout", [f"line {k}.{j} " + "x" * 80 for j in range(400)], first_line=k * 400)
        events += b.events
    return events


def wait(what: str, check: Callable[[], Any], timeout: float = 90.0, proc: subprocess.Popen | None = None) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"the materializer exited while waiting for {what}: {proc.communicate()[1]}")
        try:
            got = check()
        except OSError:
            got = None
        if got:
            return got
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def status(db: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    """`flightrec status` of ``db`` (without Kafka's end offsets)."""
    return subprocess.run(
        [str(Path(sys.executable).with_name("flightrec")), "status", "--db", str(db), "--no-kafka"],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def fill_until_full(bootstrap: str, disk: Path, port: int, proc: subprocess.Popen, published: list) -> Path:
    """Fill ``disk`` but 6 MiB and publish ~1.4 MiB of lines a round (added to ``published``) until the materializer
    on ``port`` says its disk is full; the file that fills it."""
    wait("/metrics", lambda: scrape(port), proc=proc)
    filler = fill(disk, leave=6 << 20)
    full = False
    while not full:
        round_ = chatty(4, 1)
        publish(bootstrap, round_)
        published += round_
        full = bool(
            wait(
                "a commit",
                lambda: (
                    (value(scrape(port), "flightrec_disk_full") == 1)
                    or value(scrape(port), "flightrec_consumer_lag_messages") == 0
                ),
                proc=proc,
            )  # fmt: skip
            and value(scrape(port), "flightrec_disk_full") == 1
        )
        assert len(published) < 400, "the disk never filled"
    return filler


@pytest.mark.slow  # fills a disk through Kafka and gives the room back (~30 s)
def test_a_full_disk_holds_the_batch_and_room_again_resumes_with_every_line_once(kafka, small_disk, env_for):
    db = small_disk / "f.duckdb"
    kafka.seed_at_mark(db)
    hook, port = Hook(), free_port()
    proc = subprocess.Popen(
        [str(Path(sys.executable).with_name("flightrec")), "materialize", "--db", str(db), "--metrics-port", str(port),
         "--metrics-address", "127.0.0.1", "--webhook", hook.url],
        env={**env_for(FLIGHTREC_KEEP_LINES_DAYS="forever"), "PYTHONSAFEPATH": "1"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    published: list = []
    try:
        filler = fill_until_full(kafka.bootstrap, small_disk, port, proc, published)
        assert marker_path(db).exists()  # what the dashboard shows
        said = status(db, env_for())  # and `flightrec status`, from the marker (the writer is not asked)
        assert said.returncode == 3, said.stdout + said.stderr
        assert "\n  materializer    stopped, disk full since " in said.stdout, said.stdout
        assert "(free space: it resumes by itself; nothing is lost)" in said.stdout, said.stdout
        wait("the webhook's alert", lambda: hook.bodies, timeout=20)
        more = chatty(4, 1)  # what comes while the disk is full waits in Kafka
        publish(kafka.bootstrap, more)
        published += more
        time.sleep(3)  # retries meanwhile: still one alert, still full, still running
        assert proc.poll() is None
        assert value(scrape(port), "flightrec_disk_full") == 1 and len(hook.bodies) == 1

        filler.unlink()  # room again
        wait("room again", lambda: value(scrape(port), "flightrec_disk_full") == 0, proc=proc)
        wait("the backlog", lambda: value(scrape(port), "flightrec_consumer_lag_messages") == 0, proc=proc)
        assert not marker_path(db).exists()
        assert "disk full" not in status(db, env_for()).stdout
        wait("the resumed alert", lambda: len(hook.bodies) == 2, timeout=20)
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    full_lines = [line for line in err.splitlines() if "is full" in line]
    assert len(full_lines) == 1 and "nothing is lost" in full_lines[0], err  # said once, in one line
    assert "room again" in err
    assert [b["flightrec"]["kind"] for b in hook.bodies] == ["disk_full", "disk_resumed"]
    assert_every_line_once(db, published)


@pytest.mark.slow  # fills a disk through Kafka (~30 s)
def test_a_run_ended_during_the_wait_is_told_by_status_and_the_next_run_clears_its_marker(
    kafka, small_disk, env_for
) -> None:
    """SIGTERM while the disk is full: the run ends (exit 1) and its marker stays; `flightrec status` says the
    materializer stopped on a full disk and no longer runs. The next run, with room again, takes the marker away
    (it has met no full disk) and commits every line once."""
    db = small_disk / "f.duckdb"
    kafka.seed_at_mark(db)
    env = {**env_for(FLIGHTREC_KEEP_LINES_DAYS="forever"), "PYTHONSAFEPATH": "1"}
    exe, port = str(Path(sys.executable).with_name("flightrec")), free_port()
    proc = subprocess.Popen([exe, "materialize", "--db", str(db), "--metrics-port", str(port)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)  # fmt: skip
    published: list = []
    try:
        filler = fill_until_full(kafka.bootstrap, small_disk, port, proc, published)
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 1 and "read again from Kafka at the next start" in err, err
    said = status(db, env)
    assert said.returncode == 3, said.stdout + said.stderr
    assert "NO materializer is running" in said.stdout, said.stdout
    assert "\n  materializer    stopped on a full disk since " in said.stdout, said.stdout
    assert "and no longer runs (free space, then start it" in said.stdout, said.stdout
    filler.unlink()
    r = subprocess.run([exe, "materialize", "--db", str(db), "--until-idle", "2"], env=env, capture_output=True,
                       text=True, timeout=300)  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert not marker_path(db).exists()
    assert "disk full" not in status(db, env).stdout
    assert_every_line_once(db, published)


@pytest.mark.slow  # a broker of its own, a disk filled (~40 s)
def test_a_replay_stopped_on_a_full_disk_leaves_a_file_no_writer_takes_for_whole(fresh_kafka, small_disk) -> None:
    """A replay on a full disk, stopped during its wait: exit 1, and its file is marked unfinished. Replayed again into
    it, or materialized on, it is refused with what to do; done as told, the replay has every line once."""
    from flightrec.db.markers import replaying_path

    db = small_disk / "f.duckdb"
    env = {**fresh_kafka.env(FLIGHTREC_LOG_LEVEL="WARNING"), "PYTHONSAFEPATH": "1"}
    exe = str(Path(sys.executable).with_name("flightrec"))
    events = chatty(8, 6)  # 19,200 lines: more than the room left
    publish(fresh_kafka.bootstrap, events)
    filler = fill(small_disk, leave=1 << 20)  # room for the new file, not for the lines
    proc = subprocess.Popen([exe, "replay", "--db", str(db)], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        wait("the full disk", lambda: marker_path(db).exists(), proc=proc)
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 1, err
    assert replaying_path(db).exists() and db.exists()
    filler.unlink()
    for command in ("replay", "materialize"):
        r = subprocess.run([exe, command, "--db", str(db), "--until-idle", "2"][: 4 if command == "replay" else 6],
                           env=env, capture_output=True, text=True, timeout=120)  # fmt: skip
        assert r.returncode != 0, r.stderr
        assert "is a replay that did not finish" in r.stderr and "Delete it" in r.stderr, r.stderr
        assert "replay again, or replay into another --db; nothing is lost" in r.stderr, r.stderr
    for left in (db, Path(f"{db}.wal"), replaying_path(db)):  # as told
        left.unlink(missing_ok=True)
    r = subprocess.run([exe, "replay", "--db", str(db)], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert not replaying_path(db).exists()
    con = duckdb.connect(str(db), read_only=True)
    try:
        got = con.execute("SELECT count(*), count(DISTINCT (event_id, line_no)) FROM log_lines").fetchall()[0]
    finally:
        con.close()
    want = sum(len(e.text) for e in events)
    assert got == (want, want)  # every line once


def test_disk_full_errors_are_told_apart() -> None:
    wal = duckdb.TransactionException('Failed to commit: Could not write file "x.wal": No space left on device')
    wrapped = MaterializeError("could not commit a batch to x")
    wrapped.__cause__ = wal
    assert is_disk_full(wrapped) and not needs_reopen(wrapped)
    assert is_disk_full(OSError(28, "No space left on device"))
    assert is_disk_full(OSError(122, "Disk quota exceeded"))
    fatal = duckdb.FatalException("Failed to create checkpoint because of error: No space left on device")
    assert is_disk_full(fatal) and needs_reopen(fatal)
    assert not is_disk_full(MaterializeError("could not commit a batch: Constraint Error"))
    assert not is_disk_full(OSError(13, "Permission denied"))


@pytest.mark.slow  # ~9 s
def test_a_checkpoint_that_finds_no_room_is_waited_out_and_the_database_opened_again(
    kafka, small_disk, monkeypatch: pytest.MonkeyPatch
) -> None:
    """DuckDB invalidates a database whose checkpoint could not write (FATAL): the guard waits for room, opens the
    database again, and commits the held batch once."""
    db = small_disk / "f.duckdb"
    kafka.seed_at_mark(db)
    _checkpoint_without_room(kafka, db, small_disk, monkeypatch, replay=False)


@pytest.mark.slow  # a broker of its own (~20 s)
def test_a_replay_whose_checkpoint_finds_no_room_opens_its_own_file_again(
    fresh_kafka, small_disk, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same for a replay: the file it opens again is its own, not an existing database it must refuse; it ends
    whole (its unfinished-replay marker taken away)."""
    from flightrec.db.markers import replaying_path

    db = small_disk / "f.duckdb"
    _checkpoint_without_room(fresh_kafka, db, small_disk, monkeypatch, replay=True)
    assert not replaying_path(db).exists()


def _checkpoint_without_room(
    kafka: Any, db: Path, small_disk: Path, monkeypatch: pytest.MonkeyPatch, replay: bool
) -> None:
    from flightrec.consumers.materializer import Materializer, Options
    from flightrec.db.filestore import FileStore

    real = FileStore._commit_once
    opened = []
    real_init = FileStore.__init__

    def init(self: FileStore, *args: Any, **kwargs: Any) -> None:
        opened.append(1)
        real_init(self, *args, **kwargs)

    filled: list[Path] = []

    def checkpoint_first(self: FileStore, delta: Delta) -> Stats:
        if delta.messages and not filled:  # the first batch finds the disk full at DuckDB's checkpoint
            self.con.execute("CREATE TABLE pad AS SELECT range AS i FROM range(200000)")  # WAL a checkpoint writes
            filled.append(fill(small_disk, leave=0))
            threading.Timer(4.0, filled[0].unlink).start()  # room again in 4 s
            self.con.execute("CHECKPOINT")  # as DuckDB's own past 64 MB of WAL: FATAL, the database invalidated
            pytest.fail("a checkpoint on a full disk did not fail")
        return real(self, delta)

    monkeypatch.setattr(FileStore, "__init__", init)
    monkeypatch.setattr(FileStore, "_commit_once", checkpoint_first)
    events = chatty(2, 2)
    publish(kafka.bootstrap, events)

    async def go() -> tuple[Stats, int]:
        opts = Options(db=str(db), until_idle=2.0, serve=True, replay=replay)
        async with Materializer(kafka.settings.kafka_kwargs(), opts) as m:
            stats = await m.run()
            return stats, m._guard.episodes

    stats, episodes = asyncio.run(go())
    assert episodes == 1 and len(opened) >= 2  # the guard opened the database again
    con = duckdb.connect(str(db), read_only=True)
    try:
        n = con.execute("SELECT count(*), count(DISTINCT (event_id, line_no)) FROM log_lines").fetchall()[0]
    finally:
        con.close()
    want = sum(len(e.text) for e in events)
    assert n == (want, want)


@pytest.mark.slow  # a database written on a small disk (~5 s)
def test_a_compaction_without_room_for_its_copy_leaves_the_file_as_it_was(small_disk: Path) -> None:
    from flightrec.db.compact import compact_file, copy_path
    from retention_helpers import write
    from test_compact import chatter, rows

    db = small_disk / "f.duckdb"
    write(db, chatter(5, 20, 100), batch=200)
    before = rows(db)
    filler = fill(small_disk, leave=64 << 10)
    with pytest.raises(MaterializeError, match="the file is as it was"):
        compact_file(db)
    filler.unlink()
    assert rows(db) == before
    assert not copy_path(db).exists()


def _held_here(*folders: Path) -> list[str]:
    """The files under ``folders`` this process still has open."""
    held = []
    for fd in Path("/proc/self/fd").iterdir():
        with contextlib.suppress(OSError):
            target = os.readlink(fd)
            if any(target.startswith(str(f)) for f in folders):
                held.append(target)
    return held


@pytest.mark.slow  # a disk filled, the materializer stopped while it waits (~15 s)
def test_a_run_stopped_while_its_store_waits_to_open_again_lets_its_snapshots_go(
    kafka, small_disk, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The checkpoint finds no room and the room never comes back: the store is closed to be opened again, its
    readers' snapshots kept meanwhile (``Materializer._snapshots``), and opening it again fails for want of room.
    Stopped then, the run lets them go: the pointer is removed (readers read the file again) and no descriptor of the
    file or its copies stays open; the run ends with the error that says the held batch is read again at the next
    start. On this tmpfs DuckDB happens to open the file again without writing, so the opening's failure is injected
    (DuckDB's own error text for a write that found no room, raised where DuckDB opens the file); the rest is real."""
    from flightrec.consumers.materializer import Materializer, Options
    from flightrec.db.filestore import FileStore
    from flightrec.db.snapshot import POINTER, snapshot_dir

    db = small_disk / "f.duckdb"
    kafka.seed_at_mark(db)
    real = FileStore._commit_once
    stopping: list[Materializer] = []

    def checkpoint_without_room(self: FileStore, delta: Delta) -> Stats:
        if delta.messages and stopping and not (small_disk / "filler").exists():
            self.con.execute("CREATE TABLE pad AS SELECT range AS i FROM range(200000)")
            fill(small_disk, leave=0)  # never given back
            threading.Timer(5.0, stopping[0].stop).start()  # stopped while it waits for room
            self.con.execute("CHECKPOINT")  # FATAL: the database invalidated, to be opened again
            pytest.fail("a checkpoint on a full disk did not fail")
        return real(self, delta)

    real_connect = FileStore._connect

    def no_room_to_open(self: FileStore, lock_wait: float) -> duckdb.DuckDBPyConnection:
        if (small_disk / "filler").exists():
            raise duckdb.IOException(f'IO Error: Could not write file "{db}": No space left on device')
        return real_connect(self, lock_wait)

    monkeypatch.setattr(FileStore, "_commit_once", checkpoint_without_room)
    monkeypatch.setattr(FileStore, "_connect", no_room_to_open)
    publish(kafka.bootstrap, chatty(2, 2))

    async def go() -> Stats:
        async with Materializer(kafka.settings.kafka_kwargs(), Options(db=str(db), serve=True)) as m:
            stopping.append(m)
            return await m.run()

    with pytest.raises(MaterializeError, match="stopped while the disk of .* was full"):
        asyncio.run(go())
    assert (small_disk / "filler").exists()
    assert not (snapshot_dir(db) / POINTER).exists()
    assert _held_here(db, snapshot_dir(db)) == []
