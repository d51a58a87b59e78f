"""Run one private local PostgreSQL (Debian's own binaries) as the catalog of a DuckLake store."""

from __future__ import annotations

import glob
import os
import pwd
import re
import shlex
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flightrec.errors import CatalogError
from flightrec.localservice import LOG_TAIL_LINES, log_tail, pid_alive, port_free
from flightrec.settings import Settings

DEFAULT_PORT = 5432
SUPERUSER = "flightrec"  # the role initdb creates; trusted on 127.0.0.1 only
READER = "flightrec_reader"  # a role that can only read (pg_read_all_data): the --db string for readers
DATABASE = "flightrec"  # the database `start` creates and names in its --db string
SERVICE_USER = "postgres"  # PostgreSQL refuses to run as root: when root, it runs as this user
MAX_CONNECTIONS = 200  # every materializer and reader holds a few catalog connections
DEBIAN_GLOB = "/usr/lib/postgresql/*/bin"
_START_MARK = "=== flightrec starting PostgreSQL"
_INSTALL_HINT = "install it: apt-get install postgresql (Debian/Ubuntu; it provides /usr/lib/postgresql/*/bin)"


_LOG_CAUSE = re.compile(r"\b(FATAL|PANIC|ERROR):\s+(.*)$")
_LOG_DETAIL = re.compile(r"\b(?:LOG|WARNING):\s+(.*(?:could not|unrecognized|invalid|must be|permission).*)$")


def log_cause(text: str) -> str:
    """The first FATAL/PANIC/ERROR of PostgreSQL's log since our last start, after the LOG/WARNING lines that
    explain it (an unrecognized setting, an address in use); "" if none. Pure."""
    at = text.rfind(_START_MARK)
    details: list[str] = []
    for line in (text[at:] if at >= 0 else text).splitlines():
        m = _LOG_CAUSE.search(line)
        if m:
            return "; ".join([*details, m.group(2).strip()])[:500]
        d = _LOG_DETAIL.search(line)
        if d and d.group(1).strip() not in details:
            details.append(d.group(1).strip())
    return ""


def find_bin_dir(path: str | None = None, debian_glob: str = DEBIAN_GLOB) -> Path:
    """The folder of PostgreSQL's server programs (initdb, pg_ctl, postgres, psql, pg_isready).

    ``pg_ctl`` on ``path`` (default $PATH; its real folder, a symlink resolved), else the newest folder matching
    ``debian_glob``. Raises CatalogError saying what to install when there is none.
    """
    need = ("initdb", "pg_ctl", "postgres", "psql", "pg_isready")
    candidates: list[Path] = []
    on_path = shutil.which("pg_ctl", path=path)
    if on_path:
        candidates.append(Path(on_path).resolve().parent)
    versions = sorted(glob.glob(debian_glob), key=lambda p: [int(x) for x in re.findall(r"\d+", p)], reverse=True)
    candidates.extend(Path(p) for p in versions)
    for folder in candidates:
        if all((folder / n).is_file() and os.access(folder / n, os.X_OK) for n in need):
            return folder
    raise CatalogError(
        f"PostgreSQL not found (no initdb/pg_ctl/postgres/psql on PATH or in "
        f"/usr/lib/postgresql/*/bin): {_INSTALL_HINT}"
    )


def db_string(port: int, database: str = DATABASE, host: str = "127.0.0.1", user: str = SUPERUSER) -> str:
    """The `--db` value for a lake whose catalog is ``database`` on this PostgreSQL. Pure."""
    return f"ducklake:postgres:dbname={database} host={host} port={port} user={user}"


@dataclass(frozen=True)
class CatalogStatus:
    """What `flightrec catalog status` reports."""

    running: bool
    answering: bool
    pid: int | None
    port: int
    data: str

    def line(self) -> str:
        if self.running:
            state = "running and answering" if self.answering else "running but not answering"
            return f"PostgreSQL {state} on 127.0.0.1:{self.port} (pid {self.pid}, data {self.data})"
        return f"no catalog running for data {self.data} (port {self.port})"


