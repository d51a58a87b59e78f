"""The template of a line: its variable parts replaced by placeholders, so lines that differ only in them are one.

``template("pid 4242 wrote 12 MiB to /var/run/x.sock in 3.2s")`` is ``"pid <*> wrote <size> to <path> in
<duration>"``. Used on each failure's decisive line (not every log line) for the failure's kind (db/kinds.py).

Two passes, in the spirit of Sentry's message parameterization:

1. patterns of whole values, in order (the first that matches a span names it): UUIDs ``<uuid>``, URLs ``<url>``,
   dates and times ``<time>`` (ISO ``2026-12-07 01:02:03``, a clock, and dates as ctime and syslog write them:
   ``Thu Aug  4 15:29:45 PDT 2005``, ``Dec 10 19:02:14``), MAC-like and colon-hex ids ``<id>``, IPv4 addresses
   (with a port) and IPv6 addresses ``<ip>``, numbered host names with a port ``<host>``
   (``node-3.rack.example.com:7109``: two dots at least, a digit or a hyphen in the first label; ``Foo.java:12``
   and ``pkg.mod.sub:12`` are a file's and a module's line), ``0x`` hex numbers ``<hex>``, indexed units
   ``<id>`` (a name in capitals with its number in parentheses, glued: ``LOCAL(0)``, ``COM(1)``; a call keeps
   its name: ``read(3)``, ``Pool.take(17)``), paths ``<path>`` (a path's every part: a file's name is as
   variable as its folder in what failing programs print), sizes ``<size>``, durations ``<duration>``, quoted
   values ``<quoted>`` (a double-quoted value of a key: ``name="x"``, ``'x'`` after ``=`` or ``:``), long hex
   (a hash, a commit, 12+ hex digits) ``<hex>``;
2. then each remaining token (split at white space, punctuation that delimits, and a run of dots: an ellipsis or
   a leader, ``depth......0``): one that holds a digit (a
   number, an id, a hostname like ``gpu-node-17``) becomes ``<*>``; ``key=value`` and ``key:value`` keep their key
   and mask the value by the same test.

A kind is keyed by the template's :func:`shape` (every placeholder as ``<*>``, a run of them as one).

Pure and per line: a line's template depends on that line alone, never on lines seen before it. That is why it is
not a Drain-style miner (drain3 and its forks): those grow a tree from the lines in the order they arrive, so the
same line may get another template in a replay or on another member of a lake group; a kind must be the same
everywhere. Only the first TEMPLATE_CHARS characters of a line are read (a hostile line may be 64 KiB), and a
template is at most as long.
"""

from __future__ import annotations

import re

TEMPLATE_CHARS = 2048  # what is read of a line: enough for any message, bounded for a hostile one
ANY = "<*>"

_UUID = r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
_DATE = r"\d{4}[-/.]\d{1,2}[-/.]\d{1,2}"
_CLOCK = r"\d{1,2}:\d{2}:\d{2}(?:[.,]\d+)?"
_ZONE = r"(?:Z|[+-]\d{2}:?\d{2})?"
# An IPv6 address: eight groups, or fewer with '::' (checked ahead), alone (no word or ':' on either side).
_IPV6 = (
    r"(?<![\w:])(?=[0-9a-fA-F:]*::|(?:[0-9a-fA-F]{1,4}:){7})"
    r"[0-9a-fA-F]{0,4}(?::[0-9a-fA-F]{0,4}){2,7}(?![\w:])"
)
# A date as ctime, syslog and date(1) write it: a month's name and the day, maybe a weekday before, a clock after,
# then maybe a zone's name and the year (``Thu Aug  4 15:29:45 PDT 2005``).
_MONTH = r"(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)"
_WEEKDAY = r"(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun)"
_CTIME = (
    r"\b(?:"
    + _WEEKDAY
    + r",? {1,2})?"
    + _MONTH
    + r" {1,2}\d{1,2},? {1,2}(?:\d{4} )?"
    + _CLOCK
    + r"(?: (?:UTC|GMT|[A-Z]{1,4}T|[+-]\d{4})\b)?(?: \d{4}\b)?"
)
# A host name with a port, at the start of a dotted name: two dots at least (``Foo.java:12`` is a file's line) and a
# digit or a hyphen in its first label, as a fleet numbers its hosts (``pkg.mod.sub:12`` is a module's line).
_LABEL = r"[A-Za-z0-9][A-Za-z0-9-]{0,62}"
_HOST_PORT = r"(?<![\w.-])(?=[A-Za-z]{0,62}[\d-])" + _LABEL + r"(?:\." + _LABEL + r"){2,126}:\d{1,5}\b"

