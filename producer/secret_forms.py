"""Pure helpers of secret masking: URL credentials, the base64 forms of a value, and one-pass needle finders."""

from __future__ import annotations

import base64
import re
from collections import defaultdict
from collections.abc import Iterable, Iterator
from typing import Any, TypeVar

MASK = "***"
B64_MIN = 8  # shortest base64 form of a named secret that is masked (8 characters: 48 bits of it)
B64_WRAPS = (76, 64)  # the line widths base64 tools wrap at (base64(1), MIME; PEM, openssl base64)
_URLSAFE = str.maketrans("+/", "-_")
_SCHEME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789+.-")
_URL_END = re.compile(r"[\s\"'<>`]")  # where a URL ends in running text
_AUTHORITY_END = re.compile(r"[/?#]")
# a host (name, IPv4, [IPv6]) and port, ending the authority: what may follow the '@' of credentials
_HOST = re.compile(r"(?:[A-Za-z0-9._\-]+|\[[0-9A-Fa-f:.]+\])(?::[0-9]{0,5})?(?=[/?#]|$)")
# any URL with credentials holds this (userinfo and its '@' are never split by a blank or a quote): a cheap test,
# linear on any line (a scan from one "://" stops at the next one)
URL_AT = re.compile(r"://[^\s\"'<>`@:]*+(?::(?!//)[^\s\"'<>`@:]*+)*+@")


def _is_port(text: str) -> bool:
    """A TCP port number: 1 to 5 digits, at most 65535 (more digits can only be a password)."""
    return text.isdigit() and len(text) <= 5 and int(text) <= 65535


def _plausible_host(host: str) -> bool:
    return "." in host or ":" in host or host.startswith("[") or host == "localhost"


def userinfo_len(rest: str) -> int:
    """Pure: how many characters at the start of ``rest`` (a URL after its ``scheme://``, up to where the URL ends)
    are credentials and their '@' (0: none).

    The rule (docs/agent.md, "Secrets"): credentials end at the last '@' before the first '/', '?' or '#' (RFC 3986),
    so an empty user, a token alone and a password holding '@' are all found; but where the part before that is
    ``user:password`` (a ':' not followed by a port number, 0 to 65535) and what the RFC reading takes for the host
    does not look like one (no '.', no port, not localhost), or there is no '@' before the first '/', a password
    holding '/', '?' or '#' is assumed: they run to the last '@' of the URL that is followed by a host. An address
    with no ':' before its first '/' (``https://example.com/a@b``) has no credentials.
    """
    m = _AUTHORITY_END.search(rest)
    auth = rest[: m.start()] if m else rest
    at = auth.rfind("@")
    user = auth[:at] if at >= 0 else auth
    colon = user.find(":")
    passwordish = colon >= 0 and not _is_port(user[colon + 1 :]) and not user.startswith("[")  # [IPv6]:port
    if at >= 0 and (not passwordish or _plausible_host(auth[at + 1 :])):
        return at + 1
    if not passwordish:
        return 0
    best = -1
    p = rest.find("@", len(user))
    while p >= 0:
        if _HOST.match(rest, p + 1):
            best = p
        p = rest.find("@", p + 1)
    if best >= 0:
        return best + 1
    return at + 1 if at >= 0 else 0


def _urls(text: str) -> Iterator[tuple[int, int]]:
    """(start, end) of the part after ``scheme://`` of every URL in ``text``."""
    i = text.find("://")
    while i >= 0:
        j = i
        while j > 0 and i - j < 32 and text[j - 1] in _SCHEME_CHARS:
            j -= 1
        while j < i and not text[j].isalpha():
            j += 1
        start = i + 3
        if j == i:  # no scheme before it
            i = text.find("://", start)
            continue
        m = _URL_END.search(text, start)
        end = m.start() if m else len(text)
        yield start, end
        i = text.find("://", max(end, start))


def url_spans(text: str) -> list[tuple[int, int, str]]:
    """Pure: (start, end, replacement) of the credentials of every URL in ``text`` (``***:***@`` or ``***@``)."""
    out = []
    for start, end in _urls(text):
        n = userinfo_len(text[start:end])
        if n:
            out.append((start, start + n, f"{MASK}:{MASK}@" if ":" in text[start : start + n - 1] else f"{MASK}@"))
    return out


def cut_url_start(text: str) -> int | None:
    """Pure: a text cut short that ends inside a URL which may hold credentials: where its part after ``://``
    starts (to be masked to the end), else None."""
    for start, end in _urls(text):
        if end == len(text) and start < end:
            rest = text[start:]
            m = _AUTHORITY_END.search(rest)
            user = rest[: m.start()] if m else rest
            colon = user.find(":")
            if not m or "@" in user or (colon >= 0 and not user[colon + 1 :].isdigit()):
                return start
    return None