class LocalCatalog:
    """A private PostgreSQL cluster under ``data`` listening on 127.0.0.1:``port`` (TCP only, trust auth).

    Guarantees: ``start`` returns once the server accepts connections and the ``flightrec`` database exists,
    and is a no-op when this cluster already runs; ``stop`` waits until the server is gone. Failures raise
    CatalogError with a one-line cause and the tail of PostgreSQL's log. Several run side by side on other
    ports and data folders. As root the server runs as the ``postgres`` user, which must be able to reach
    ``data``.
    """

    def __init__(
        self, port: int = DEFAULT_PORT, data: str | Path | None = None, settings: Settings | None = None
    ) -> None:
        self.settings = settings or Settings.from_env()
        self.port = port
        self.data = (Path(data) if data else Path(self.settings.home) / f"catalog-{port}").resolve()

    @property
    def pgdata(self) -> Path:
        return self.data / "pgdata"

    @property
    def log_path(self) -> Path:
        return self.data / "postgresql.log"

    @property
    def db(self) -> str:
        """The `--db` string of this catalog's ``flightrec`` database."""
        return db_string(self.port)

    @property
    def reader_db(self) -> str:
        """The `--db` string for readers: the same lake through a role PostgreSQL lets read and nothing else."""
        return db_string(self.port, user=READER)

    # -- who runs it ----------------------------------------------------------

    def _run_as(self) -> dict[str, Any]:
        """subprocess keyword arguments that drop root to the service user; empty when not root."""
        if os.geteuid() != 0:
            return {}
        try:
            pw = pwd.getpwnam(SERVICE_USER)
        except KeyError:
            raise CatalogError(
                f"running as root, but there is no user {SERVICE_USER!r} to run PostgreSQL as "
                f"(it refuses root): {_INSTALL_HINT}, or run flightrec as another user"
            ) from None
        env = dict(os.environ, HOME=pw.pw_dir, USER=SERVICE_USER, LOGNAME=SERVICE_USER)
        return {"user": pw.pw_uid, "group": pw.pw_gid, "extra_groups": [], "env": env}

    def _prepare_data(self) -> None:
        """Create the data folder, owned by the user PostgreSQL runs as, and prove that user can write it."""
        run_as = self._run_as()
        try:
            self.data.mkdir(parents=True, exist_ok=True)
            if run_as:
                os.chown(self.data, run_as["user"], run_as["group"])
        except OSError as exc:
            raise CatalogError(
                f"the data folder {self.data} cannot be created: {exc.strerror}; choose a writable one with --data"
            ) from exc
        who = SERVICE_USER if run_as else "this user"
        probe = subprocess.run(
            ["test", "-w", str(self.data), "-a", "-x", str(self.data)], capture_output=True, **run_as
        )
        if probe.returncode != 0:
            extra = (
                (
                    f" (PostgreSQL refuses to run as root, so it runs as {SERVICE_USER}: every parent folder "
                    f"must let that user through, e.g. chmod o+x, or use a --data under /var/tmp)"
                )
                if run_as
                else ""
            )
            raise CatalogError(f"the data folder {self.data} is not writable by {who}{extra}; choose another --data")

    # -- state ------------------------------------------------------------------

    def running_pid(self) -> int | None:
        """The pid of this data folder's PostgreSQL server (its postmaster) when it runs, else None."""
        return self._pid()

    def _pid(self) -> int | None:
        try:
            pid = int((self.pgdata / "postmaster.pid").read_text().split("\n", 1)[0].strip())
        except (OSError, ValueError):
            return None
        return pid if pid_alive(pid) else None

    def _answers(self, bin_dir: Path | None = None) -> bool:
        try:
            bin_dir = bin_dir or find_bin_dir()
        except CatalogError:
            return False
        proc = subprocess.run(
            [
                str(bin_dir / "pg_isready"),
                "-q",
                "-h",
                "127.0.0.1",
                "-p",
                str(self.port),
                "-U",
                SUPERUSER,
                "-d",
                "postgres",
                "-t",
                "3",
            ],
            capture_output=True,
        )
        return proc.returncode == 0

    def status(self) -> CatalogStatus:
        pid = self._pid()
        return CatalogStatus(
            running=pid is not None,
            answering=pid is not None and self._answers(),
            pid=pid,
            port=self.port,
            data=str(self.data),
        )

    # -- SQL administration (psql over TCP) ----------------------------------

    def psql(self, sql: str, database: str = "postgres") -> str:
        """Run one SQL command on this server with psql; its unaligned output. Raises CatalogError."""
        bin_dir = find_bin_dir()
        proc = subprocess.run(
            [
                str(bin_dir / "psql"),
                "-X",
                "-q",
                "-tA",
                "-v",
                "ON_ERROR_STOP=1",
                "-h",
                "127.0.0.1",
                "-p",
                str(self.port),
                "-U",
                SUPERUSER,
                "-d",
                database,
                "-c",
                sql,
            ],
            capture_output=True,
            text=True,
            env=dict(os.environ, PGCONNECT_TIMEOUT="10"),
        )
        if proc.returncode != 0:
            raise CatalogError(
                f"PostgreSQL on 127.0.0.1:{self.port} refused {sql[:80]!r}: "
                f"{proc.stderr.strip()[:500]}; is it running (`flightrec catalog status`)?"
            )
        return proc.stdout

    def create_database(self, name: str) -> str:
        """Create database ``name`` if missing (a fresh, empty catalog); return its `--db` string."""
        if not re.fullmatch(r"[a-z_][a-z0-9_]{0,62}", name):
            raise CatalogError(f"database name {name!r}: use lower-case letters, digits and _ (at most 63)")
        if not self.psql(f"SELECT 1 FROM pg_database WHERE datname = '{name}'").strip():
            self.psql(f'CREATE DATABASE "{name}"')
        return db_string(self.port, name)

    def drop_database(self, name: str) -> None:
        """Drop database ``name`` (and the connections still open to it) if it exists."""
        self.psql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    # -- lifecycle ----------------------------------------------------------------

    def _initdb(self, bin_dir: Path, run_as: dict[str, Any]) -> None:
        if (self.pgdata / "PG_VERSION").exists():
            return
        if self.pgdata.exists() and any(self.pgdata.iterdir()):
            raise CatalogError(
                f"{self.pgdata} exists but holds no PostgreSQL cluster (no PG_VERSION); "
                f"remove it or choose another --data"
            )
        proc = subprocess.run(
            [
                str(bin_dir / "initdb"),
                "-D",
                str(self.pgdata),
                "-U",
                SUPERUSER,
                "--auth=trust",
                "-E",
                "UTF8",
                "--locale=C",
            ],
            capture_output=True,
            text=True,
            **run_as,
        )
        if proc.returncode != 0:
            out = proc.stdout + proc.stderr
            cause = next((ln for ln in out.splitlines() if "initdb: error" in ln), "")
            raise CatalogError(
                f"initdb of {self.pgdata} failed (exit {proc.returncode})"
                + (f": {cause.split('error:', 1)[1].strip()}" if cause else ""),
                "\n".join(out.splitlines()[-LOG_TAIL_LINES:]),
            )

    def start(self, timeout: float = 60.0) -> str:
        """Start the server (initdb first if needed) and create the `flightrec` database. Returns what happened;
        its last line is the `--db` string."""
        pid = self._pid()
        bin_dir = find_bin_dir()
        if pid is not None and self._answers(bin_dir):
            self._prepare_roles_and_database()
            return (
                f"PostgreSQL already running on 127.0.0.1:{self.port} (pid {pid}, data {self.data})\n{self._db_lines()}"
            )
        if pid is None and not port_free(self.port):
            raise CatalogError(f"port {self.port} is in use by another process; choose another with --port")
        self._prepare_data()
        run_as = self._run_as()
        self._initdb(bin_dir, run_as)
        with open(self.log_path, "ab") as f:
            f.write(f"\n{_START_MARK} on port {self.port} at {time.ctime()} ===\n".encode())
        if run_as:
            os.chown(self.log_path, run_as["user"], run_as["group"])
        options = [
            "-p",
            str(self.port),
            "-k",
            "",
            "-c",
            "listen_addresses=127.0.0.1",
            "-c",
            f"max_connections={MAX_CONNECTIONS}",
        ]
        # pg_ctl detaches the server (it outlives this command, like `flightrec broker start`)
        proc = subprocess.run(
            [
                str(bin_dir / "pg_ctl"),
                "-D",
                str(self.pgdata),
                "-l",
                str(self.log_path),
                "-o",
                " ".join(shlex.quote(o) for o in options),
                "-w",
                "-t",
                str(int(timeout)),
                "start",
            ],
            capture_output=True,
            text=True,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            **run_as,
        )
        if proc.returncode != 0 or not self._answers(bin_dir):
            tail = log_tail(self.log_path, 400)
            cause = log_cause(tail) or (proc.stderr.strip().splitlines() or ["its log names no cause"])[-1]
            if self._pid() is not None:
                self.stop()
            raise CatalogError(
                f"PostgreSQL did not start on 127.0.0.1:{self.port}: {cause}",
                "\n".join(tail.splitlines()[-LOG_TAIL_LINES:]),
            )
        self._prepare_roles_and_database()
        return f"PostgreSQL started on 127.0.0.1:{self.port} (pid {self._pid()}, data {self.data})\n{self._db_lines()}"

    def _prepare_roles_and_database(self) -> None:
        self.create_database(DATABASE)
        self.psql(
            f"DO $$ BEGIN IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '{READER}') THEN "
            f"CREATE ROLE {READER} LOGIN; END IF; END $$; GRANT pg_read_all_data TO {READER}"
        )

    def _db_lines(self) -> str:
        """What `start` prints last: the readers' --db string (a role that cannot write), then the writers'."""
        return f"readers may use: {self.reader_db}\n{self.db}"

    def stop(self, timeout: float = 60.0) -> str:
        """Stop the server (fast shutdown: open sessions end, committed work stays) and wait until it is gone."""
        pid = self._pid()
        if pid is None:
            return f"no catalog running for data {self.data}"
        bin_dir = find_bin_dir()
        proc = subprocess.run(
            [str(bin_dir / "pg_ctl"), "-D", str(self.pgdata), "-m", "fast", "-w", "-t", str(int(timeout)), "stop"],
            capture_output=True,
            text=True,
            **self._run_as(),
        )
        how = "stopped"
        if proc.returncode != 0 and pid_alive(pid):
            os.kill(pid, signal.SIGQUIT)  # immediate shutdown; the next start recovers from the WAL
            deadline = time.monotonic() + 10
            while pid_alive(pid) and time.monotonic() < deadline:
                time.sleep(0.05)
            how = f"killed (did not stop within {timeout:.0f}s)"
        return f"PostgreSQL on 127.0.0.1:{self.port} {how}"
