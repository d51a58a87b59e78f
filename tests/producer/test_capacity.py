"""The agent's hot path: batches as big as the topic allows, and one fdatasync per window of log batches."""

from __future__ import annotations

import itertools
import time
from pathlib import Path

from flightrec.producer import open_agent
from flightrec.producer.batcher import SourceBatcher
from flightrec.producer.fit import message_size
from flightrec.producer.spool import SYNC_WINDOW_S, Position, Spool
from flightrec.schemas import Lifecycle, LogBatch, decode, new_event_id, now_us
from hypothesis import example, given
from hypothesis import settings as hyp_settings
from hypothesis import strategies as st

from flightrec.settings import TOPIC_LOGS, Settings

LINE = b"0000000 worker 3: batch done msm=ok ntt=ok elapsed_ms=12.5\n"


def log_batch(instance: str, n: int = 100):
    eid, ts = new_event_id(), now_us()

    def make(boot: str, seq: int) -> LogBatch:
        return LogBatch(
            event_id=eid,
            instance_id=instance,
            boot_id=boot,
            seq=seq,
            ts_us=ts,
            stage="s",
            source="stdout",
            pid=1,
            line_no=range(1, n + 1),
            line_ts_us=[ts] * n,
            text=["x" * 60] * n,
            truncated=[False] * n,
            invalid_utf8=[False] * n,
            late=(),
        )

    return make


def lifecycle(instance: str):
    eid = new_event_id()

    def make(boot: str, seq: int) -> Lifecycle:
        return Lifecycle(
            event_id=eid, instance_id=instance, boot_id=boot, seq=seq, ts_us=now_us(), stage="s", state="info"
        )

    return make


