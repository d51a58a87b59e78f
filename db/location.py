"""Where a database lives, chosen once from the `--db` string: a DuckDB file or a DuckLake."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from flightrec.errors import LakeError

PREFIX = "ducklake:"
DATA_PATH_ENV = "FLIGHTREC_DATA_PATH"


def _is_lake(db: str | os.PathLike[str]) -> bool:
    return str(db).startswith(PREFIX)


@dataclass(frozen=True)
class FileLocation:
    """An embedded DuckDB file: one materializer writes it and publishes snapshots of it for readers beside it."""

    path: Path
    shared: ClassVar[bool] = False  # written by one materializer, not by a consumer group

    @property
    def db(self) -> str:
        """The `--db` string."""
        return str(self.path)

    def describe(self) -> str:
        """The location for messages."""
        return str(self.path)

    def exists(self) -> bool:
        """Whether the database is there yet (a materializer creates it)."""
        return self.path.exists()

    def for_command_line(self) -> str | None:
        """The `--db` value another process may be given in its argv (absolute: it may run elsewhere)."""
        return str(self.path.resolve())


@dataclass(frozen=True)
class LakeLocation:
    """A DuckLake store: DuckDB's own ATTACH string (``ducklake:postgres:dbname=… host=…``) and its data folder.

    ``data_path`` is None where it was not given: a reader (or a writer of a lake that exists) then uses the
    data path the catalog recorded when the lake was created.
    """

    attach: str
    data_path: str | None = None
    shared: ClassVar[bool] = True  # written by a consumer group of materializers; readers attach it themselves

    @property
    def db(self) -> str:
        """The `--db` string itself (the same as ``attach``)."""
        return self.attach

    def __repr__(self) -> str:  # never a password in a log line or a traceback
        return f"LakeLocation({mask_password(self.attach)!r}, data_path={self.data_path!r})"

    def describe(self) -> str:
        """The location for messages, with any password in the connection string masked."""
        return mask_password(self.attach) + (f" (data path {self.data_path})" if self.data_path else "")

    def exists(self) -> bool:
        """A lake is there once its catalog is (a reader that finds no tables says so)."""
        return True

    def for_command_line(self) -> str | None:
        """None: the lake string (a password in it, perhaps) goes to another process by its environment only."""
        return None


_PASSWORD = re.compile(r"(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)", re.IGNORECASE)


def mask_password(text: str) -> str:
    """``text`` with every libpq ``password=…`` value replaced by ``***``. Pure."""
    return _PASSWORD.sub(r"\1***", text)


def parse_db(
    db: str | os.PathLike[str],
    data_path: str | None = None,
    *,
    writing: bool = False,
    env: Mapping[str, str] | None = None,
) -> Path | LakeLocation:
    """An embedded database file (Path) or a lake (LakeLocation) from `--db` and `--data-path`.

    The data path comes from the flag, else ``FLIGHTREC_DATA_PATH``. ``writing=True`` (a materializer, replay)
    demands one for a lake: the Parquet files must go somewhere known to every writer. Pure but for ``env``.
    """
    text = str(db)
    if not _is_lake(text):
        if data_path:
            raise LakeError(
                f"--data-path {data_path} is for a DuckLake --db ('ducklake:…'), not for the "
                f"database file {text}; drop --data-path or give a ducklake: --db"
            )
        return Path(text)
    if text.strip() == PREFIX:
        raise LakeError(
            "--db 'ducklake:' names no catalog: use DuckDB's ATTACH string, e.g. "
            "'ducklake:postgres:dbname=flightrec host=127.0.0.1 port=5432 user=flightrec' "
            "(`flightrec catalog start` prints one)"
        )
    env = os.environ if env is None else env
    path = data_path or env.get(DATA_PATH_ENV) or None
    if writing and not path:
        raise LakeError(
            f"writing a lake needs a data path for its Parquet files: pass --data-path DIR or set "
            f"{DATA_PATH_ENV} (a folder every writer and reader can reach, or object storage)"
        )
    if path and "://" not in path:
        path = str(Path(path).expanduser().resolve())
    return LakeLocation(attach=text, data_path=path)


def lake_location(
    db: str, data_path: str | None = None, *, writing: bool = False, env: Mapping[str, str] | None = None
) -> LakeLocation:
    """``parse_db`` for code that only handles lakes: a LakeLocation, or LakeError for a database file."""
    loc = parse_db(db, data_path, writing=writing, env=env)
    if not isinstance(loc, LakeLocation):
        raise LakeError(
            f"{db} is a database file, not a lake: use --db 'ducklake:postgres:dbname=… host=… port=… user=…'"
        )
    return loc


def reader_data_path(db: str, data_path: str | None) -> None:
    """A reader command's `--data-path`: checked against ``db`` (only a lake takes one) and made this process's
    FLIGHTREC_DATA_PATH, where every later ``parse_db`` of the same lake finds it. For CLI entry points only."""
    if data_path:
        parse_db(db, data_path)  # raises for a database file
        os.environ[DATA_PATH_ENV] = data_path


def reader_location(db: str, data_path: str | None) -> Location:
    """A reader command's database: ``reader_data_path`` (the data path into this process's environment), then
    ``locate``. For CLI entry points only."""
    reader_data_path(db, data_path)
    return locate(db)


Location = FileLocation | LakeLocation


def locate(
    db: str | os.PathLike[str] | Location,
    data_path: str | None = None,
    *,
    writing: bool = False,
    env: Mapping[str, str] | None = None,
) -> Location:
    """The database ``db`` names: the one place that tells a file from a lake (``parse_db``'s Path becomes a
    FileLocation). A Location passes through unchanged. Pure but for ``env``."""
    if isinstance(db, (FileLocation, LakeLocation)):
        return db
    loc = parse_db(db, data_path, writing=writing, env=env)
    return FileLocation(loc) if isinstance(loc, Path) else loc
