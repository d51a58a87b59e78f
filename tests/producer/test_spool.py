"""Unit tests of the durable spool: gap-free seq across processes, boots, torn records, cursor, rotation."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from flightrec.producer import spool as spool_mod
from flightrec.producer.spool import Position, Spool
from flightrec.schemas import Lifecycle, Sealed, decode, new_event_id, now_us

from flightrec.errors import SpoolError


def lifecycle(instance: str, detail: str = ""):
    eid = new_event_id()

    def make(boot: str, seq: int) -> Lifecycle:
        return Lifecycle(
            event_id=eid,
            instance_id=instance,
            boot_id=boot,
            seq=seq,
            ts_us=now_us(),
            stage="s",
            state="info",
            detail=detail,
        )

    return make


def sealed(instance: str):
    def make(boot: str, seq: int) -> Sealed:
        return Sealed(
            event_id=new_event_id(), instance_id=instance, boot_id=boot, seq=seq, ts_us=now_us(), event_count=seq + 1
        )

    return make


def all_events(sp: Spool) -> list:
    recs, _ = sp.read(Position(0, 0), sp.committed_end(), max_bytes=1 << 40)
    return [decode(r.value) for r in recs]


def test_append_assigns_consecutive_seqs_and_reads_back(tmp_path: Path) -> None:
    sp = Spool(tmp_path, "i-1")
    evs = sp.append([lifecycle("i-1", str(i)) for i in range(3)])
    evs += sp.append([lifecycle("i-1", "3")])
    assert [e.seq for e in evs] == [0, 1, 2, 3]
    assert len({e.boot_id for e in evs}) == 1
    back = all_events(sp)
    assert back == evs
    recs, _ = sp.read(Position(0, 0), sp.committed_end())
    assert {r.key for r in recs} == {b"i-1"} and {r.topic for r in recs} == {"flightrec.lifecycle"}


APPENDER = """
import os, sys
from flightrec.producer.spool import Spool
from flightrec.schemas import Lifecycle, new_event_id, now_us
sp = Spool(sys.argv[1], "shared")
def make(detail):
    eid = new_event_id()
    return lambda boot, seq: Lifecycle(event_id=eid, instance_id="shared", boot_id=boot, seq=seq,
                                       ts_us=now_us(), stage="s", state="info", detail=detail)
for i in range(int(sys.argv[2])):
    sp.append([make(f"{os.getpid()}-{i}"), make("")])
