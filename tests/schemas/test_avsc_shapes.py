"""The .avsc files are the one source of each event's shape: the dataclasses and Arrow types follow them."""

from __future__ import annotations

import dataclasses
import json
from importlib import resources
from typing import Any

import pyarrow as pa
import pytest
from flightrec.schemas import EVENT_TYPES, FileTail
from flightrec.schemas.arrow import arrow_type, event_fields, event_schema

from flightrec.errors import FlightrecError


def _avsc(name: str) -> dict[str, Any]:
    return json.loads(resources.files("flightrec.schemas").joinpath(f"{name}.avsc").read_text("utf-8"))


def _plain(value: Any) -> Any:
    """Defaults compared as JSON values (a tuple default and an Avro [] are the same)."""
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def _dataclass_default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return _plain(f.default)
    if f.default_factory is not dataclasses.MISSING:
        return _plain(f.default_factory())
    return dataclasses.MISSING


def _check(cls: type, avsc_fields: list[dict[str, Any]]) -> None:
    ours = dataclasses.fields(cls)
    assert [f.name for f in ours] == [f["name"] for f in avsc_fields], f"{cls.__name__}: fields or their order differ"
    for f, a in zip(ours, avsc_fields, strict=True):
        nullable = isinstance(a["type"], list) and "null" in a["type"]
        assert ("None" in str(f.type)) == nullable, f"{cls.__name__}.{f.name}: nullable in one, not in the other"
        expected = _plain(a["default"]) if "default" in a else dataclasses.MISSING
        shown = "none" if expected is dataclasses.MISSING else repr(expected)
        assert _dataclass_default(f) == expected, f"{cls.__name__}.{f.name}: defaults differ (.avsc: {shown})"


@pytest.mark.parametrize("cls", EVENT_TYPES, ids=lambda c: c.__name__)
def test_dataclass_has_exactly_the_avsc_fields(cls: type) -> None:
    _check(cls, _avsc(cls.name.rsplit(".", 1)[-1])["fields"])


def test_file_tail_has_exactly_the_nested_record_fields() -> None:
    exit_fields = {f["name"]: f for f in _avsc("ProcessExit")["fields"]}
    _check(FileTail, exit_fields["file_tails"]["type"]["items"]["fields"])


def test_avro_types_map_to_arrow_types() -> None:
    assert arrow_type("string") == pa.string() and arrow_type("int") == pa.int32()
    assert arrow_type("long") == pa.int64() and arrow_type("double") == pa.float64()
    assert arrow_type("boolean") == pa.bool_() and arrow_type("bytes") == pa.binary()
    assert arrow_type(["null", "int"]) == pa.int32()
    assert arrow_type({"type": "enum", "name": "E", "symbols": ["a"]}) == pa.string()
    assert arrow_type({"type": "array", "items": "string"}) == pa.list_(pa.string())
    assert arrow_type({"type": "map", "values": "string"}) == pa.map_(pa.string(), pa.string())
    rec = {"type": "record", "name": "R", "fields": [{"name": "a", "type": "long"}, {"name": "b", "type": "string"}]}
    assert arrow_type(rec) == pa.struct([("a", pa.int64()), ("b", pa.string())])
    with pytest.raises(FlightrecError, match="union"):
        arrow_type(["null", "int", "string"])


def test_event_schema_follows_the_avsc_order() -> None:
    for cls in EVENT_TYPES:
        short = cls.name.rsplit(".", 1)[-1]
        assert event_schema(short).names == [f["name"] for f in _avsc(short)["fields"]]
        assert [f.name for f in event_fields(short)] == event_schema(short).names


def test_every_event_travels_on_a_topic_of_the_contract() -> None:
    from flightrec.schemas import topics

    from flightrec import settings

    assert {cls.topic for cls in EVENT_TYPES} == set(topics.TOPICS)
    assert settings.TOPICS == topics.TOPICS  # re-exported for older imports


def test_schemas_depend_on_nothing_but_the_error_types() -> None:
    """The wire's contract stands alone: schemas/ imports flightrec.errors and itself only."""
    import ast

    root = resources.files("flightrec.schemas")
    for entry in root.iterdir():
        if not entry.name.endswith(".py"):
            continue
        for node in ast.walk(ast.parse(entry.read_text("utf-8"))):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            for name in names:
                if name.startswith("flightrec"):
                    assert name == "flightrec.errors" or name.startswith("flightrec.schemas"), (entry.name, name)


# Every schema version ever released, by CRC-64-AVRO fingerprint: messages written with any of them
# may still sit in Kafka (or in an agent's spool), so this build must decode them all.
RELEASED: dict[str, tuple[str, ...]] = {
    "flightrec.v1.BenchmarkResult": ("c78f67f8dd23a802", "cd4360d13db9682b"),
    "flightrec.v1.Dropped": ("91f64868dac2792c",),
    "flightrec.v1.Heartbeat": ("f4a89aa7a2cf0a9f",),
    "flightrec.v1.InstanceFacts": ("bbed134756422e6d", "a4dd7ff4184d16ca"),
    "flightrec.v1.Lifecycle": ("50f83d8ecfb4a2f1", "1a9079dd0dbd7cf2"),
    "flightrec.v1.LogBatch": ("162681480ec02f2b", "e9c0ab63342a9b5a"),
    "flightrec.v1.ManagerEvent": ("55ad707df7cf5bf8",),
    "flightrec.v1.ProcessExit": ("a5b015526042862c",),
    "flightrec.v1.Sealed": ("fa764eb0b4f246a5",),
    "flightrec.v1.Throughput": ("40d4b3441706c352",),
}


def test_a_changed_schema_keeps_every_released_version_readable() -> None:
    """Changing an .avsc (beyond its docs) changes its fingerprint: keep the released version in
    schemas/previous/ (a decode test in test_codec.py) and list the new fingerprint in RELEASED."""
    from flightrec.schemas import default_codec

    codec = default_codec()
    known = {v.fingerprint.hex(): v for v in codec.versions}
    for cls in EVENT_TYPES:
        fp = codec.current(cls.name).fingerprint.hex()
        assert fp in RELEASED.get(cls.name, ()), (
            f"{cls.name} changed (fingerprint {fp}): copy its released .avsc to schemas/previous/"
            f"{cls.name.rsplit('.', 1)[-1]}.vN.avsc, then add {fp} to RELEASED here"
        )
    for name, fps in RELEASED.items():
        for fp in fps:
            assert fp in known and known[fp].name == name, (
                f"released {name} {fp} no longer decodes: restore its .avsc in schemas/previous/"
            )


def test_every_event_opens_with_the_same_envelope() -> None:
    from flightrec.schemas.arrow import ENVELOPE

    for cls in EVENT_TYPES:  # names and types; the docs may say what an id means for this event
        fields = _avsc(cls.name.rsplit(".", 1)[-1])["fields"][: len(ENVELOPE)]
        assert [(f["name"], f["type"]) for f in fields] == list(
            zip(ENVELOPE, ("string",) * 3 + ("long",) * 2, strict=True)
        ), cls.__name__


def test_a_field_name_has_one_type_in_every_event() -> None:
    """One name per concept: a field called the same in two events holds the same kind of value."""
    seen: dict[str, tuple[str, pa.DataType]] = {}
    for cls in EVENT_TYPES:
        short = cls.name.rsplit(".", 1)[-1]
        for f in event_fields(short):
            where, typ = seen.setdefault(f.name, (short, f.type))
            assert typ == f.type, f"{short}.{f.name} is {f.type}, {where}.{f.name} is {typ}: one name, one type"
