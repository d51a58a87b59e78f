"""Lines of one source become LogBatch events: batched to the topic's limit, masked, numbered, spooled once."""

from __future__ import annotations

import threading
import time
from bisect import bisect_right
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from itertools import accumulate
from typing import Protocol

from flightrec.producer.lines import LineSplitter, Tail, decode_lines
from flightrec.producer.redact import NO_CARRY, Carry, Redactor
from flightrec.producer.scrub import scrub
from flightrec.schemas import Event, EventT, LogBatch, new_event_id, now_us
from flightrec.schemas.fastlog import encode_fast

BATCH_WINDOW_S = 0.1  # a line is spooled (and handed to the sender) at most this long after it was read
# a LogBatch holds at most this much text (plus LINE_OVERHEAD per line), less where the topic's message
# limit is smaller (BATCH_SLACK under it): few, big messages are what makes the pipeline fast
BATCH_MAX_BYTES = 1024 * 1024 - 64 * 1024
BATCH_SLACK = 64 * 1024  # room under the topic's limit for the batch's other fields and Kafka's framing
# and at most this many lines (a burst of empty lines costs LINE_OVERHEAD each, never a message over the limit)
BATCH_MAX_LINES = 65536
LINE_OVERHEAD = 16  # bytes a line costs in a LogBatch besides its text (number, time, flags, length)


class Emit(Protocol):
    """Spool events already scrubbed (the agent's ``emit_makers``): the batches' way into the spool."""

    def __call__(
        self,
        makers: Sequence[Callable[[str, int], EventT]],
        *,
        encode: Callable[[Event], bytes] | None,
        sync: bool,
        scrubbed: bool,
        boot: str | None,
    ) -> list[EventT]: ...


@dataclass(frozen=True)
class LineSink:
    """What a line source needs of the agent (``agent.line_sink()``), and nothing more: the instance its lines are
    of, the redactor that masks them, the emit that spools their batches, the spool's group commit (``sync_due``,
    ``sync``) and the logs topic's message limit."""

    instance_id: str
    redactor: Redactor
    emit: Emit
    sync_due: Callable[[], None]
    sync: Callable[[], None]
    logs_limit: Callable[[], int]


def batch_bytes(limit: int) -> int:
    """The most text (plus LINE_OVERHEAD per line) one LogBatch holds for a topic whose message limit is ``limit``."""
    return max(16 * 1024, min(BATCH_MAX_BYTES, limit - BATCH_SLACK))


