"""Pure secret masking: values of named environment variables and credentials in URLs."""

from __future__ import annotations

import logging
import re
from typing import Mapping, Sequence

log = logging.getLogger(__name__)

MASK = "***"
MIN_SECRET_LEN = 4
# scheme://user:password@  (the user part and the password are both credentials)
_URL_CREDS = re.compile(r"([A-Za-z][A-Za-z0-9+.\-]{0,31}://)[^\s/:@]+:[^\s/@]*@")


class Redactor:
    """Masks secrets in text before it leaves the process.

    Guarantees: every occurrence of each secret value (taken from the environment
    variables named in ``names``; values shorter than ``MIN_SECRET_LEN`` are not
    masked, because masking ``1`` everywhere would destroy the logs - a warning
    says so) is replaced by ``***``, longest value first; ``scheme://user:pass@``
    becomes ``scheme://***:***@``. Pure apart from reading the given mapping.
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
            values.add(value)
        self.values: tuple[str, ...] = tuple(sorted(values, key=len, reverse=True))

    def text(self, line: str) -> str:
        """One string with its secrets masked."""
        for v in self.values:
            if v in line:
                line = line.replace(v, MASK)
        if "://" in line:
            line = _URL_CREDS.sub(r"\1***:***@", line)
        return line

    def _any(self, blob: str) -> bool:
        if "://" in blob and _URL_CREDS.search(blob):
            return True
        return any(v in blob for v in self.values)

    def lines(self, texts: list[str]) -> list[str]:
        """Many lines: one scan of the joined batch decides whether any line needs work (the fast path)."""
        if not texts:
            return texts
        if not self._any("\n".join(texts)):
            return texts
        return [self.text(t) for t in texts]

    def mapping(self, values: Mapping[str, str]) -> dict[str, str]:
        """A string map with its values masked."""
        return {k: self.text(v) for k, v in values.items()}