def test_a_1_mib_read_makes_batches_as_big_as_the_topic_allows(tmp_path: Path) -> None:
    # 256 KiB / 16384-line batches made five LogBatches (five spool writes) of one 1 MiB pipe read
    with open_agent("cap-1", Settings.from_env({}), spool_dir=str(tmp_path), deliver=False) as agent:
        limit = agent.message_limit(TOPIC_LOGS)
        b = SourceBatcher(agent.line_sink(), "s", "stdout", 1, max_line=65536, tail_lines=10)
        chunk = LINE * ((1 << 20) // len(LINE))
        b.feed(chunk)
        b.close()
        recs, _ = agent.spool.read(Position(0, 0), agent.spool.committed_end(), max_bytes=1 << 40)
    batches = [decode(r.value) for r in recs]
    assert sum(len(x) for x in batches) == chunk.count(b"\n")
    assert len(recs) <= 2, [len(r.value) for r in recs]
    assert all(message_size(r.key, r.value) <= limit for r in recs), [len(r.value) for r in recs]
    assert [n for x in batches for n in x.line_no] == list(range(1, chunk.count(b"\n") + 1))


def test_log_batches_share_one_fdatasync_per_window(tmp_path: Path) -> None:
    sp = Spool(tmp_path, "cap-2")
    sp.append([lifecycle("cap-2")])
    base = sp.syncs
    t0 = time.monotonic()
    for _ in range(30):
        sp.append([log_batch("cap-2")], sync=False)
    windows = (time.monotonic() - t0) / SYNC_WINDOW_S
    assert sp.syncs - base <= 1 + windows, "a log batch is fdatasync'd at most once per window"
    # written at once: another process (another Spool) reads them before any fdatasync
    other = Spool(tmp_path, "cap-2")
    recs, _ = other.read(Position(0, 0), other.committed_end(), max_bytes=1 << 40)
    assert len(recs) == 31
    other.close()
    # every other event is fdatasync'd before append returns, and with it the lines before it
    before = sp.syncs
    sp.append([lifecycle("cap-2")])
    assert sp.syncs >= before + 1 and not sp.dirty
    sp.close()


def test_unsynced_lines_are_made_durable_within_the_window(tmp_path: Path) -> None:
    sp = Spool(tmp_path, "cap-3")
    sp.append([log_batch("cap-3")], sync=False)
    assert sp.dirty
    sp.sync_due()  # not due yet: nothing happens, or it was already due under load
    time.sleep(SYNC_WINDOW_S)
    sp.sync_due()
    assert not sp.dirty
    sp.append([log_batch("cap-3")], sync=False)
    assert sp.dirty
    sp.close()  # closing makes the rest durable
    assert not sp.dirty


def test_a_source_closing_makes_its_lines_durable(tmp_path: Path) -> None:
    with open_agent("cap-4", Settings.from_env({}), spool_dir=str(tmp_path), deliver=False) as agent:
        b = SourceBatcher(agent.line_sink(), "s", "stdout", 1, max_line=65536, tail_lines=10)
        b.feed(LINE * 10)
        b.tick()
        b.close()
        assert not agent.spool.dirty


def test_the_syncer_thread_ends_when_idle(tmp_path: Path) -> None:
    import os
    import threading

    from flightrec.producer.syncer import IDLE_S, Syncer

    s = Syncer("test")
    fd = os.open(tmp_path / "f", os.O_WRONLY | os.O_CREAT)
    os.write(fd, b"x")
    s.hand(fd)
    s.drain()
    assert s.syncs == 1
    deadline = time.monotonic() + IDLE_S + 10
    while any(t.name == "flightrec-spool-sync" for t in threading.enumerate()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(t.name == "flightrec-spool-sync" for t in threading.enumerate()), "an idle syncer thread stays"
    fd = os.open(tmp_path / "f", os.O_WRONLY)
    s.hand(fd)  # a new one starts for new work
    s.drain()
    assert s.syncs == 2


SECRET = "s3cr3t-Value-42"
PIECES = [
    b"plain text ",
    b"0000123 worker 3: batch done ",
    SECRET.encode(),
    SECRET[:6].encode(),
    SECRET[6:].encode(),
    SECRET[:2].encode(),
    SECRET[2:].encode(),
    b"\n",
    b"\n",
    b"caf\xc3\xa9 ",
    b"\xff",
    b"see http://user:pw@host/x ",
    b"x" * 300,
    b"\t",
    b"",
    b"token: 512 ",
    b"password=hunter2 ",
    b"AKIA" + b"IOSFODNN7EXAMPLE ",
    b"-----BEGIN RSA PRIVATE KEY-----",
    b"MIIEowIBAAKCAQEA",
    b"-----END RSA PRIVATE KEY-----",
]


@hyp_settings(max_examples=150, deadline=None)
@given(st.lists(st.sampled_from(PIECES), max_size=80), st.lists(st.integers(min_value=1, max_value=400), max_size=12))
@example([b"plain text ", SECRET[:2].encode(), b"\n", SECRET[2:].encode(), b"\n"], [14])  # a split, the 1st read plain
@example([b"-----BEGIN RSA PRIVATE KEY-----", b"\n", b"MIIEowIBAAKCAQEA", b"\n"], [32])  # a key's body in the next read
def test_ascii_chunks_take_the_fast_path_with_the_same_lines(pieces: list[bytes], cuts: list[int]) -> None:
    # ASCII reads with nothing to mask skip decoding and masking per line: each line, however the stream was
    # cut into reads (a secret across two reads or two lines, a key's body in the read after its header, a read
    # of only ASCII after one that was not), is what masking all the lines at once gives: decoded (\xNN where not
    # UTF-8), masked, numbered, in order
    import tempfile

    from flightrec.producer.lines import Tail, decode_lines

    data = b"".join(pieces)
    bounds = sorted({min(c, len(data)) for c in cuts} | {0, len(data)})
    with (
        tempfile.TemporaryDirectory() as tmp,
        open_agent(
            "fast-1",
            Settings.from_env({"FLIGHTREC_REDACT": "MY_SECRET"}),
            spool_dir=tmp,
            deliver=False,
            env={"MY_SECRET": SECRET},
        ) as agent,
    ):
        b = SourceBatcher(agent.line_sink(), "s", "stdout", 1, max_line=65536, tail_lines=5, max_bytes=64 * 1024)
        for lo, hi in itertools.pairwise(bounds):
            b.feed(data[lo:hi])
        b.close()
        recs, _ = agent.spool.read(Position(0, 0), agent.spool.committed_end(), max_bytes=1 << 40)
        redactor = agent.redactor
    batches = [decode(r.value) for r in recs]
    raw = data.split(b"\n")
    if raw[-1] == b"":
        raw.pop()
    want = redactor.lines([decode_lines([line])[0][0] for line in raw])
    got = [t for x in batches for t in x.text]
    assert got == want
    assert [n for x in batches for n in x.line_no] == list(range(1, len(want) + 1))
    assert [f for x in batches for f in x.invalid_utf8] == [decode_lines([line])[1] is not None for line in raw]
    tail = Tail(5)
    tail.extend(want)
    assert b.tail.snapshot() == tail.snapshot()


# a command that writes each line with a write of its own, ~20,000 lines a second (print(..., flush=True), stderr,
# Rust's and Go's stdout, PYTHONUNBUFFERED=1 as this machine sets it): the pump must not read it a line at a time
PER_LINE_WRITER = """
import os, sys, time
n, gap = int(sys.argv[1]), float(sys.argv[2])
t0 = time.perf_counter()
for i in range(n):
    while time.perf_counter() < t0 + i * gap:
        pass
    os.write(1, b"%07d worker 3: batch done msm=ok ntt=ok elapsed_ms=12.5\\n" % i)
print(time.perf_counter() - t0, file=sys.stderr)
"""


def test_a_command_writing_line_by_line_is_read_many_lines_at_a_time(tmp_path: Path) -> None:
    # measured before: ~10 us of the agent's CPU a line (a read, a scan, a split... per line) where a block writer
    # costs ~0.7 us; every read of a pipe was taken as soon as it held anything
    import os
    import subprocess
    import sys

    from flightrec.producer.pump import GATHER_S, Pump

    n = 5000
    writer = subprocess.Popen(
        [sys.executable, "-c", PER_LINE_WRITER, str(n), "50e-6"], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert writer.stdout is not None and writer.stderr is not None
    out_r, out_w = os.pipe()  # the pass-through, read back whole
    with open_agent("cap-7", Settings.from_env({}), spool_dir=str(tmp_path), deliver=False) as agent:
        b = SourceBatcher(agent.line_sink(), "s", "stdout", writer.pid, max_line=65536, tail_lines=10)
        pump = Pump(os.dup(writer.stdout.fileno()), out_w, b)
        writer.stdout.close()
        passed = []
        reader = __import__("threading").Thread(target=lambda: passed.append(_read_all(out_r)))
        reader.start()
        pump.start()
        assert writer.wait(30) == 0
        took = float(writer.stderr.read())  # ~0.25 s; longer on a loaded machine
        pump.join(30)
        assert not pump.is_alive() and pump.eof
        os.close(out_w)
        reader.join(30)
        recs, _ = agent.spool.read(Position(0, 0), agent.spool.committed_end(), max_bytes=1 << 40)
    want = b"".join(b"%07d worker 3: batch done msm=ok ntt=ok elapsed_ms=12.5\n" % i for i in range(n))
    assert passed == [want]  # byte for byte, nothing lost or reordered
    texts = [t for r in recs for t in decode(r.value).text]
    assert texts == want.decode().splitlines()
    # at most one read per GATHER_S while the lines come (+ the end); on a quiet machine, ~2,400 before
    most = max(n // 10, int(took / GATHER_S) + 10)
    assert pump.reads <= most, f"{pump.reads} reads for {n} lines written one at a time in {took:.2f}s"


def _read_all(fd: int) -> bytes:
    import os

    out = []
    while chunk := os.read(fd, 1 << 16):
        out.append(chunk)
    os.close(fd)
    return b"".join(out)


def test_a_daemon_writing_line_by_line_after_its_stage_is_read_many_lines_at_a_time(spool_env, tmp_path: Path) -> None:
    # the late-output process read a leftover's pipe a line at a time, as the pump did (a daemon started by a stage
    # logs for hours after it)
    import re
    import subprocess
    import sys

    from flightrec.producer.pump import GATHER_S

    n = 5000
    writer = tmp_path / "writer.py"
    writer.write_text("import time; time.sleep(1.0)\n" + PER_LINE_WRITER)  # after the stage, once handed off
    stage = f'"{sys.executable}" "{writer}" {n} 50e-6 & echo started; exit 0'
    out, err = tmp_path / "out", tmp_path / "err"
    with open(out, "wb") as o, open(err, "wb") as e:
        r = subprocess.run(
            spool_env.argv("run", "--stage", "s", "--", "sh", "-c", stage), env=spool_env.env(), stdout=o, stderr=e
        )
    assert r.returncode == 0
    deadline = time.monotonic() + 30
    reads = None
    while reads is None and time.monotonic() < deadline:
        time.sleep(0.2)
        for log in spool_env.spool.rglob("late.log*"):
            m = re.search(r"stage s \(boot \S+\): (\d+) bytes read in (\d+) reads", log.read_text(errors="replace"))
            if m:
                reads = int(m[2])
    want = b"".join(b"%07d worker 3: batch done msm=ok ntt=ok elapsed_ms=12.5\n" % i for i in range(n))
    assert out.read_bytes() == b"started\n" + want  # passed on byte for byte
    assert reads is not None, "the late-output process said nothing of the stage's end"
    took = float(err.read_text().split()[-1])
    most = max(n // 10, int(took / GATHER_S) + 10)
    assert reads <= most, f"{reads} reads for {n} lines written one at a time in {took:.2f}s"
    lines = [
        t for ev in spool_env.events() if ev.name == "flightrec.v1.LogBatch" and ev.source == "stdout" for t in ev.text
    ]
    assert lines == ["started"] + want.decode().splitlines()
