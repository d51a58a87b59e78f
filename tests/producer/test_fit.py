"""Messages fit Kafka's limit: tails cut by bytes, exit events share a budget, batches sized in bytes, refused
records split or marked."""

from __future__ import annotations

import uuid
from pathlib import Path

from flightrec.producer import open_agent
from flightrec.producer.batcher import BATCH_MAX_BYTES, SourceBatcher
from flightrec.producer.fit import fit_exit, marker_for, message_size, split_log_batch
from flightrec.producer.lines import Tail, cut_text, fit_tails
from flightrec.producer.spool import Position, Record
from flightrec.schemas import Dropped, FileTail, LogBatch, ProcessExit, decode, encode

from flightrec.settings import STOCK_MAX_MESSAGE_BYTES, Settings


def test_tail_lines_are_cut_by_bytes_on_a_character_boundary() -> None:
    t = Tail(limit=3, line_bytes=4096)
    t.extend(["\u2588" * 4096, "\U0001f600" * 4096, "short"])
    cut = t.snapshot()
    for line in cut[:2]:
        assert line.endswith(" [cut]")
        body = line[: -len(" [cut]")].encode()
        assert len(body) <= 4096 and body.decode()  # whole characters only
    assert cut[2] == "short"
    assert cut_text("abc", 10) == "abc"


def test_fit_tails_shares_the_budget_and_says_what_was_cut() -> None:
    big = ["\u2588" * 1365] * 100  # ~4 KB lines
    small = ["ok"] * 3
    out = fit_tails([big, small, big], 200_000)
    assert out[1] == small, "a tail that fits its share is kept whole"
    total = sum(len(line.encode()) + 4 for tail in out for line in tail)
    assert total <= 200_000
    for tail in (out[0], out[2]):
        assert tail[0].startswith("[cut: ") and tail[-1] == big[-1]
    assert fit_tails([small], 1000) == [small]


def test_a_huge_exit_event_fits_the_stock_limit() -> None:
    line = "\U0001f600" * 1024  # 4 KB
    fields = dict(
        stage="s",
        argv=["x" * 100_000] * 300,
        started_us=1,
        ended_us=2,
        duration_s=1.0,
        stdout_tail=[line] * 100,
        stderr_tail=[line] * 100,
        file_tails=[FileTail(f"/f{i}", [line] * 100) for i in range(4)],
    )
    fitted = fit_exit(fields, STOCK_MAX_MESSAGE_BYTES)
    ev = ProcessExit(event_id=str(uuid.uuid4()), instance_id="i", boot_id="b", seq=1, ts_us=1, **fitted)
    assert message_size(b"i", encode(ev)) <= STOCK_MAX_MESSAGE_BYTES
    assert ev.argv[-1] == "[cut: 285 more arguments]" and ev.argv[0].endswith(" [cut]")
    assert ev.stdout_tail[0].startswith("[cut: ") and ev.file_tails[3].lines[-1] == line


def test_a_big_chunk_is_batched_by_bytes_before_it_is_added(tmp_path: Path) -> None:
    # a 1 MiB read of 60 KB lines used to join the pending batch whole: one 1 MiB LogBatch
    settings = Settings.from_env({})
    with open_agent("fit-1", settings, spool_dir=str(tmp_path), deliver=False) as agent:
        b = SourceBatcher(agent.line_sink(), "s", "stdout", 1, max_line=65536, tail_lines=10)
        b.feed((b"y" * 60_000 + b"\n") * 17)
        b.close()
        recs, _ = agent.spool.read(Position(0, 0), agent.spool.committed_end(), max_bytes=1 << 40)
    batches = [decode(r.value) for r in recs]
    assert sum(len(x) for x in batches) == 17
    assert all(len(r.value) <= BATCH_MAX_BYTES + 65536 for r in recs), [len(r.value) for r in recs]
    assert [n for x in batches for n in x.line_no] == list(range(1, 18))


def _record(ev, topic: str) -> Record:
    return Record(ev.seq, 0, topic, ev.instance_id.encode(), encode(ev), Position(1, 100))


def test_a_refused_log_batch_is_split_into_parts_that_fit_with_the_same_seq() -> None:
    n = 40
    ev = LogBatch(
        event_id=str(uuid.uuid4()),
        instance_id="i",
        boot_id="b",
        seq=7,
        ts_us=1,
        stage="s",
        source="stdout",
        line_no=range(1, n + 1),
        line_ts_us=[1] * n,
        text=["z" * 500] * n,
        truncated=[False] * n,
        invalid_utf8=[False] * n,
        late=[i >= n // 2 for i in range(n)],
    )
    value = encode(ev)
    parts = split_log_batch(value, b"i", 4096)
    assert parts is not None and len(parts) > 1
    decoded = [decode(p) for p in parts]
    assert all(message_size(b"i", p) <= 4096 for p in parts)
    assert {d.seq for d in decoded} == {7}
    assert all(d.event_id.startswith(f"{ev.event_id}/part-") for d in decoded), "parts name their original event"
    assert [x for d in decoded for x in d.line_no] == list(range(1, n + 1))
    assert [x for d in decoded for x in d.late] == list(ev.late), "the parts keep each line's late flag"
    assert split_log_batch(value, b"i", 4096) == parts, "deterministic: a resend makes the same event ids"
    one = LogBatch(
        event_id="e",
        instance_id="i",
        boot_id="b",
        seq=1,
        ts_us=1,
        stage="s",
        source="stdout",
        line_no=[1],
        line_ts_us=[1],
        text=["z" * 9000],
        truncated=[False],
        invalid_utf8=[False],
    )
    assert split_log_batch(encode(one), b"i", 4096) is None, "one line alone cannot be split"


def test_a_marker_keeps_the_seq_and_says_what_was_lost() -> None:
    ev = ProcessExit(
        event_id="orig",
        instance_id="i",
        boot_id="b",
        seq=9,
        ts_us=5,
        stage="bench",
        argv=["x"],
        started_us=1,
        ended_us=2,
        duration_s=1.0,
    )
    rec = _record(ev, ev.topic)
    m = decode(marker_for(rec, "MessageSizeTooLargeError"))
    assert isinstance(m, Dropped)
    assert (m.instance_id, m.boot_id, m.seq, m.stage) == ("i", "b", 9, "bench")
    assert (m.original_event_id, m.original_type, m.original_bytes) == ("orig", ProcessExit.name, len(rec.value))
    assert decode(marker_for(rec, "again")).event_id == m.event_id, "the same marker after a crash"
