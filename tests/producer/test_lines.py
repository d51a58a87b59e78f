"""Unit tests of the pure line handling: splitting, cutting, CR collapsing, decoding, tails."""

from __future__ import annotations

from flightrec.producer.lines import LineSplitter, Tail, cut_utf8, decode_lines
from hypothesis import given, settings
from hypothesis import strategies as st


def split_all(chunks: list[bytes], max_line: int = 64) -> tuple[list[bytes], list[bool]]:
    s = LineSplitter(max_line)
    lines: list[bytes] = []
    flags: list[bool] = []
    for c in chunks + [None]:
        got, trunc = s.feed(c) if c is not None else s.finish()
        lines.extend(got)
        flags.extend(trunc if trunc is not None else [False] * len(got))
    return lines, flags


def test_lines_across_chunks() -> None:
    assert split_all([b"ab", b"c\nde", b"f\n\ng"]) == ([b"abc", b"def", b"", b"g"], [False] * 4)


def test_no_trailing_partial_line() -> None:
    assert split_all([b"a\nb\n"]) == ([b"a", b"b"], [False, False])


def test_long_line_is_cut_and_flagged_and_memory_bounded() -> None:
    s = LineSplitter(32)
    for _ in range(1000):
        s.feed(b"x" * 1000)
        assert s.pending <= 32
    lines, trunc = s.feed(b"yyy\nnext\n")
    assert lines == [b"x" * 32, b"next"]
    assert trunc == [True, False]


def test_long_line_in_one_chunk() -> None:
    lines, flags = split_all([b"short\n" + b"z" * 100 + b"\nend\n"], max_line=20)
    assert lines == [b"short", b"z" * 20, b"end"]
    assert flags == [False, True, False]


def test_cut_never_splits_a_utf8_character() -> None:
    data = ("é" * 20).encode()  # 2 bytes each
    cut = cut_utf8(data, 7)
    assert cut.decode() == "ééé"
    lines, flags = split_all([data + b"\n"], max_line=17)
    assert lines[0].decode() == "é" * 8 and flags == [True]


def test_carriage_return_progress_collapses() -> None:
    chunks = [b"downloading 10%\r", b"downloading 50%\rdownloading", b" 100%\ndone\n"]
    assert split_all(chunks)[0] == [b"downloading 100%", b"done"]


def test_crlf_is_a_line_end() -> None:
    assert split_all([b"one\r", b"\ntwo\r\n"])[0] == [b"one", b"two"]


def test_progress_without_newline_stays_small() -> None:
    s = LineSplitter(64)
    for i in range(10_000):
        s.feed(f"\r{i} of 10000".encode())
    assert s.pending < 64
    assert s.finish()[0] == [b"9999 of 10000"]


def test_decode_flags_only_bad_lines() -> None:
    texts, invalid = decode_lines([b"good", b"bad \xff\xfe end", "ünï".encode()])
    assert texts == ["good", "bad \\xff\\xfe end", "ünï"]
    assert invalid == [False, True, False]


def test_decode_fast_path_has_no_flags() -> None:
    assert decode_lines([b"a", b"b"]) == (["a", "b"], None)


def test_surrogate_bytes_are_invalid() -> None:
    texts, invalid = decode_lines([b"\xed\xa0\x80"])
    assert invalid == [True] and texts[0] == "\\xed\\xa0\\x80"


def test_tail_keeps_last_lines_and_cuts_long_ones() -> None:
    t = Tail(limit=3, line_bytes=5)
    t.extend(["1", "2"])
    t.extend(["3", "4", "0123456789"])
    assert t.snapshot() == ["3", "4", "01234 [cut]"]


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.binary(max_size=50).map(lambda b: b.replace(b"\r", b"")), max_size=20),
    st.lists(st.integers(min_value=1, max_value=30), max_size=10),
)
def test_split_matches_bytes_split_for_any_chunking(lines: list[bytes], cuts: list[int]) -> None:
    """Without CRs or long lines, any chunking gives exactly bytes.split's lines."""
    data = b"\n".join(lines) + b"\n" if lines else b""
    chunks, pos = [], 0
    for c in cuts:
        chunks.append(data[pos : pos + c])
        pos += c
    chunks.append(data[pos:])
    got, flags = split_all(chunks, max_line=1000)
    assert got == (data.split(b"\n")[:-1] if data else [])
    assert not any(flags)
