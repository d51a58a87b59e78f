"""`flightrec purge` (db/purge.py): one instance, or a leaked secret's text, out of the database file (its bytes
too: the file is compacted), out of the archive, and what Kafka still holds said plainly."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest
from flightrec.consumers.archive import Archive, to_records, to_table
from flightrec.db.filestore import FileStore
from flightrec.db.fold import fold
from flightrec.db.rowwriter import MATERIALIZED_TABLES
from flightrec.db.snapshot import snapshot_dir
from flightrec.schemas import FileTail, ProcessExit
from retention_helpers import DAY, MINUTE, NOW, Timed, records, write

SECRET = "ghp_LeakedToken0123456789abcdef"


def fleet() -> list[Timed]:
    leaky = Timed(instance="leaky")
    leaky.started("benchmark", NOW - DAY)
    leaky.lines("benchmark", NOW - DAY + MINUTE, ["starting", f"export GITHUB_TOKEN={SECRET}", "done"])
    leaky.add(ProcessExit, NOW - DAY + 2 * MINUTE, stage="benchmark", argv=["bench", f"--token={SECRET}"], pid=1,
              exit_code=1, started_us=NOW - DAY, ended_us=NOW - DAY + 2 * MINUTE, duration_s=120.0,
              stderr_tail=[f"auth failed for {SECRET}"],
              file_tails=[FileTail(path="/var/log/d.log", lines=[f"token {SECRET}"], exists=True)])  # fmt: skip
    other = Timed(instance="other")
    other.started("supervisor", NOW - DAY)
    other.lines("supervisor", NOW - DAY + MINUTE, ["unique-other-line-5e1d", "fine"])
    return [leaky, other]


def flightrec(*args: str, stdin: str = "") -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONSAFEPATH": "1", "FLIGHTREC_BOOTSTRAP": "127.0.0.1:1", "FLIGHTREC_LOG_LEVEL": "WARNING"}
    return subprocess.run([str(Path(sys.executable).with_name("flightrec")), *args], input=stdin, env=env,
                          capture_output=True, text=True, timeout=120)  # fmt: skip


def everything(db: Path) -> str:
    con = duckdb.connect(str(db), read_only=True)
    try:
        return "\n".join(repr(con.execute(f"SELECT * FROM {t}").fetchall()) for t in MATERIALIZED_TABLES)
    finally:
        con.close()


def archived(tmp_path: Path, boots: list[Timed]) -> Path:
    where = tmp_path / "archive"
    recs = records(boots)
    Archive(str(where)).write("flightrec.logs", 0, 0, len(recs) - 1, to_table(recs))  # one segment of them all
    return where


@pytest.mark.slow  # `flightrec purge` runs (~5-10 s)
def test_a_leaked_secret_is_masked_everywhere_and_its_bytes_leave_the_file(tmp_path: Path) -> None:
    db = tmp_path / "f.duckdb"
    boots = fleet()
    write(db, boots)
    archive = archived(tmp_path, boots)
    assert SECRET in everything(db) and SECRET.encode() in db.read_bytes()  # on the disk
    FileStore(db, "flightrec-materializer").close()  # a materializer's run leaves its readers' snapshot copies
    copies = snapshot_dir(db)
    assert any(SECRET.encode() in p.read_bytes() for p in copies.iterdir() if p.is_file())
    secret_file = tmp_path / "secret.txt"
    secret_file.write_text(SECRET + "\n")
    proc = flightrec("purge", "--db", str(db), "--text-from", str(secret_file), "--archive", str(archive))
    assert proc.returncode == 0, proc.stderr
    assert SECRET not in proc.stdout + proc.stderr  # never echoed
    assert "main.log_lines: 1 rows masked" in proc.stdout and "main.failures: 1 rows masked" in proc.stdout
    assert "1 segments written anew" in proc.stdout
    assert "Kafka still holds every record that carried the text" in proc.stdout
    text = everything(db)
    assert SECRET not in text and "*" * len(SECRET) in text
    assert SECRET.encode() not in db.read_bytes() and not Path(f"{db}.wal").exists()  # compacted: not on the disk
    assert not any(SECRET.encode() in p.read_bytes() for p in copies.iterdir() if p.is_file())  # nor in a copy
    # the archive's records still decode (same length), with the text masked
    segment = Archive(str(archive)).segments("flightrec.logs", 0)[0]
    recs = to_records(Archive(str(archive)).read(segment))
    assert not any(SECRET.encode() in (r.value or b"") for r in recs)
    delta = fold(recs)
    assert delta.dead.num_rows == 0 and "*" * len(SECRET) in str(delta.logs.column("text").to_pylist())


@pytest.mark.slow  # `flightrec purge` runs (~5-10 s)
def test_an_instance_is_deleted_everywhere_and_the_others_stay(tmp_path: Path) -> None:
    db = tmp_path / "f.duckdb"
    boots = fleet()
    write(db, boots)
    archive = archived(tmp_path, boots)
    proc = flightrec("purge", "--db", str(db), "--instance", "leaky", "--archive", str(archive))
    assert proc.returncode == 0, proc.stderr
    assert "this instance's records" in proc.stdout and "retention could not be asked" in proc.stdout
    con = duckdb.connect(str(db), read_only=True)
    try:
        for table in MATERIALIZED_TABLES:
            cols = {r[0] for r in con.execute(f"DESCRIBE {table}").fetchall()}
            if "instance_id" in cols:
                assert con.execute(f"SELECT count(*) FROM {table} WHERE instance_id = 'leaky'").fetchall() == [(0,)]
        assert con.execute("SELECT count(*) FROM log_lines WHERE instance_id = 'other'").fetchall() == [(2,)]
    finally:
        con.close()
    assert b"export GITHUB_TOKEN" not in db.read_bytes()
    recs = to_records(Archive(str(archive)).read(Archive(str(archive)).segments("flightrec.logs", 0)[0]))
    assert {r.key for r in recs} == {b"other"}


@pytest.mark.slow  # `flightrec purge` runs (~5-10 s)
def test_a_purge_needs_the_file_to_itself_and_refuses_a_short_text(tmp_path: Path) -> None:
    db = tmp_path / "f.duckdb"
    write(db, fleet())
    short = flightrec("purge", "--db", str(db), "--text-from", "-", stdin="abc\n")
    assert short.returncode == 1 and "at least 4 characters" in short.stderr
    hold = f"import duckdb, time; c = duckdb.connect({str(db)!r}); print(1, flush=True); time.sleep(60)"
    holder = subprocess.Popen([sys.executable, "-c", hold], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline()
        held = flightrec("purge", "--db", str(db), "--instance", "leaky", "--no-archive")
    finally:
        holder.kill()
        holder.wait()
    assert held.returncode == 1 and f"pid {holder.pid}" in held.stderr and "stop the materializer" in held.stderr
    assert "leaky" in everything(db)  # nothing changed