class SourceBatcher:
    """Lines of one source (stdout, stderr, a followed file) become LogBatch events.

    Guarantees: every line fed is spooled exactly once, in order, with a 1-based
    line number gap-free within the source; a line waits at most ``window`` s
    (given :meth:`tick` is called) before its batch is spooled, and is fdatasync'd
    within the spool's group-commit window (at the latest when the source closes); a
    batch fits the topic's message limit; secrets are masked
    before anything is kept, each line knowing the one before it (a secret split across two
    lines, a private key's body: :class:`Carry`, handed on with the source); the last
    ``tail_lines`` lines are kept for the exit event.
    """

    def __init__(
        self,
        sink: LineSink,
        stage: str,
        source: str,
        pid: int,
        *,
        max_line: int,
        tail_lines: int,
        window: float = BATCH_WINDOW_S,
        max_bytes: int | None = None,
        boot: str | None = None,
    ) -> None:
        self.sink = sink
        self.boot = boot  # the boot its lines belong to (late output: never a boot begun after a seal)
        self.stage = stage
        self.source = source
        self.pid = pid
        self.window = window
        self.max_bytes = max_bytes or batch_bytes(sink.logs_limit())
        self.splitter = LineSplitter(max_line)
        self.tail = Tail(tail_lines)
        self.lines_read = 0
        self.batches = 0
        self._next_no = 1
        self._texts: list[str] | None = None  # None: every pending line is plain ASCII, its text is its bytes
        self._raw: list[bytes] = []  # each text's UTF-8
        self._ts: list[int] = []
        self._trunc: list[bool] = []
        self._invalid: list[bool] = []
        self._late: list[bool] = []
        self._carry: Carry = NO_CARRY  # what masking the next line needs from the lines before it
        self.late = False  # lines added from now on were written after CMD exited
        self._bytes = 0
        self._since: float | None = None
        self._lock = threading.Lock()
        # stage and source scrubbed once here, lines as they are added: the batches need no scrub of their own
        clean = scrub(
            LogBatch(
                event_id="",
                instance_id="",
                boot_id="",
                seq=0,
                ts_us=0,
                stage=stage,
                source=source,
                pid=pid,
                line_no=(),
                line_ts_us=(),
                text=[],
                truncated=(),
                invalid_utf8=(),
                late=(),
            ),
            sink.redactor,
        )
        self._stage, self._source = clean.stage, clean.source

    def _add(self, lines: list[bytes], trunc: list[bool] | None, ts: int, plain: bool = False) -> None:
        """Add lines to the pending batch. ``plain``: they are ASCII and hold nothing to mask, so they are
        kept as the bytes read (decoded only for the exit tail): no Python string per line."""
        if not lines:
            return
        n, have = len(lines), len(self._raw)
        invalid = None
        if plain and trunc is None:
            if self._texts is not None:
                self._texts.extend(AsciiTexts(lines))
            self._raw.extend(lines)
            if self.tail.limit > 0:
                self.tail.extend(AsciiTexts(lines[-self.tail.limit :]))
            self._carry = self.sink.redactor.carry_after(lines[-1])
        else:
            decoded, invalid = decode_lines(lines)
            texts, self._carry = self.sink.redactor.stream(decoded, trunc, self._carry)
            if self._texts is None:
                self._texts = list(AsciiTexts(self._raw))
            self._texts.extend(texts)
            # the UTF-8 of each text for the encoder: the bytes read, unless decoding or masking changed a line
            self._raw.extend(lines if invalid is None and texts is decoded else [t.encode("utf-8") for t in texts])
            self.tail.extend(texts)
        self._ts.extend([ts] * n)
        _flags(self._trunc, have, trunc, n)
        _flags(self._invalid, have, invalid, n)
        _flags(self._late, have, [True] * n if self.late else None, n)
        self.lines_read += n
        if self._since is None:
            self._since = time.monotonic()

    def feed(self, data: bytes, ts: int | None = None) -> None:
        """Bytes read from the source: lines join the pending batch, which is spooled before it would grow
        over ``max_bytes`` (text plus LINE_OVERHEAD per line) or BATCH_MAX_LINES lines."""
        with self._lock:
            pending = self.splitter._buf
            plain = data.isascii() and pending.isascii() and not self.sink.redactor.may_need(pending, data, self._carry)
            lines, trunc = self.splitter.feed(data)
            ts = ts or now_us()
            cum = list(accumulate(map(len, lines)))  # C speed: no Python code per line

            def size(i: int) -> int:  # what lines[0..i] cost in a batch: text plus LINE_OVERHEAD each
                return cum[i] + LINE_OVERHEAD * (i + 1)

            start, n = 0, len(lines)
            every = range(n)
            while start < n:
                base = size(start - 1) if start else 0
                room_lines = BATCH_MAX_LINES - len(self._raw)
                end = min(
                    n, start + room_lines, bisect_right(every, base + self.max_bytes - self._bytes, lo=start, key=size)
                )
                if end == start:
                    if self._raw:  # the pending batch is full: spool it, then go on
                        self._flush()
                        continue
                    end = start + 1  # one line alone always makes a batch (lines are cut to max_line)
                self._add(lines[start:end], trunc[start:end] if trunc else None, ts, plain)
                self._bytes += size(end - 1) - base
                start = end
                if start < n:
                    self._flush()
            if self._bytes >= self.max_bytes or (
                self._since is not None and time.monotonic() - self._since >= self.window
            ):
                self._flush()

    def end_of_file(self) -> None:
        """The source's file ended or was replaced: its unfinished last line is a line."""
        with self._lock:
            lines, trunc = self.splitter.finish()
            self._add(lines, trunc, now_us())

    def time_left(self) -> float | None:
        """Seconds until the pending batch is due (None: nothing pending)."""
        since = self._since
        return None if since is None else max(0.0, self.window - (time.monotonic() - since))

    def tick(self) -> None:
        """Spool the pending batch if it is due; fdatasync the spooled ones once the window passed."""
        with self._lock:
            if self._since is not None and time.monotonic() - self._since >= self.window:
                self._flush()
        self.sink.sync_due()

    def close(self) -> None:
        """End of the source: spool everything left, durably."""
        self.end_of_file()
        with self._lock:
            self._flush()
        self.sink.sync()

    def resume(self, next_no: int, pending: bytes, overflow: bool, carry: Carry = NO_CARRY, *, late: bool) -> None:
        """Go on from another batcher's :meth:`handoff_state` (in the late-output process)."""
        self._next_no = next_no
        self.splitter._buf, self.splitter._overflow = pending, overflow
        self._carry = carry
        self.late = late

    def handoff_state(self) -> tuple[int, bytes, bool, Carry]:
        """Spool every complete line; return (next line number, unfinished line, its overflow flag, the carry)."""
        with self._lock:
            self._flush()
            return self._next_no, self.splitter._buf, self.splitter._overflow, self._carry

    def _flush(self) -> None:
        self._bytes = 0
        self._since = None
        if not self._raw:
            return
        raw, ts, n = self._raw, self._ts, len(self._raw)
        texts = self._texts if self._texts is not None else AsciiTexts(raw)
        trunc, invalid = self._trunc or (False,) * n, self._invalid or (False,) * n  # no flag set: no list kept
        late = self._late or ()
        self._texts, self._raw, self._ts, self._trunc, self._invalid, self._late = None, [], [], [], [], []
        first = self._next_no
        self._next_no += len(texts)
        eid, iid, stage, source, pid, now = (
            new_event_id(),
            self.sink.instance_id,
            self._stage,
            self._source,
            self.pid,
            now_us(),
        )

        def make(boot: str, seq: int) -> Event:
            return LogBatch(
                event_id=eid,
                instance_id=iid,
                boot_id=boot,
                seq=seq,
                ts_us=now,
                stage=stage,
                source=source,
                pid=pid,
                line_no=range(first, first + len(texts)),
                line_ts_us=ts,
                text=texts,
                truncated=trunc,
                invalid_utf8=invalid,
                late=late,
            )

        self.sink.emit(
            [make], encode=lambda ev: encode_fast(ev, raw), sync=False, scrubbed=True, boot=self.boot
        )  # group commit (see Spool)
        self.batches += 1


class AsciiTexts(Sequence[str]):
    """The texts of lines that are plain ASCII, decoded only where looked at (the encoder takes the bytes)."""

    __slots__ = ("_raw",)

    def __init__(self, raw: Sequence[bytes]) -> None:
        self._raw = raw

    def __len__(self) -> int:
        return len(self._raw)

    def __getitem__(self, i):  # an int or a slice, as list's own (left untyped: list's overloads)
        if isinstance(i, slice):
            return [r.decode("ascii") for r in self._raw[i]]
        return self._raw[i].decode("ascii")

    def __iter__(self) -> Iterator[str]:
        return (r.decode("ascii") for r in self._raw)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sequence) and list(self) == list(other)

    def __repr__(self) -> str:
        return f"AsciiTexts({list(self)!r})"


def _flags(flags: list[bool], have: int, values: Sequence[bool] | None, n: int) -> None:
    """Add ``n`` lines' flags to ``flags``, kept empty (all False) until one is set: no list per batch."""
    if values is not None and any(values):
        flags.extend([False] * (have - len(flags)))
        flags.extend(values)
    elif flags:
        flags.extend([False] * n)
