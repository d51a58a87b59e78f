"""Pure secret masking: named values (also split across lines, also in base64), URL credentials, well-known shapes."""

from __future__ import annotations

import functools
import logging
import operator
import re
import shlex
from bisect import bisect_left
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from itertools import accumulate, count

from flightrec.producer.secret_forms import MASK, URL_AT, Finder, base64_forms, cut_url_start, url_spans
from flightrec.producer.shapes import SecretShape, needle_parts

log = logging.getLogger(__name__)

__all__ = ["MASK", "MIN_SECRET_LEN", "Carry", "NO_CARRY", "Redactor", "visible"]

MIN_SECRET_LEN = 4
# a line that ends with at least this many first characters of a named secret has them masked (the rest may
# start the next line, which is not there yet); fewer cannot be told from ordinary text and stay
EAGER = MIN_SECRET_LEN
CUT_WINDOW = 320  # a line cut short with a shape's needle this close to its end: masked from the needle on
FEW = 32  # a shape whose needles are found at most this often in a batch is matched line by line, else in one pass


def visible(text: str) -> tuple[str, bool]:
    """Pure: ``text`` as valid UTF-8, undecodable bytes (surrogate escapes) as ``\\xNN``; and whether any was."""
    try:
        text.encode("utf-8")
        return text, False
    except UnicodeEncodeError:
        pass
    try:
        raw = text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:  # a lone surrogate that was never a byte: show its code point
        return text.encode("utf-8", "backslashreplace").decode("utf-8"), True
    return raw.decode("utf-8", "backslashreplace"), True


@dataclass(frozen=True)
class Carry:
    """What masking a source's next lines needs from its lines before: the end of the last one (unmasked, at most
    the longest named secret less one character: the first part of a secret split across two lines) and the shape
    whose following lines are being masked (a private key's body), if any."""

    tail: str = field(default="", repr=False)
    follow: str | None = None


NO_CARRY = Carry()


def _forms(value: str) -> tuple[set[str], set[str]]:
    """The strings to mask for one secret value (itself, its visible form, each of its lines), and those of them
    that may be printed split across two lines (the single-line ones: the value and its visible form)."""
    out = {value}
    shown, escaped = visible(value)
    if escaped:
        out.add(shown)
    whole = {v for v in out if "\n" not in v and "\r" not in v}
    for v in list(out):
        if "\n" in v or "\r" in v:
            out.update(line.strip() for line in v.splitlines() if len(line.strip()) >= MIN_SECRET_LEN)
    return {v for v in out if len(v) >= MIN_SECRET_LEN}, {v for v in whole if len(v) >= MIN_SECRET_LEN}


def _split_needles(f: str) -> list[str]:
    """What a read holds when it holds a part of ``f`` that split masking must see: its first EAGER characters
    (a first part long enough to mask), and what every second part after a shorter first part holds."""
    out = [f[:EAGER]] if len(f) > EAGER else []
    if len(f) - (EAGER - 1) >= EAGER:
        out.append(f[EAGER - 1 :])
    else:  # a short secret: the split itself, the line break inside it
        out += [f[:i] + nl + f[i:] for i in range(1, min(EAGER, len(f))) for nl in ("\n", "\r\n")]
    return out


Span = tuple[int, int, str]  # (start, end, replacement) of a part of a line to mask


def _match_spans(m: re.Match[str], groups: tuple[str, ...], offset: int = 0) -> list[Span]:
    """The masked part of match ``m``: its named ``groups`` that took part, else all of it."""
    if not groups:
        return [(m.start() - offset, m.end() - offset, MASK)]
    return [(m.start(g) - offset, m.end(g) - offset, MASK) for g in groups if m.end(g) > m.start(g) >= 0]


def _build(text: str, spans: list[Span]) -> str:
    """``text`` with ``spans`` replaced; spans that overlap become one, replaced as the one reaching furthest says."""
    if not spans:
        return text
    spans.sort(key=lambda s: (s[0], -s[1]))
    out: list[str] = []
    pos = 0
    a, b, r = spans[0]
    for x, y, z in spans[1:]:
        if x < b:
            if y > b:
                b, r = y, z
            continue
        out += [text[pos:a], r]
        pos, (a, b, r) = b, (x, y, z)
    out += [text[pos:a], r, text[b:]]
    return "".join(out)