# (pattern, placeholder), tried in this order on the whole line.
_VALUES: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"\b" + _UUID + r"\b"), "<uuid>"),
    (re.compile(r"\b[a-zA-Z][a-zA-Z0-9+.-]*://[^\s\"'<>]+"), "<url>"),
    (re.compile(r"\b" + _DATE + r"(?:[T ]" + _CLOCK + _ZONE + r"|[T ]\d{1,2}:\d{2}" + _ZONE + r")?\b"), "<time>"),
    (re.compile(_CTIME), "<time>"),
    (re.compile(r"\b" + _CLOCK + r"\b"), "<time>"),
    (re.compile(r"\b(?:[0-9a-fA-F]{2}[:-]){3,}[0-9a-fA-F]{2}\b"), "<id>"),
    (re.compile(r"(?<![\w/.])(?:\d{1,3}\.){3}\d{1,3}(?::\d{1,5})?\b"), "<ip>"),
    (re.compile(_IPV6), "<ip>"),
    (re.compile(_HOST_PORT), "<host>"),
    (re.compile(r"\b0[xX][0-9a-fA-F]+\b"), "<hex>"),
    (re.compile(r"(?<![\w.])[A-Z][A-Z0-9_]{0,63}\(\d{1,20}(?:,\d{1,20}){0,7}\)"), "<id>"),
    (re.compile(r"(?<![\w<>])(?:~|\.{1,2})?(?:/[^\s/:,;\"'()\[\]{}<>]+)+/?"), "<path>"),
    (re.compile(r"(?<![\w.])[-+]?\d+(?:\.\d+)?\s?(?:[KMGTPE]i?B|bytes)\b", re.I), "<size>"),
    (re.compile(r"(?<![\w.])[-+]?\d+(?:\.\d+)?(?:ns|us|µs|ms|s|sec|secs|min|h)\b"), "<duration>"),
    (re.compile(r"(?<=[=:])\s?\"[^\"]{0,200}\"|(?<==)'[^']{0,200}'"), "<quoted>"),
    (re.compile(r"\b(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{12,}\b"), "<hex>"),
)
_SPLIT = re.compile(r"(\s+|[,;()\[\]{}\"']|\.{2,})")  # and an ellipsis or a leader (``depth......0``)
PLACEHOLDERS = ("uuid", "url", "time", "id", "ip", "host", "hex", "path", "size", "duration", "quoted")
_PLACEHOLDER = re.compile(r"<(?:" + "|".join(PLACEHOLDERS) + r"|\*)>")
_KEY_VALUE = re.compile(r"([A-Za-z_][\w.-]*)([=:])(.+)")
_DIGIT = re.compile(r"\d")
_KEEP_END = ":."  # a masked token keeps a trailing ':' or '.' (the sentence around it is constant)
_RUN = re.compile(r"<\*>(?:[ ,]+<\*>)+")


def _values(line: str) -> str:
    """The line with every whole value (pass 1) replaced by its placeholder."""
    for pattern, placeholder in _VALUES:
        line = pattern.sub(placeholder, line)
    return line


def _token(token: str) -> str:
    """One token masked (pass 2): kept when it holds no digit; a key=value keeps its key (and a value's own keys:
    ``device=cuda:1`` is ``device=cuda:<*>``), peeled in a loop, not a recursion (``a:a:a:...`` has thousands)."""
    keys: list[str] = []
    while token and not _PLACEHOLDER.fullmatch(token.rstrip(_KEEP_END)):
        key_value = _KEY_VALUE.fullmatch(token)
        if key_value is None or key_value.group(1)[-1].isdigit():
            return "".join(keys) + _masked(token)
        keys.append(key_value.group(1) + key_value.group(2))
        token = key_value.group(3)
    return "".join(keys) + token


def _masked(token: str) -> str:
    """A token that is not a key=value: ANY when it holds a digit or a placeholder, else itself."""
    if _DIGIT.search(token) or _PLACEHOLDER.search(token):
        return ANY + (token[-1] if token[-1] in _KEEP_END else "")
    return token


def template(line: str) -> str:
    """The line's template: its variable parts replaced by placeholders (see the module's doc). Pure."""
    parts = _SPLIT.split(_values(line[:TEMPLATE_CHARS].strip()))
    # re.split with a capturing group alternates tokens (even places) and the delimiters between them (odd ones).
    templated = "".join(_token(part) if i % 2 == 0 else part for i, part in enumerate(parts))
    return templated[:TEMPLATE_CHARS]  # a placeholder may be longer than its value: the template is bounded too


def shape(templated: str) -> str:
    """What a kind is keyed by: a template with every placeholder as ``<*>`` and a run of them (a list of values
    of any length: ``IRQs 3 4 5``) as one. Typed placeholders read better, but a value's type is not the message's
    (an address given as an IP in one line and as a hostname in the next is the same slot)."""
    return _RUN.sub(ANY, _PLACEHOLDER.sub(ANY, templated))
