"""db/nul.py: NUL characters spelled out in every text of a table, nested ones included; nothing else changes."""

from __future__ import annotations

import pyarrow as pa
from flightrec.db.fold import EXITS, FACTS, LOGS
from flightrec.db.nul import has_nul, without_nul
from hypothesis import given, settings
from hypothesis import strategies as st


def test_a_table_without_nul_is_returned_as_it_is() -> None:
    t = pa.table({"text": ["a", None, "b"], "raw": pa.array([b"\x00", None, b"x"])})
    assert not has_nul(t) and without_nul(t) is t  # binary keeps its NUL bytes


def test_nested_text_is_spelled_out_and_the_schema_kept() -> None:
    row = {name: None for name in EXITS.names}
    row.update(
        event_id="e\x00",
        argv=["sh", "-c", "printf '\x00'"],
        stdout_tail=[],
        file_tails=[{"path": "/log\x00", "lines": ["x\x00y", "z"], "exists": True}],
    )
    t = pa.Table.from_pylist([row, {**row, "event_id": "plain"}], schema=EXITS)
    out = without_nul(t)
    assert out.schema == EXITS and not has_nul(out)
    first = out.to_pylist()[0]
    assert first["event_id"] == "e\\x00" and first["argv"][2] == "printf '\\x00'"
    assert first["file_tails"] == [{"path": "/log\\x00", "lines": ["x\\x00y", "z"], "exists": True}]
    facts = pa.Table.from_pylist([{**{n: None for n in FACTS.names}, "attributes": [("k\x00", "v\x00")]}], schema=FACTS)
    assert without_nul(facts).to_pylist()[0]["attributes"] == [("k\\x00", "v\\x00")]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.none(), st.text(alphabet=st.sampled_from("a\x00'\\é\n"), max_size=12)), max_size=20))
def test_only_the_nul_changes(texts: list[str | None]) -> None:
    t = pa.Table.from_pylist([{**{n: None for n in LOGS.names}, "text": x} for x in texts], schema=LOGS)
    got = without_nul(t).column("text").to_pylist()
    assert got == [None if x is None else x.replace("\x00", "\\x00") for x in texts]
    assert has_nul(t) == any(x is not None and "\x00" in x for x in texts)


def test_a_dictionary_encoded_text_is_spelled_out() -> None:
    """The fold gives a log batch's instance, boot, event, stage and source dictionary-encoded (db/foldlines.py)."""
    ids = pa.DictionaryArray.from_arrays(pa.array([0, 0, 1], pa.int32()), pa.array(["gpu-\x00-1", "plain"]))
    t = pa.table({"instance_id": ids, "n": [1, 2, 3]})
    assert has_nul(t)
    out = without_nul(t)
    assert out.schema == t.schema and not has_nul(out)
    assert out.column("instance_id").to_pylist() == ["gpu-\\x00-1", "gpu-\\x00-1", "plain"]
