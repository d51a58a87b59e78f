"""Pure secret masking: values of named environment variables (every line of them) and credentials in URLs."""

from __future__ import annotations

import logging
import re
import shlex
from typing import Mapping, Sequence

log = logging.getLogger(__name__)

MASK = "***"
MIN_SECRET_LEN = 4
# scheme://userinfo@ : the userinfo runs to the last '@' before a '/' or a blank, so an empty user
# (redis://:pw@h), a token alone (https://TOKEN@h) and a password holding '@' are all masked whole
_URL_CREDS = re.compile(r"([A-Za-z][A-Za-z0-9+.\-]{0,31}://)([^\s/]*)@")
# a cut line ending inside a URL's authority: what follows :// may be the start of a credential
_URL_CUT = re.compile(r"([A-Za-z][A-Za-z0-9+.\-]{0,31}://)[^\s/]+$")


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


def _url_sub(m: re.Match[str]) -> str:
    return m.group(1) + (f"{MASK}:{MASK}@" if ":" in m.group(2) else f"{MASK}@")


def _forms(value: str) -> set[str]:
    """The strings to mask for one secret value: itself, its visible form, and each of its lines."""
    out = {value}
    shown, escaped = visible(value)
    if escaped:
        out.add(shown)
    for v in list(out):
        if "\n" in v or "\r" in v:
            out.update(line.strip() for line in v.splitlines() if len(line.strip()) >= MIN_SECRET_LEN)
    return {v for v in out if len(v) >= MIN_SECRET_LEN}


class Redactor:
    """Masks secrets in text before it leaves the process.

    Guarantees: every occurrence of each secret value (taken from the environment
    variables named in ``names``; values shorter than ``MIN_SECRET_LEN`` are not
    masked, because masking ``1`` everywhere would destroy the logs - a warning
    says so) is replaced by ``***``, longest value first; a multi-line value (a PEM
    key) is also masked line by line, since logs are shipped line by line; a value
    holding undecodable bytes is masked in its ``\\xNN`` form too; the userinfo of a
    URL (``scheme://user:pass@``, ``scheme://:pass@``, ``scheme://TOKEN@``) becomes
    ``***:***@`` or ``***@``; a text cut short (:meth:`cut`) loses a trailing part
    that could be the start of a secret. Pure apart from reading the given mapping.
    """

    def __init__(self, names: Sequence[str] = (), env: Mapping[str, str] | None = None) -> None:
        env = env if env is not None else {}
        values: set[str] = set()
        for name in names:
            value = env.get(name)
            if not value:
                continue
            if len(value) < MIN_SECRET_LEN:
                log.warning("FLIGHTREC_REDACT: the value of %s is shorter than %d characters and is not masked",
                            name, MIN_SECRET_LEN)
                continue
            values.update(_forms(value))
        self.values: tuple[str, ...] = tuple(sorted(values, key=len, reverse=True))
        needles = [b"://"]  # what, found in ASCII bytes, means a line may need masking
        for v in self.values:
            try:
                needles.append(v.encode("utf-8"))
            except UnicodeEncodeError:  # holds undecodable bytes: never in text decoded from ASCII
                pass
        self._needles = tuple(needles)

    def may_need(self, pending: bytes, data: bytes) -> bool:
        """Whether ASCII text made of ``pending`` followed by ``data`` may hold a secret or URL credentials
        (False: :meth:`lines` would return every line of it unchanged). A few C scans of the bytes."""
        for n in self._needles:
            k = len(n) - 1
            if n in data or (pending and (n in pending or n in pending[-k:] + data[:k])):
                return True
        return False

    def text(self, line: str) -> str:
        """One string with its secrets masked."""
        for v in self.values:
            if v in line:
                line = line.replace(v, MASK)
        if "://" in line:
            line = _URL_CREDS.sub(_url_sub, line)
        return line

    def cut(self, line: str) -> str:
        """A string that was cut short (a long line): masked, and a trailing start of a secret masked too."""
        line = self.text(line)
        longest = max((k for v in self.values for k in range(min(len(v) - 1, len(line)), 0, -1)
                       if line.endswith(v[:k])), default=0)
        if longest:
            line = line[:-longest] + MASK
        if "://" in line:
            line = _URL_CUT.sub(lambda m: m.group(1) + MASK, line)
        return line

    def argv(self, argv: Sequence[str]) -> str:
        """A command line for display: each argument masked, then joined with shell quoting."""
        return shlex.join(self.text(a) for a in argv)

    def _any(self, blob: str) -> bool:
        if "://" in blob and _URL_CREDS.search(blob):
            return True
        return any(v in blob for v in self.values)

    def lines(self, texts: list[str], truncated: Sequence[bool] | None = None) -> list[str]:
        """Many lines: one scan of the joined batch decides whether any line needs work (the fast path).

        ``truncated`` flags lines that were cut short; those go through :meth:`cut`.
        """
        if not texts:
            return texts
        if truncated is not None and any(truncated):
            return [self.cut(t) if c else self.text(t) for t, c in zip(texts, truncated)]
        if not self._any("\n".join(texts)):
            return texts
        return [self.text(t) for t in texts]

    def mapping(self, values: Mapping[str, str]) -> dict[str, str]:
        """A string map with its keys and values masked."""
        return {self.text(k): self.text(v) for k, v in values.items()}
