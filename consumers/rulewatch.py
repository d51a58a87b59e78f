"""The operator's rules file (FLIGHTREC_RULES_FILE), watched by a running materializer: its rules in front of the
packaged table, a changed file picked up and the stored failures classed again by it, without a replay.

How a change is seen: the file's modification time, size and inode, read (one ``stat``) at most every
``CHECK_S`` between the materializer's commits, busy or idle. No signal to send (no process to find, none lost
while the materializer restarts), no control topic (no producer's credentials for the CLI, nothing a replay would
have to skip), no file-system events (none on a network file system); `flightrec rules propose --save` replaces the
file whole (a new inode), and an editor's save changes its time. A file that does not parse, or whose rules clash
with the packaged ones, is refused with one log line (said again only when the file changes again), and the rules
in use stay. A changed table (another version) starts a reclassification: one step of db/reclassify.py at a time,
in the writer thread, in the gap after a commit, until every stored failure is classed by the table in use. A
materializer started with the setting does the same at its start for the failures other tables classed.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from flightrec.db.classify import RuleTable, read_operator_rules, with_operator_rules
from flightrec.db.reclassify import START

from flightrec.errors import ConfigError

log = logging.getLogger(__name__)
CHECK_S = 1.0  # how often the file's stat is read


class RulesWatch:
    """The table a materializer classes with: ``base`` (--rules, else the packaged table) behind the rules of the
    operator's file ``path`` (None: ``base`` alone, nothing watched). Raises ConfigError at the start for a file
    that does not parse: a materializer does not start on rules it cannot read."""

    def __init__(self, base: RuleTable, path: str | Path | None) -> None:
        self.base = base
        self.path = Path(path) if path else None
        self._seen = self._signature()  # read before the text: a change in between is seen at the next look
        self.table = self._read() if self.path is not None else base
        self.next_check = 0.0
        self.cursor = START  # where the reclassification got to
        self.reclassifying = self.path is not None  # the failures classed by other rules, at the start too
        self.reclassified = 0  # rows built again by the current reclassification

    def _signature(self) -> tuple[int, int, int] | None:
        """What says the file changed: its modification time, size and inode (None: no file)."""
        if self.path is None:
            return None
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return (st.st_mtime_ns, st.st_size, st.st_ino)

    def _read(self) -> RuleTable:
        assert self.path is not None
        return with_operator_rules(self.base, read_operator_rules(self.path), str(self.path))

    def look(self, now: float) -> bool:
        """Whether the table changed since the last look (``now``: a monotonic clock); the new one is ``table``."""
        if self.path is None or now < self.next_check:
            return False
        self.next_check = now + CHECK_S
        seen = self._signature()
        if seen == self._seen:
            return False
        self._seen = seen
        try:
            table = self._read()
        except ConfigError as exc:
            log.error("the operator's rules file is refused; the rules of version %s stay: %s", self.table.version, exc)
            return False
        if table.version == self.table.version:
            return False
        log.info(
            "rules of version %s from %s (%d operator rules): the stored failures are classed again",
            table.version,
            self.path,
            len(table.rules) - len(self.base.rules),
        )
        self.table, self.cursor, self.reclassifying, self.reclassified = table, START, True, 0
        return True
