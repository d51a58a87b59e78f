"""A failure's kind: a short fingerprint of what failed, how, and the shape of the line that says why.

``failures.kind`` is the first KIND_HEX hex digits of SHA-256 over three parts, each a pure function of the
failure's row:

- the stage kind: the stage's name with its numbers (and UUIDs) as ``<*>`` (``bench-3`` -> ``bench-<*>``);
- the exit kind: ``start error``, ``timeout``, ``signal SIGSEGV`` (a signal keeps its name: a crash and a kill are
  not one kind), ``code`` (any non-zero exit code: the code a program chooses says less than its words),
  ``result`` (a benchmark below its minimum rate, or a verdict of fail, with no failed exit), else ``none``;
- the shape of the decisive line's template (db/template.py).

``failures.kind_template`` keeps the decisive line's template (typed placeholders, for reading). The same evidence
gives the same kind in a replay, on any member of a lake group and in any order of arrival: the row is built from
the evidence alone (db/failures.py) and its kind from the row alone.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from flightrec.db.template import ANY, shape, template
from flightrec.schemas.events import KIND_DECISIONS

from flightrec.settings import Settings

# The windows of the failure_kinds view's statuses (db/views.py), by default: FLIGHTREC_KINDS_NEW_HOURS and
# FLIGHTREC_KINDS_QUIET_DAYS give each reader its own (KindWindows.from_settings).
NEW_WINDOW_US = 24 * 3600 * 10**6  # a kind first seen this recently is new
QUIET_US = 7 * 24 * 3600 * 10**6  # a kind seen again (within NEW_WINDOW_US) after this long without a failure regressed
EXAMPLES = 5  # failure ids a kind shows, the latest first
KIND_HEX = 16  # hex digits of the fingerprint kept (64 bits: no two kinds of one fleet collide)
_STAGE_VARIABLE = re.compile(
    r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}|\d+(?:\.\d+)*"
)


@dataclass(frozen=True)
class KindWindows:
    """The windows of the kinds' statuses, in microseconds: ``new_us`` (a kind first seen this recently is new; a
    return or a change of class this recent is regressed) and ``quiet_us`` (the silence after which a kind's next
    failure is a return)."""

    new_us: int = NEW_WINDOW_US
    quiet_us: int = QUIET_US

    @classmethod
    def from_settings(cls, settings: Settings) -> KindWindows:
        return cls(round(settings.kinds_new_hours * 3600 * 10**6), round(settings.kinds_quiet_days * 24 * 3600 * 10**6))


# The operator's decisions on kinds (`flightrec kinds mute|unmute|merge|unmerge|split`) are manager events
# (ManagerEvent.kind), so a replay and every member of a lake group read the same ones from `manager_events`. Their
# attributes:
# ``failure_kind`` (the kind decided on), ``into`` (a merge's target), ``pattern`` (a split's RE2 expression, matched
# against each failure's decisive line). They are keyed by DECISIONS_INSTANCE, an instance id no agent uses.
KIND_MUTED, KIND_MERGED, KIND_SPLIT, KIND_UNMUTED, KIND_UNMERGED = KIND_DECISIONS
DECISIONS_INSTANCE = "failure-kinds"
KIND_PATTERN = re.compile(rf"[0-9a-f]{{{KIND_HEX}}}")  # what a kind looks like (fingerprint, split_kind)


def split_kind(kind: str, pattern: str) -> str:
    """The kind a split of ``kind`` by ``pattern`` makes: a function of the decision alone (the failure_kinds view
    computes the same in SQL: ``left(sha256(kind || chr(31) || pattern), KIND_HEX)``)."""
    return hashlib.sha256(f"{kind}\x1f{pattern}".encode("utf-8", "replace")).hexdigest()[:KIND_HEX]


def stage_kind(stage: str | None) -> str:
    """The stage's name with its variable parts (numbers, UUIDs) as ``<*>``."""
    return _STAGE_VARIABLE.sub(ANY, stage or "")


def exit_kind(row: Mapping[str, Any], *, timed_out: bool = False) -> str:
    """How the stage ended, by kind (see the module's doc)."""
    if row.get("start_error"):
        return "start error"
    if timed_out:
        return "timeout"
    if row.get("signal") not in (None, 0):
        return f"signal {row.get('signal_name') or row.get('signal')}"
    if row.get("exit_code") not in (None, 0):
        return "code"
    if row.get("proofs_per_hour") is not None or row.get("min_rate") is not None:
        return "result"
    return "none"


def fingerprint(stage: str, exit: str, shaped: str) -> str:
    """The kind: KIND_HEX hex digits of SHA-256 over the three parts (joined by a byte no part holds)."""
    return hashlib.sha256("\x1f".join((stage, exit, shaped)).encode("utf-8", "replace")).hexdigest()[:KIND_HEX]


def failure_kind(row: Mapping[str, Any], *, timed_out: bool = False) -> tuple[str, str]:
    """The failure's kind and its decisive line's template, from its row (``timed_out``: the stage was stopped at
    its time limit, which the row holds only in its decisive line's words)."""
    templated = template(row.get("decisive_line") or "")
    kind = fingerprint(stage_kind(row.get("stage")), exit_kind(row, timed_out=timed_out), shape(templated))
    return kind, templated
