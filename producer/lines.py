"""Pure line handling: split a byte stream into lines, cut long ones, collapse CR progress bars, decode."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

DEFAULT_MAX_LINE = 64 * 1024


def _collapse_cr(segment: bytes) -> bytes:
    """Keep what a terminal would show: the text after the last carriage return that has text after it.

    ``b"10%\\r50%\\r100%"`` -> ``b"100%"``; trailing CRs (``b"done\\r"``, the CR of CRLF) are kept
    so the caller can strip them once the line is complete.
    """
    stripped = segment.rstrip(b"\r")
    i = stripped.rfind(b"\r")
    return segment[i + 1 :] if i >= 0 else segment


def cut_utf8(data: bytes, limit: int) -> bytes:
    """``data[:limit]``, backed off so that a multi-byte UTF-8 character is not split in two."""
    if len(data) <= limit:
        return data
    end = limit
    # step back over at most 3 continuation bytes (10xxxxxx) to the start of the cut character
    while end > 0 and limit - end < 3 and (data[end] & 0xC0) == 0x80:
        end -= 1
    if (data[end] & 0xC0) == 0x80:  # not UTF-8 anyway: a plain byte cut
        end = limit
    return data[:end]


CUT_MARK = " [cut]"


def cut_text(text: str, limit: int) -> str:
    """``text`` cut to at most ``limit`` bytes of UTF-8 (on a character boundary) and marked `` [cut]``."""
    data = text.encode("utf-8", "surrogatepass")
    if len(data) <= limit:
        return text
    return cut_utf8(data, limit).decode("utf-8", "ignore") + CUT_MARK


def fit_tails(tails: Sequence[Sequence[str]], budget: int) -> list[list[str]]:
    """Keep the newest lines of each tail so that all of them together take at most ``budget`` bytes.

    Pure. The budget is shared fairly: a tail that needs less than its share leaves the rest to the
    others. A tail that lost lines starts with a line saying how many were cut, so the cut is visible.
    """
    sizes = [[len(t.encode("utf-8", "surrogatepass")) + 4 for t in tail] for tail in tails]
    need = [sum(s) for s in sizes]
    if sum(need) <= budget:
        return [list(t) for t in tails]
    share = [0] * len(tails)
    left, open_ = max(0, budget), sorted(range(len(tails)), key=lambda i: need[i])
    while open_:
        each = left // len(open_)
        i = open_[0]
        if need[i] <= each:
            share[i] = need[i]
            left -= need[i]
            open_.pop(0)
        else:
            for j in open_:
                share[j] = each
            break
    out: list[list[str]] = []
    for tail, size, room in zip(tails, sizes, share, strict=True):
        if sum(size) <= room:
            out.append(list(tail))
            continue
        room -= 80  # the line that says what was cut
        kept = 0
        used = 0
        for s in reversed(size):
            if used + s > room:
                break
            used += s
            kept += 1
        cut = len(tail) - kept
        out.append(
            [f"[cut: {cut} earlier lines left out to fit Kafka's message limit]"] + list(tail[len(tail) - kept :])
        )
    return out


class LineSplitter:
    """Turns chunks of a byte stream into complete lines.

    Guarantees: every byte of input ends up in exactly one line or in the pending
    buffer; lines never hold ``\\n``; a line longer than ``max_line`` bytes is cut
    to at most ``max_line`` bytes (never inside a UTF-8 character) and flagged,
    and the rest of it is dropped without being buffered, so memory stays bounded
    by ``max_line`` whatever the input; carriage-return rewrites (progress bars)
    collapse to the final text, and a CRLF ending counts as LF. Pure: no I/O.
    """

    __slots__ = ("max_line", "_buf", "_overflow")

    def __init__(self, max_line: int = DEFAULT_MAX_LINE) -> None:
        if max_line < 16:
            raise ValueError("max_line must be at least 16 bytes")
        self.max_line = max_line
        self._buf = b""
        self._overflow = False  # the pending line was already cut; drop bytes until \n

    @property
    def pending(self) -> int:
        """Bytes held for an unfinished line."""
        return len(self._buf)

    def feed(self, chunk: bytes) -> tuple[list[bytes], list[bool] | None]:
        """Split one chunk; return the completed lines and their truncated flags (None: none cut)."""
        if not chunk:
            return [], None
        parts = chunk.split(b"\n")
        tail = parts.pop()
        max_line = self.max_line
        truncated: list[bool] | None = None
        if parts:
            first_cut = self._overflow
            if self._buf:
                parts[0] = self._buf + parts[0] if not first_cut else self._buf
            elif first_cut:
                parts[0] = b""
            self._buf = b""
            self._overflow = False
            if b"\r" in chunk or (parts[0] and b"\r" in parts[0]):
                parts = [_collapse_cr(p).rstrip(b"\r") if b"\r" in p else p for p in parts]
            if first_cut or max(map(len, parts)) > max_line:
                truncated = [False] * len(parts)
                truncated[0] = first_cut
                for i, p in enumerate(parts):
                    if len(p) > max_line:
                        parts[i] = cut_utf8(p, max_line)
                        truncated[i] = True
        # the unfinished rest
        if self._overflow:
            return parts, truncated
        buf = self._buf + tail if self._buf else tail
        if b"\r" in tail:
            buf = _collapse_cr(buf)
        if len(buf) > max_line:
            buf = cut_utf8(buf, max_line)
            self._overflow = True
        self._buf = buf
        return parts, truncated

    def finish(self) -> tuple[list[bytes], list[bool] | None]:
        """End of stream: the unfinished last line, if any (a stream not ending in a newline)."""
        if not self._buf and not self._overflow:
            return [], None
        line = self._buf.rstrip(b"\r") if b"\r" in self._buf else self._buf
        cut = self._overflow
        self._buf = b""
        self._overflow = False
        return [line], ([True] if cut else None)


def decode_lines(lines: Sequence[bytes]) -> tuple[list[str], list[bool] | None]:
    """Decode lines as UTF-8; undecodable bytes become visible ``\\xNN`` escapes and are flagged.

    Returns the texts and the invalid flags (None when every line was valid UTF-8).
    """
    if not lines:
        return [], None
    try:
        joined = b"\n".join(lines).decode("utf-8")
    except UnicodeDecodeError:
        pass
    else:
        return joined.split("\n"), None
    texts: list[str] = []
    invalid: list[bool] = []
    for line in lines:
        try:
            texts.append(line.decode("utf-8"))
            invalid.append(False)
        except UnicodeDecodeError:
            texts.append(line.decode("utf-8", "backslashreplace"))
            invalid.append(True)
    return texts, invalid


@dataclass
class Tail:
    """The last ``limit`` lines of one source, for the process-exit event.

    Guarantees: at most ``limit`` lines; each kept line is at most ``line_bytes``
    bytes of UTF-8 (longer ones are cut on a character boundary and end in `` [cut]``)
    so one exit message stays small.
    """

    limit: int = 100
    line_bytes: int = 4096
    lines: deque[str] = field(default_factory=deque)

    def __post_init__(self) -> None:
        self.lines = deque(maxlen=max(0, self.limit))

    def extend(self, texts: Iterable[str]) -> None:
        """Add lines (only the last ``limit`` of a big batch are looked at)."""
        if not isinstance(texts, (list, tuple)):
            texts = list(texts)
        if self.limit <= 0:
            return
        fast = self.line_bytes // 4  # a str this long is at most line_bytes bytes of UTF-8
        for t in texts[-self.limit :]:
            if len(t) > fast:
                t = cut_text(t, self.line_bytes)
            self.lines.append(t)

    def snapshot(self) -> list[str]:
        """The kept lines, oldest first."""
        return list(self.lines)