"""


def test_concurrent_processes_share_one_gap_free_seq(tmp_path: Path) -> None:
    procs = [subprocess.Popen([sys.executable, "-c", APPENDER, str(tmp_path), "50"]) for _ in range(4)]
    assert [p.wait(120) for p in procs] == [0, 0, 0, 0]
    evs = all_events(Spool(tmp_path, "shared"))
    assert sorted(e.seq for e in evs) == list(range(400))
    assert [e.seq for e in evs] == list(range(400))  # written in seq order, too
    assert len({e.boot_id for e in evs}) == 1
    assert len({e.event_id for e in evs}) == 400


def test_seal_ends_the_boot_and_the_next_append_starts_a_new_one(tmp_path: Path) -> None:
    sp = Spool(tmp_path, "i")
    a = sp.append([lifecycle("i"), lifecycle("i")])
    s = sp.append([sealed("i")])[0]
    assert s.seq == 2 and s.event_count == 3
    # another process (a new Spool object) sees the seal and starts a new boot
    b = Spool(tmp_path, "i").append([lifecycle("i")])[0]
    assert b.seq == 0 and b.boot_id != a[0].boot_id


def test_a_reboot_starts_a_new_boot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A machine reboot cannot happen inside a test: the kernel's boot id is replaced instead.
    sp = Spool(tmp_path, "i")
    a = sp.append([lifecycle("i")])[0]
    monkeypatch.setattr(spool_mod, "kernel_boot_id", lambda: "another-kernel-boot")
    b = Spool(tmp_path, "i").append([lifecycle("i")])[0]
    assert (b.seq, b.boot_id != a.boot_id) == (0, True)


def test_torn_record_from_a_crash_is_cut_and_seq_continues(tmp_path: Path) -> None:
    sp = Spool(tmp_path, "i")
    sp.append([lifecycle("i"), lifecycle("i")])
    seg = tmp_path / "i" / "000000000001.seg"
    good = seg.stat().st_size
    with open(seg, "ab") as f:  # what a writer killed mid-write leaves: a header promising more bytes
        f.write(b"\x00\x10\x00\x00\xde\xad\xbe\xefpartial")
    other = Spool(tmp_path, "i")
    assert other.committed_end() == Position(1, good)
    assert seg.stat().st_size == good
    ev = other.append([lifecycle("i")])[0]
    assert ev.seq == 2
    assert [e.seq for e in all_events(other)] == [0, 1, 2]


def test_corrupt_record_bytes_are_not_delivered(tmp_path: Path) -> None:
    sp = Spool(tmp_path, "i")
    sp.append([lifecycle("i")])
    seg = tmp_path / "i" / "000000000001.seg"
    data = bytearray(seg.read_bytes())
    data[-3] ^= 0xFF  # flip a byte in the last record's body: its CRC no longer matches
    seg.write_bytes(bytes(data))
    sp2 = Spool(tmp_path, "i")
    assert all_events(sp2) == []
    assert sp2.append([lifecycle("i")])[0].seq == 0  # the damaged record was cut, its seq reused


def test_bad_segment_header_raises_spool_error(tmp_path: Path) -> None:
    (tmp_path / "i").mkdir()
    (tmp_path / "i" / "000000000001.seg").write_bytes(b"garbage")
    with pytest.raises(SpoolError, match="not a flightrec spool segment"):
        Spool(tmp_path, "i").append([lifecycle("i")])


def test_rotation_cursor_and_deletion(tmp_path: Path) -> None:
    sp = Spool(tmp_path, "i", rotate_bytes=600)
    evs = []
    for _i in range(20):
        evs += sp.append([lifecycle("i", "x" * 100)])
    segs = sp.segments()
    assert len(segs) > 3
    assert [e.seq for e in evs] == list(range(20))
    end = sp.committed_end()
    recs, nxt = sp.read(Position(0, 0), end, max_bytes=500)
    assert 1 <= len(recs) < 20 and nxt == recs[-1].end
    # the rest, from the cursor on
    seen = list(recs)
    cur = nxt
    while cur < end:
        more, cur = sp.read(cur, end, max_bytes=500)
        seen += more
    assert [r.seq for r in seen] == list(range(20))
    sp.save_cursor(cur)
    assert sp.load_cursor() == cur
    assert sp.segments() == [segs[-1]]  # delivered segments are gone, the active one stays
    assert sp.pending() == 0
    assert sp.append([lifecycle("i")])[0].seq == 20


def test_once_marker_sends_once_per_boot(tmp_path: Path) -> None:
    sp = Spool(tmp_path, "i")
    assert len(sp.append([lifecycle("i")], once="facts")) == 1
    assert Spool(tmp_path, "i").append([lifecycle("i")], once="facts") == []
    sp.append([sealed("i")])
    assert len(sp.append([lifecycle("i")], once="facts")) == 1  # new boot, facts again


def test_unwritable_spool_folder_says_what_to_do(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(SpoolError, match="FLIGHTREC_SPOOL"):
        Spool(blocker / "sub", "i")


def test_instance_ids_are_quoted_to_safe_folders(tmp_path: Path) -> None:
    sp = Spool(tmp_path, "a/b c")
    sp.append([lifecycle("a/b c")])
    assert sp.dir.parent == tmp_path and "/" not in sp.dir.name
    recs, _ = sp.read(Position(0, 0), sp.committed_end())
    assert recs[0].key == b"a/b c"
