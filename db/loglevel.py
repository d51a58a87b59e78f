"""A log line's header (timestamps, levels, sources, prefixes before its message) and the level it states, as common
log formats write them: a level word (`ERROR`, `WARN`, `INFO`...), glog's `E0102 10:00:00.000000`, logfmt's
`level=error`, zap/zerolog JSON `"level":"error"`, `[error]`, `error:` at a message's start. Pure."""

from __future__ import annotations

import re
from enum import IntEnum


class Level(IntEnum):
    """How grave a line says it is, in order."""

    QUIET = 0  # INFO, NOTICE, DEBUG, TRACE: the program's own word that this is no failure
    WARN = 1
    ERROR = 2
    FATAL = 3


_HEADER_PARTS = [
    re.compile(r"^\S+\s+\|\s"),  # docker compose: "prover-1  | "
    re.compile(r"^\[[^\]\n]{0,100}\]:?\s*"),  # [ 1843.30], [task ...], [rank1]:, [error], [E0626 ... file.cc:616]
    re.compile(  # an ISO-like time, its zone by offset or name
        r"^\d{4}[-/]\d\d[-/]\d\d[T ]\d\d:\d\d(?::\d\d(?:[.,]\d+)?)?(?:Z|\s?[+-]\d\d:?\d\d)?"
        r"(?:\s(?:UTC|GMT|[CEMPAJIB]S?[TD]|CEST|AEST|MSK))?:?\s*"
    ),
    re.compile(r"^\d\d[-/]\d\d[ T]\d\d:\d\d:\d\d(?:[.,]\d+)?\s*"),  # 03-26 05:25:01
    re.compile(r"^\d\d:\d\d:\d\d(?:[.,]\d+)?\s*"),
    re.compile(r"^[A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d \S+ [^\s:\[]+(?:\[\d+\])?:\s*"),  # syslog: host proc[pid]:
    re.compile(r"^UTC\s+"),
    re.compile(r"^[IWEF]\d{4} \d\d:\d\d:\d\d\.\d+\s+\d+\s+\S+:\d+\]\s?"),  # glog
    re.compile(
        r"^(?:FATAL|PANIC|CRITICAL|CRIT|EMERG|ALERT|FTL|PNC|ERROR|ERRO|EROR|ERR|WARNING|WARN|WRN|INFO|INF|"
        r"NOTICE|DEBUG|DBG|TRACE|TRC)\b:?\s*"
    ),
    re.compile(r"^[\w.-]+\.\w+:\d+\]\s?"),  # python logging's "engine.py:389] "
    re.compile(r"^[\w]+(?:::[\w]+)+\s*(?:>|:)\s"),  # a Rust target: "bellperson::gpu::locks > "
]
_MAX_HEADER_PARTS = 8

_WORDS = {
    "fatal": Level.FATAL, "panic": Level.FATAL, "dpanic": Level.FATAL, "critical": Level.FATAL,
    "crit": Level.FATAL, "emerg": Level.FATAL, "alert": Level.FATAL, "ftl": Level.FATAL, "pnc": Level.FATAL,
    "error": Level.ERROR, "erro": Level.ERROR, "eror": Level.ERROR, "err": Level.ERROR,
    "warning": Level.WARN, "warn": Level.WARN, "wrn": Level.WARN,
    "info": Level.QUIET, "inf": Level.QUIET, "notice": Level.QUIET, "debug": Level.QUIET, "dbg": Level.QUIET,
    "trace": Level.QUIET, "trc": Level.QUIET,
}  # fmt: skip
_GLOG = {"I": Level.QUIET, "W": Level.WARN, "E": Level.ERROR, "F": Level.FATAL}
_FIELD = re.compile(r"""["']?\b(?:level|lvl|severity|log\.level)["']?\s*[:=]\s*["']?([A-Za-z]+)""", re.I)
_GLOG_LEVEL = re.compile(r"^(?:\S*\[)?([IWEF])\d{4} \d\d:\d\d:\d\d")
_TOKEN = re.compile(
    r"(?<![\w/.-])(FATAL|PANIC|CRITICAL|CRIT|EMERG|FTL|PNC|ERROR|ERRO|EROR|ERR|WARNING|WARN|WRN|INFO|INF|NOTICE|"
    r"DEBUG|DBG|TRACE|TRC)(?![\w/.-])"
)
_BRACKET = re.compile(r"\[(fatal|critical|error|err|warning|warn|info|debug|trace)\]", re.I)
_START = re.compile(r"^(fatal|error|warning|warn)(?:\[[\w-]+\])?\s*:", re.I)
HEADER_CHARS = 120  # a level word counts in this much of a line's start


def header_split(line: str) -> tuple[str, str]:
    """(header, message): the timestamps, levels, sources and prefixes a line starts with, and the rest."""
    rest = line.rstrip()
    for _ in range(_MAX_HEADER_PARTS):
        for part in _HEADER_PARTS:
            m = part.match(rest)
            if m and m.end() and rest[m.end() :].strip():
                rest = rest[m.end() :]
                break
        else:
            break
    return line[: len(line.rstrip()) - len(rest)], rest


def _stated(head: str) -> Level | None:
    """The first level the forms that name one state in ``head``."""
    for pattern in (_GLOG_LEVEL, _FIELD, _TOKEN, _BRACKET):
        m = pattern.search(head)
        if m:
            word = m.group(1)
            level = _GLOG.get(word) if pattern is _GLOG_LEVEL else _WORDS.get(word.lower())
            if level is not None:
                return level
    return None


def level_of(line: str) -> Level | None:
    """The level a line states in its first HEADER_CHARS characters (or `error:` at its message's start), or None."""
    level = _stated(line[:HEADER_CHARS])
    if level is not None:
        return level
    m = _START.match(header_split(line)[1])
    return _WORDS.get(m.group(1).lower()) if m else None


def quiet(line: str) -> bool:
    """Whether a line's header (or its JSON or logfmt level field) says INFO, NOTICE, DEBUG or TRACE: the program's
    own word that this line is no failure. A level word inside the message does not count."""
    head = line[:HEADER_CHARS]
    field = _FIELD.search(head)
    if field is not None and field.group(1).lower() in _WORDS:
        return _WORDS[field.group(1).lower()] == Level.QUIET
    return _stated(header_split(head)[0]) == Level.QUIET
