"""The fold gives the same Delta whether a large LogBatch comes through the columnar decoder or the codec."""

from __future__ import annotations

import uuid
from typing import Any

import flightrec.db.fold as fold_module
import pytest
from flightrec.db.fold import Delta, RawMessage, fold
from flightrec.schemas import TOPIC_LOGS, Lifecycle, LogBatch, default_codec, encode
from flightrec.schemas.logcolumns import LogColumns

TS = 1_760_000_000_000_000


def batch(instance: str, seq: int, n: int, *, line_ts: int = TS, late: bool = False) -> LogBatch:
    return LogBatch(
        event_id=str(uuid.uuid4()),
        instance_id=instance,
        boot_id="boot-1",
        seq=seq,
        ts_us=TS + seq,
        stage="benchmark",
        source="stdout" if seq % 2 else "/var/log/d.log",
        pid=40 + seq,
        line_no=list(range(seq * 1000 + 1, seq * 1000 + n + 1)),
        line_ts_us=[line_ts + i for i in range(n)],
        text=[f"{instance} line {i} of seq {seq}: proof done é" for i in range(n)],
        truncated=[i % 3 == 0 for i in range(n)],
        invalid_utf8=[i % 7 == 0 for i in range(n)],
        late=[i % 2 == 0 for i in range(n)] if late else [],
    )


def messages() -> list[RawMessage]:
    events = [
        batch("a", 0, 400),
        batch("a", 1, 3),  # small: the codec either way
        batch("b", 0, 500, late=True),
        batch("b", 1, 2, late=True),
        batch("a", 2, 600),
        batch("c", 0, 300, line_ts=-5),  # a line time outside the sane window: a dead letter
        Lifecycle(
            event_id=str(uuid.uuid4()), instance_id="a", boot_id="boot-1", seq=3, ts_us=TS, stage="s", state="started"
        ),
        batch("a", 4, 700),
    ]
    msgs = [RawMessage(e.topic, 0, i, e.instance_id.encode(), encode(e)) for i, e in enumerate(events)]
    n = len(msgs)
    big = msgs[0].value
    assert big is not None
    msgs.append(RawMessage(TOPIC_LOGS, 0, n, b"a", big))  # Kafka holds the record twice: a duplicate
    msgs.append(RawMessage(TOPIC_LOGS, 0, n + 1, b"d", big[:-40]))  # cut short: a decode dead letter
    lengths = {**batch("d", 0, 300).to_record(), "truncated": [False] * 299}  # arrays of different lengths
    msgs.append(RawMessage(TOPIC_LOGS, 0, n + 2, b"d", default_codec().encode_record(LogBatch.name, lengths)))
    return msgs


def both_ways(monkeypatch: pytest.MonkeyPatch) -> tuple[Delta, Delta, list[int]]:
    msgs = messages()
    taken: list[int] = []

    class Counting(LogColumns):
        def __call__(self, data: bytes) -> dict[str, Any] | None:
            rec = super().__call__(data)
            taken.append(rec is not None)
            return rec

    counting = Counting()
    monkeypatch.setattr(fold_module, "_log_columns", lambda: counting)
    fast = fold(msgs)
    monkeypatch.setattr(fold_module, "_log_columns", lambda: LogColumns(min_bytes=1 << 40))
    slow = fold(msgs)
    return fast, slow, taken


def test_the_columnar_path_folds_to_the_codec_s_delta(monkeypatch: pytest.MonkeyPatch) -> None:
    fast, slow, taken = both_ways(monkeypatch)
    assert sum(taken) == 7  # five large batches, the duplicate, the one of different lengths; not the cut one
    for table in ("events", "lifecycle", "logs", "dead"):
        assert getattr(fast, table).equals(getattr(slow, table)), table
    assert (fast.messages, fast.duplicates, fast.offsets) == (slow.messages, slow.duplicates, slow.offsets)
    assert fast.logs.num_rows == 400 + 3 + 500 + 2 + 600 + 700
    reasons = sorted(r.split(":")[0] for r in fast.dead.column("reason").to_pylist())
    assert reasons == ["decode", "fold", "fold"] and fast.duplicates == 1
    late = fast.logs.filter(fast.logs.column("instance_id").to_numpy(zero_copy_only=False) == "a")
    assert not any(late.column("late").to_pylist())  # batches without late flags: none is late
