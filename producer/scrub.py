"""Pure: every string field of an event made shippable - undecodable bytes escaped and flagged, secrets masked, cut."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from typing import Any

from flightrec.producer.redact import Redactor, visible
from flightrec.schemas import EventT, Lifecycle, LogBatch

log = logging.getLogger(__name__)

INVALID_ATTR = "invalid_utf8"  # Lifecycle attribute naming the fields whose undecodable bytes were escaped
_SKIP = frozenset({"event_id", "instance_id", "boot_id"})  # filled by the agent, already clean


def cut(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters and marked, as long tail lines are (cut after masking)."""
    return text if len(text) <= limit else text[:limit] + " [cut]"


class _Scrubber:
    def __init__(self, redactor: Redactor, cap: int | None) -> None:
        self.redactor = redactor
        self.cap = cap
        self.escaped: list[str] = []

    def text(self, value: str, where: str) -> str:
        shown, bad = visible(value)
        if bad:
            self.escaped.append(where)
        shown = self.redactor.text(shown)
        return cut(shown, self.cap) if self.cap is not None else shown

    def lines(self, values: list[str], where: str) -> list[str]:
        try:
            "\n".join(values).encode("utf-8")
        except UnicodeEncodeError:
            values = [self.text(v, where) for v in values]
        return self.redactor.lines(values)

    def argv(self, values: list[str], where: str) -> list[str]:
        """A command's arguments masked as one command line (a secret option's value is its own argument)."""
        shown = []
        for v in values:
            text, bad = visible(v)
            if bad:
                self.escaped.append(where)
            shown.append(text)
        masked = self.redactor.argv_list(shown)
        out = [cut(v, self.cap) for v in masked] if self.cap is not None else masked
        return values if out == values else out

    def value(self, value: Any, where: str) -> Any:
        if isinstance(value, str):
            return self.text(value, where)
        if isinstance(value, Mapping):
            out = {}
            for k, v in value.items():
                key = self.text(str(k), f"{where}.key")
                out[key] = self.value(v, f"{where}.{key}")
            return out
        if isinstance(value, (list, tuple)) and value:
            first = value[0]
            if isinstance(first, str):
                return [self.text(v, where) if isinstance(v, str) else v for v in value]
            if dataclasses.is_dataclass(first):
                return [self.record(v, where) for v in value]
        return value

    def record(self, obj: Any, where: str) -> Any:
        changes = {}
        for f in dataclasses.fields(obj):
            if f.name in _SKIP:
                continue
            old = getattr(obj, f.name)
            if f.name == "text" and isinstance(obj, LogBatch):  # lines: already cut, flagged per line
                lines = old if isinstance(old, list) else list(old)
                new = self.lines(lines, "text")
                new = old if new is lines else new
            elif f.name == "argv" and isinstance(old, (list, tuple)) and all(isinstance(a, str) for a in old):
                new = self.argv(list(old), f"{where}.argv" if where else "argv")
            else:
                new = self.value(old, f"{where}{f.name}" if not where else f"{where}.{f.name}")
            if new is not old:
                changes[f.name] = new
        return dataclasses.replace(obj, **changes) if changes else obj


def scrub(event: EventT, redactor: Redactor, cap: int | None = None) -> EventT:
    """``event`` with every string field escaped (``\\xNN``), masked and then cut to ``cap`` characters.

    Lines of a LogBatch are masked but not cut (the line splitter cut them, and flags them).
    A Lifecycle whose fields held undecodable bytes says which in its ``invalid_utf8`` attribute.
    """
    s = _Scrubber(redactor, None if isinstance(event, LogBatch) else cap)
    out = s.record(event, "")
    if s.escaped:
        names = ",".join(dict.fromkeys(s.escaped))
        log.info("%s: undecodable bytes in %s recorded as \\xNN escapes", type(event).__name__, names)
        if isinstance(out, Lifecycle):
            out = dataclasses.replace(out, attributes=dict(out.attributes, **{INVALID_ATTR: names}))
    return out
