"""How many message bytes one transaction holds: the store's default (a lake's larger), or Options.batch_bytes."""

from __future__ import annotations

from types import SimpleNamespace

from flightrec.consumers.group import GroupMaterializer
from flightrec.consumers.materializer import Materializer, Pending
from flightrec.consumers.options import Options
from flightrec.schemas import encode
from materializer_helpers import Boot

from flightrec.settings import TOPIC_LIFECYCLE, TOPIC_LOGS

LAKE = "ducklake:postgres:dbname=flightrec host=127.0.0.1 port=5432 user=flightrec"


def _record(size: int) -> SimpleNamespace:
    return SimpleNamespace(topic=TOPIC_LIFECYCLE, value=b"x" * size)


def test_a_batch_is_full_at_its_byte_limit() -> None:
    pending = Pending(Options(db="x.duckdb", commit_interval=60.0), max_bytes=1000, max_lines=10)
    pending.add([_record(400), _record(599)], now=0.0)
    assert not pending.full(1.0)
    pending.add([_record(1)], now=1.0)
    assert pending.full(1.0)
    assert len(pending.take()) == 3 and pending.bytes == 0


def test_a_file_commits_16_mib_and_a_lake_48_mib_unless_told(tmp_path) -> None:
    file = Materializer({}, Options(db=str(tmp_path / "x.duckdb")))
    lake = GroupMaterializer({}, Options(db=LAKE, data_path=str(tmp_path / "lake")))
    assert (file.batch_bytes, lake.batch_bytes) == (16 << 20, 48 << 20)
    assert file._pending.max_bytes == 16 << 20 and lake._pending.max_bytes == 48 << 20
    told = GroupMaterializer({}, Options(db=LAKE, data_path=str(tmp_path / "lake"), batch_bytes=1 << 20))
    assert told.batch_bytes == told._pending.max_bytes == 1 << 20


def test_a_quiet_read_commits_a_partial_batch_on_a_file_and_a_large_one_on_a_lake(tmp_path) -> None:
    file = Materializer({}, Options(db=str(tmp_path / "x.duckdb"), commit_interval=60.0))
    lake = GroupMaterializer({}, Options(db=LAKE, data_path=str(tmp_path / "lake"), commit_interval=60.0))
    small, backlog = [_record(100)], [_record(1 << 20) for _ in range(4)]
    for m, expect_small in ((file, True), (lake, False)):
        p = Pending(m.opts, m.batch_bytes, m.default_batch_lines)
        p.add(small, now=0.0)
        assert p.due(1.0, quiet=True, quiet_bytes=m.quiet_commit_bytes) is expect_small
        assert not p.due(1.0, quiet=False, quiet_bytes=m.quiet_commit_bytes)  # more is coming: the window waits
        assert p.due(61.0, quiet=False, quiet_bytes=m.quiet_commit_bytes)  # the window is over
        p.add(backlog, now=1.0)
        assert p.due(1.0, quiet=True, quiet_bytes=m.quiet_commit_bytes)  # what a backlog left: no wait for the window


def test_a_batch_of_short_lines_is_full_at_its_line_limit_long_before_its_byte_limit(tmp_path) -> None:
    """Empty lines take a few bytes each in a message and ~125 once folded: the line limit bounds the fold's memory."""
    boot = Boot()
    for k in range(4):
        boot.lines("supervisor", "stdout", [""] * 20_000, first_line=k * 20_000 + 1)
    values = [encode(e) for e in boot.events]
    records = [SimpleNamespace(topic=TOPIC_LOGS, value=v) for v in values]
    file = Materializer({}, Options(db=str(tmp_path / "x.duckdb"), commit_interval=60.0))
    p = Pending(file.opts, file.batch_bytes, max_lines=60_000)
    p.add(records[:2], now=0.0)
    assert (p.lines, p.full(0.0)) == (40_000, False)
    p.add(records[2:3], now=0.0)
    assert p.lines == 60_000 and p.full(0.0) and p.bytes < file.batch_bytes // 10
    garbage = b"\x00" * 1000  # not a LogBatch: counted as the most lines its size could hold
    p.add([SimpleNamespace(topic=TOPIC_LOGS, value=garbage)], now=0.0)
    assert p.lines == 60_000 + (1000 - 10) // 5
    p.take()
    assert (p.lines, p.bytes) == (0, 0)
    assert file.default_batch_lines == 500_000
    assert GroupMaterializer({}, Options(db=LAKE, data_path=str(tmp_path / "lake"))).default_batch_lines == 1_500_000