def _shape_spans(shape: SecretShape, text: str) -> tuple[list[Span], bool]:
    """What ``shape`` masks in one line, and whether a match of it ends the line (blanks aside)."""
    spans: list[Span] = []
    ends = False
    for m in shape.regex.finditer(text):
        if m.end() > m.start():
            spans += _match_spans(m, shape.mask)
            ends = m.end() >= len(text.rstrip())
    return spans, ends


def _follow_spans(shape: SecretShape, text: str) -> list[Span] | None:
    """What is masked of a line that follows a match of ``shape`` (None: it does not follow, the block ended)."""
    m = shape.follow.match(text) if shape.follow is not None else None
    return None if m is None else _match_spans(m, shape.follow_mask)


class _Lines:
    """Where the lines of a joined batch are: position -> line, line -> start and end (C-speed bisection)."""

    def __init__(self, texts: Sequence[str]) -> None:
        self.texts = texts

    @functools.cached_property
    def ends(self) -> list[int]:
        """Where each line ends in the joined batch (its "\n", or the end)."""
        return list(map(operator.add, accumulate(map(len, self.texts)), count()))

    def line(self, pos: int) -> int:
        """The line holding ``pos`` (the "\n" after a line counts as that line's)."""
        return bisect_left(self.ends, pos)

    def start(self, i: int) -> int:
        return self.ends[i] - len(self.texts[i])


