"""The operator's rules file (FLIGHTREC_RULES_FILE) written: a proposed rule appended under a lock beside the file,
checked to load in front of the packaged table, written to a new file renamed over the old one (a reader, such as a
running materializer, sees the old file or the new one, never a part). `flightrec rules propose --save` uses it."""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

from flightrec.db.classify import load_rules, read_operator_rules, with_operator_rules
from flightrec.db.propose import ProposedRule, rule_entry

from flightrec.errors import ConfigError


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """Hold the lock of the rules file (a file beside it): two saves at once do not lose one's rule."""
    fd = os.open(path.with_name(path.name + ".lock"), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def save(path: Path, rule: ProposedRule) -> None:
    """Append the rule to the operator's rules file, atomically (a new file renamed over it, after it is checked
    to parse in front of the packaged table): a reader sees the old file or the new one, never a part."""
    try:
        _append(path, rule)
    except OSError as exc:
        raise ConfigError(f"cannot write the operator's rules file {path}: {exc}; check FLIGHTREC_RULES_FILE") from exc


def _append(path: Path, rule: ProposedRule) -> None:
    with _locked(path):
        old = read_operator_rules(path)
        if f'id = "{rule.rule_id}"' in old:
            raise ConfigError(f"{path} holds a rule {rule.rule_id} already; edit it there")
        text = old + ("" if not old or old.endswith("\n") else "\n") + rule_entry(rule)
        with_operator_rules(load_rules(), text, str(path))  # refuses what would not load
        _replace(path, text)


def _replace(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.chmod(tmp, 0o644)  # readable by a materializer run as another user, as the packaged table is
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    with contextlib.suppress(OSError):  # the rename itself made durable
        dirfd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dirfd)
        finally:
            os.close(dirfd)