def base64_forms(raw: bytes) -> set[str]:
    """Pure: what base64 of ``raw`` shows whatever bytes come before and after it: for each of the three byte
    alignments, the characters that depend on ``raw`` alone, in the standard and the URL-safe alphabet; and the
    lines of its own encoding wrapped at 76 and 64 columns (``base64`` of the value alone, PEM). At least
    B64_MIN characters each."""
    out: set[str] = set()
    first_stable = ""
    for skip in range(3):
        enc = base64.b64encode(b"\0" * skip + raw).decode("ascii")
        stable = enc[-(-8 * skip // 6) : (8 * (skip + len(raw))) // 6]
        if skip == 0:
            first_stable = stable
        if len(stable) >= B64_MIN:
            out.update((stable, stable.translate(_URLSAFE)))
    for width in B64_WRAPS:
        if len(first_stable) > width:
            out.update(
                p
                for p in (first_stable[k : k + width] for k in range(0, len(first_stable), width))
                if len(p) >= B64_MIN
            )
    return out


S = TypeVar("S", str, bytes)
Needle = tuple  # (literal, characters one of which must follow it: empty for any), both str or both bytes


def _drop_covered(needles: Iterable[Needle]) -> list[Needle]:
    """The needles, those of one text merged (any follower of either), less those that hold a plain one (a text
    holding the longer holds the shorter)."""
    merged: dict = {}
    for lit, after in needles:
        if lit not in merged:
            merged[lit] = after
        elif not merged[lit] or not after:
            merged[lit] = after[:0]
        else:
            merged[lit] += after
    kept: list[Needle] = []
    for lit in sorted(merged, key=len):
        if not any(not k_after and k in lit for k, k_after in kept):
            kept.append((lit, merged[lit]))
    return kept


def _class(after: S) -> S:
    """A regex that matches one of the characters of ``after`` (nothing: the empty regex)."""
    if not after:
        return after
    chars = sorted({re.escape(after[i : i + 1]) for i in range(len(after))})
    if isinstance(after, bytes):
        return b"[" + b"".join(chars) + b"]"
    return "[" + "".join(chars) + "]"


def _trie(needles: list[Needle]) -> Any:
    """One regex for needles that share their first character, as a trie (``a(?:kia|pi_key[=:])``): at each place
    the first character is found, ``re`` tries the next characters once, not each needle in turn."""
    end = object()
    root: dict = {}
    for lit, after in needles:
        node = root
        for i in range(len(lit)):
            node = node.setdefault(lit[i : i + 1], {})
        node[end] = after
    empty = needles[0][0][:0]
    bar: Any
    open_: Any
    close: Any
    bar, open_, close = (b"|", b"(?:", b")") if isinstance(empty, bytes) else ("|", "(?:", ")")

    def emit(node: dict[Any, Any]) -> Any:  # str or bytes, as the needles
        alts = [re.escape(ch) + emit(child) for ch, child in node.items() if ch is not end]
        if end in node:
            alts.append(_class(node[end]))
        return alts[0] if len(alts) == 1 else open_ + bar.join(alts) + close

    return emit(root)


class Finder:
    """Whether a text holds any of many needles - a literal, maybe followed by one of some characters - in one
    C-speed pass per group of needles that share their first character (a plain ``in`` for a lone literal, else a
    compiled alternation, which ``re`` scans for that first character). A needle that holds a plain one is
    dropped: the shorter one finds it."""

    def __init__(self, needles: Iterable[Needle]) -> None:
        groups: dict[object, list[Needle]] = defaultdict(list)
        for n in _drop_covered(needles):
            groups[n[0][:1]].append(n)
        self.needles: tuple[Needle, ...] = tuple(n for g in groups.values() for n in g)
        self._plain = tuple(g[0] for g in groups.values() if len(g) == 1 and not g[0][1])
        rx = [g for g in groups.values() if len(g) > 1 or g[0][1]]
        self._patterns = tuple(re.compile(_trie(g)) for g in rx)
        self._members = {p.pattern: g for p, g in zip(self._patterns, rx, strict=True)}
        self._searches = tuple(p.search for p in self._patterns)

    def __bool__(self) -> bool:
        return bool(self.needles)

    def __call__(self, text: S) -> bool:
        for lit, _ in self._plain:
            if lit in text:
                return True
        return any(search(text) is not None for search in self._searches)

    def scan(self, text: S, limit: int) -> dict[Needle, list[int] | None]:
        """Where each needle found in ``text`` starts; None for a needle found more than ``limit`` times (a group's
        needles all get None once the group was found that often: the caller then looks for all of them)."""
        out: dict = {}
        for n in self._plain:
            c = text.count(n[0])
            if c > limit:
                out[n] = None
            elif c:
                out[n] = list(_find_all(text, n[0]))
        for pattern in self._patterns:
            members = self._members[pattern.pattern]
            for found, m in enumerate(pattern.finditer(text), 1):
                if found > limit:
                    for n in members:
                        out[n] = None
                    break
                g = m.group()
                n = next(n for n in members if g == n[0] or (n[1] and g[:-1] == n[0] and g[-1:] in n[1]))
                out.setdefault(n, []).append(m.start())
        return out


def _find_all(text: S, needle: S) -> Iterator[int]:
    p = text.find(needle)
    while p >= 0:
        yield p
        p = text.find(needle, p + 1)