class Redactor:
    """Masks secrets in text before it leaves the process.

    Guarantees: every occurrence of each secret value (taken from the environment variables named in ``names``; values
    shorter than ``MIN_SECRET_LEN`` are not masked, because masking ``1`` everywhere would destroy the logs - a warning
    says so) is replaced by ``***`` (overlapping ones by one ``***``); a multi-line value (a PEM key) is also masked
    line by line, since logs are shipped line by line; a value holding undecodable bytes is masked in its ``\\xNN`` form
    too; its base64 (any byte alignment, standard or URL-safe, or wrapped at 76 or 64 columns) too; a value printed
    across two lines is masked at the end of the first (a first part of EAGER characters or more) and at the start of
    the second (when the line before ends with the first part: :meth:`stream` and its :class:`Carry`); URL credentials
    (:func:`secret_forms.userinfo_len`) become ``***:***@`` or ``***@``; each of ``shapes`` masks its part of every
    match, and the lines that follow one where it says so; a text cut short (:meth:`cut`) loses a trailing part that
    could be the start of a secret. Pure apart from reading the mapping.
    """

    def __init__(
        self, names: Sequence[str] = (), env: Mapping[str, str] | None = None, shapes: Sequence[SecretShape] = ()
    ) -> None:
        env = env if env is not None else {}
        values: set[str] = set()
        splits: set[str] = set()
        for name in names:
            value = env.get(name)
            if not value:
                continue
            if len(value) < MIN_SECRET_LEN:
                log.warning(
                    "FLIGHTREC_REDACT: the value of %s is shorter than %d characters and is not masked",
                    name,
                    MIN_SECRET_LEN,
                )
                continue
            forms, whole = _forms(value)
            values |= forms | base64_forms(value.encode("utf-8", "surrogateescape"))
            splits |= whole
        self.values: tuple[str, ...] = tuple(sorted(values, key=len, reverse=True))
        self.shapes: tuple[SecretShape, ...] = tuple(shapes)
        self._splits = tuple(sorted(splits, key=len, reverse=True))
        self._keep = max((len(f) for f in self._splits), default=1) - 1  # the characters of a line a Carry keeps
        self._by_name = {s.name: s for s in self.shapes}
        # URL credentials always hold an '@': one memchr, where "://" would be a full pass (':' is in every timestamp)
        raw = ["@", *self.values, *(n for f in self._splits for n in _split_needles(f))]
        parts = [[needle_parts(n) for n in s.needles] for s in self.shapes]
        exact = [n for s, p in zip(self.shapes, parts, strict=True) if s.case_sensitive for n in p]
        folded = [n for s, p in zip(self.shapes, parts, strict=True) if not s.case_sensitive for n in p]
        # what, found in the bytes of a read, means it may need masking (the fast path is for ASCII reads only: a
        # needle that is not ASCII cannot be in one): as written, and in bytes.lower()
        self._raw = Finder(
            [(n.encode("ascii"), b"") for n in raw if n.isascii()] + [(a.encode(), b.encode()) for a, b in exact]
        )
        self._folded = Finder([(a.encode(), b.encode()) for a, b in folded])
        self._exact, self._needles = Finder(exact), Finder(folded)  # in the text, in str.lower()
        self._finders = [Finder(p) for p in parts]  # each shape's own
        self._split_finder = Finder([(n, "") for f in self._splits for n in _split_needles(f)])
        # a needle found -> the shapes that may match there: those with a needle whose text holds its text (the same
        # text with other followers; a needle dropped as holding a plain shorter one), of the same case rule
        self._shapes_for = {
            (k, sensitive): tuple(
                i
                for i, (s, p) in enumerate(zip(self.shapes, parts, strict=True))
                if s.case_sensitive == sensitive and any(k[0] in n[0] for n in p)
            )
            for sensitive, finder in ((True, self._exact), (False, self._needles))
            for k in finder.needles
        }
        # each regex as matched in the joined lines of a batch: ^ and $ at every line's start and end
        self._joined = {s.name: re.compile(s.regex.pattern, s.regex.flags | re.MULTILINE) for s in self.shapes}

    # -- the fast path ----------------------------------------------------------

    def may_need(self, pending: bytes, data: bytes, carry: Carry | None = None) -> bool:
        """Whether ASCII text made of ``pending`` followed by ``data`` may hold something to mask, the lines before
        it being summed up by ``carry`` (False: :meth:`stream` would return every line of it unchanged). One C-speed
        scan of the bytes per group of needles (see :class:`secret_forms.Finder`)."""
        if carry is not None:
            if carry.follow is not None:
                return True
            if carry.tail:
                if not carry.tail.isascii():  # a secret's first part may be there: no ASCII needle finds it
                    return True
                pending = carry.tail.encode("ascii") + b"\n" + pending
        buf = pending + data if pending else data
        return self._raw(buf) or (bool(self._folded) and self._folded(buf.lower()))

    def carry_after(self, last_line: bytes) -> Carry:
        """The carry after an ASCII line that needed no masking (what the fast path keeps of it)."""
        return Carry(last_line[-self._keep :].decode("ascii")) if self._splits and last_line else NO_CARRY

    # -- lines ------------------------------------------------------------------

    def stream(
        self, texts: list[str], truncated: Sequence[bool] | None = None, carry: Carry = NO_CARRY
    ) -> tuple[list[str], Carry]:
        """Lines of one source in order, masked, and the carry for its next lines. ``truncated`` flags lines that
        were cut short (see :meth:`cut`). A few C-speed scans of the joined lines find the lines that need work
        (when none does, ``texts`` itself is returned); the shapes whose needles are in many lines are matched
        in one pass over the joined lines."""
        n = len(texts)
        if not n:
            return texts, carry
        follow = self._by_name.get(carry.follow) if carry.follow else None
        after = Carry(texts[-1][-self._keep :]) if self._splits and texts[-1] else NO_CARRY
        blob = "\n".join(texts)
        where = _Lines(texts)
        edges = self._edges(carry.tail, blob, where) if self._splits else {}
        found, starts = self._shape_matches(blob, where) if self.shapes else ({}, {})
        named = self._named_lines(blob, where)
        cut = {i for i, c in enumerate(truncated) if c} if truncated is not None and any(truncated) else set()
        if not (cut or follow or edges or found or starts or named):
            return texts, after
        out = list(texts)
        todo = iter(sorted(set(edges) | set(found) | set(starts) | named | cut))
        i = 0 if follow is not None else next(todo, n)
        while i < n:
            raw = texts[i]
            if follow is not None:
                spans = _follow_spans(follow, raw)
                if spans is not None:
                    out[i] = _build(raw, spans + (self._named_spans(raw) if i in named else []))
                    i += 1
                    continue
                follow = None
            spans = list(found.get(i, ()))
            if i in edges:
                head, tail = edges[i]
                spans += [(0, head, MASK)] if head else []
                spans += [(len(raw) - tail, len(raw), MASK)] if tail else []
            if i in named:
                spans += self._named_spans(raw)
            follow = starts.get(i)
            if i in cut:
                more, started = self._cut_spans(raw)
                spans += more
                follow = follow or started
            out[i] = _build(raw, spans)
            if follow is not None:
                i += 1
                continue
            nxt = next(todo, n)
            while nxt <= i:
                nxt = next(todo, n)
            i = nxt
        return out, Carry(after.tail, follow.name if follow is not None else None)

    def lines(self, texts: list[str], truncated: Sequence[bool] | None = None) -> list[str]:
        """Many lines of one source with nothing before them (see :meth:`stream`)."""
        return self.stream(texts, truncated)[0]

    def _named_spans(self, text: str) -> list[Span]:
        """The named values (every form) and URL credentials in one line."""
        spans: list[Span] = []
        for v in self.values:
            p = text.find(v)
            while p >= 0:
                spans.append((p, p + len(v), MASK))
                p = text.find(v, p + len(v))
        if "://" in text and "@" in text:
            spans += url_spans(text)
        return spans

    def _named_lines(self, blob: str, where: _Lines) -> set[int]:
        """The lines that hold a named value or what may be URL credentials."""
        lines: set[int] = set()
        for v in self.values:
            p = blob.find(v)
            while p >= 0:
                i = where.line(p)
                lines.add(i)
                p = blob.find(v, where.ends[i])
        if "://" in blob:
            lines.update(where.line(m.start()) for m in URL_AT.finditer(blob))
        return lines

    def _shape_matches(self, blob: str, where: _Lines) -> tuple[dict[int, list[Span]], dict[int, SecretShape]]:
        """What the shapes mask in each line, and the lines a match of a shape with ``follow`` ends."""
        texts = where.texts
        found: dict[int, list[Span]] = defaultdict(list)
        starts: dict[int, SecretShape] = {}

        def one(shape: SecretShape, i: int) -> None:
            spans, ends = _shape_spans(shape, texts[i])
            if spans:
                found[i] += spans
            if ends and shape.follow is not None:
                starts[i] = shape

        low = blob.lower() if self._needles else blob
        if len(low) != len(blob):  # a character whose lowercase is longer ('İ'): line by line
            for i, t in enumerate(texts):
                for shape in self._candidates(t):
                    one(shape, i)
            return found, starts
        at: dict[int, list[int] | None] = {}  # shape (its index) -> where its needles are (None: in many places)
        for sensitive, finder, text in ((True, self._exact, blob), (False, self._needles, low)):
            for needle, positions in finder.scan(text, FEW).items() if finder else ():
                for k in self._shapes_for[needle, sensitive]:
                    have = at.get(k, [])
                    at[k] = (
                        None
                        if positions is None or have is None or len(have) + len(positions) > FEW
                        else have + positions
                    )
        for k, positions in at.items():
            shape = self.shapes[k]
            if positions is not None:
                for i in sorted({where.line(p) for p in positions}):
                    one(shape, i)
                continue
            done: set[int] = set()  # one pass over the joined lines (its regex with ^ and $ at each line)
            for m in self._joined[shape.name].finditer(blob):
                a, b = m.span()
                i = where.line(a)
                if a == b or i in done:
                    continue
                if b > where.ends[i]:  # it runs into the next line: match the lines it touches one by one
                    for j in range(i, where.line(b - 1) + 1):
                        if j not in done:
                            done.add(j)
                            one(shape, j)
                    continue
                off = where.start(i)
                found[i] += _match_spans(m, shape.mask, off)
                if shape.follow is not None and b >= off + len(texts[i].rstrip()):
                    starts[i] = shape
        return found, starts

    def _candidates(self, text: str) -> list[SecretShape]:
        """The shapes one of whose needles is in ``text``."""
        low = text.lower()
        return [
            s for s, found in zip(self.shapes, self._finders, strict=True) if found(text if s.case_sensitive else low)
        ]

    def _edges(self, before: str, blob: str, where: _Lines) -> dict[int, tuple[int, int]]:
        """Pure: (characters to mask at the start, at the end) of the lines that hold a part of a named secret split
        across two lines; ``before`` is the end of the line before the first one."""
        full = f"{before}\n{blob}"
        if not self._split_finder(full):
            return {}
        off, n = len(before) + 1, len(where.texts)
        edges: dict[int, tuple[int, int]] = {}

        def line_ending_at(e: int) -> int:  # the line whose end is at ``e`` in ``full`` (-1: ``before``)
            return -1 if e < off else where.line(e - off)

        def add(i: int, start: int = 0, end: int = 0) -> None:
            if 0 <= i < n:
                s, e = edges.get(i, (0, 0))
                edges[i] = (max(s, start), max(e, end))

        for f in self._splits:
            size = len(f)
            if size > EAGER:  # a line ending with EAGER or more first characters; the next one going on with the rest
                head, p = f[:EAGER], full.find(f[:EAGER])
                while p >= 0:
                    e = full.find("\n", p)
                    e = len(full) if e < 0 else e
                    k = e - p
                    if k < size and full.startswith(f[:k], p):
                        line = line_ending_at(e)
                        add(line, end=k)
                        if line + 1 < n and full.startswith(f[k:], e + 1):
                            add(line + 1, start=size - k)
                        p = full.find(head, e)
                    else:
                        p = full.find(head, p + 1)
            for i in range(1, min(EAGER, size)):  # a first part of 1..EAGER-1 characters: the rest is masked
                pattern = f[:i] + "\n" + f[i:]
                p = full.find(pattern)
                while p >= 0:
                    add(line_ending_at(p + i) + 1, start=size - i)
                    p = full.find(pattern, p + 1)
        return edges

    def _cut_spans(self, text: str) -> tuple[list[Span], SecretShape | None]:
        """A line cut short: what ends it and may be the start of a secret - a named secret's first characters, a
        URL's credentials, a shape cut before it could match (from its needle on, near the end) - and the shape
        whose following lines are to be masked, if that needle is one of such a shape."""
        spans: list[Span] = []
        longest = 0
        for v in self.values:
            for k in range(min(len(v) - 1, len(text)), longest, -1):
                if text.endswith(v[:k]):
                    longest = k
                    break
        if longest:
            spans.append((len(text) - longest, len(text), MASK))
        url = cut_url_start(text) if "://" in text else None
        if url is not None:
            spans.append((url, len(text), MASK))
        if not self.shapes:
            return spans, None
        start = max(0, len(text) - CUT_WINDOW)
        low = text[start:].lower()
        best, which = -1, None
        for shape in self.shapes:
            for nd in shape.needles:
                p = low.rfind(needle_parts(nd)[0].lower())  # the literal alone, any case: the rest may be cut off
                if p > best:
                    best, which = p, shape
        if which is None:
            return spans, None
        spans.append((start + best, len(text), MASK))
        return spans, which if which.follow is not None else None

    # -- single texts -------------------------------------------------------------

    def text(self, line: str) -> str:
        """One string with its secrets masked (a string of several lines: as lines of one source)."""
        if "\n" in line:
            parts = line.split("\n")
            out = self.stream(parts)[0]
            return line if out is parts else "\n".join(out)
        spans = self._named_spans(line)
        if self.shapes and (self._exact(line) or (self._needles and self._needles(line.lower()))):
            for shape in self._candidates(line):
                spans += _shape_spans(shape, line)[0]
        return _build(line, spans)

    def cut(self, line: str) -> str:
        """A string that was cut short (a long line): masked, and a trailing start of a secret masked too."""
        return self.stream([line], [True])[0][0]

    def argv(self, argv: Sequence[str]) -> str:
        """A command line for display: masked as one command line (:meth:`argv_list`), joined with shell quoting."""
        return shlex.join(self.argv_list(argv))

    def argv_list(self, argv: Sequence[str]) -> list[str]:
        """The arguments of a command masked as one command line, element by element: an argument that holds a secret
        of its own is masked as :meth:`text` masks it (``--token=***``); one that a match over the joined command line
        reaches (the value after ``--password``, a separate argument) becomes ``***`` whole."""
        own = [self.text(a) for a in argv]
        quoted = [shlex.quote(a) for a in argv]
        line = " ".join(quoted)
        spans = self._named_spans(line)
        if self.shapes and (self._exact(line) or (self._needles and self._needles(line.lower()))):
            for shape in self._candidates(line):
                spans += _shape_spans(shape, line)[0]
        if not spans:
            return own
        out, pos = [], 0
        for arg, mine, q in zip(argv, own, quoted, strict=True):
            start, end = pos, pos + len(q)
            pos = end + 1
            reached = any(a < end and b > start for a, b, _ in spans)
            out.append(mine if mine != arg or not reached else MASK)
        return out

    def mapping(self, values: Mapping[str, str]) -> dict[str, str]:
        """A string map with its keys and values masked."""
        return {self.text(k): self.text(v) for k, v in values.items()}
