"""Arrow types of the events' fields, read from the .avsc files (the one source of each event's shape)."""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from importlib import resources
from typing import Any

import pyarrow as pa

from flightrec.errors import FlightrecError

ENVELOPE = ("event_id", "instance_id", "boot_id", "seq", "ts_us")  # the fields every event carries, in order

_PRIMITIVES: Mapping[str, pa.DataType] = {
    "string": pa.string(),
    "int": pa.int32(),
    "long": pa.int64(),
    "float": pa.float32(),
    "double": pa.float64(),
    "boolean": pa.bool_(),
    "bytes": pa.binary(),
}


class SchemaShapeError(FlightrecError):
    """An Avro type or field with no Arrow column type here; extend schemas/arrow.py or the .avsc."""


def arrow_type(avro: Any, named: dict[str, pa.DataType] | None = None) -> pa.DataType:
    """The Arrow type of an Avro type: enum -> string, ["null", T] -> T (nullable), record -> struct.

    ``named`` holds the record and enum types met so far (Avro lets a later field name them).
    """
    named = {} if named is None else named
    if isinstance(avro, str):
        if avro in _PRIMITIVES:
            return _PRIMITIVES[avro]
        if avro in named:
            return named[avro]
        raise SchemaShapeError(f"Avro type {avro!r} has no Arrow column type; add it to schemas/arrow.py")
    if isinstance(avro, list):
        members = [m for m in avro if m != "null"]
        if len(members) != 1:
            raise SchemaShapeError(f"Avro union {avro} is not ['null', T]: give the field one type (or null and one)")
        return arrow_type(members[0], named)
    if not isinstance(avro, dict):
        raise SchemaShapeError(f"not an Avro type: {avro!r}")
    kind = avro.get("type")
    if kind == "enum":
        named[avro["name"]] = pa.string()
        return pa.string()
    if kind == "array":
        return pa.list_(arrow_type(avro["items"], named))
    if kind == "map":
        return pa.map_(pa.string(), arrow_type(avro["values"], named))
    if kind == "fixed":
        return pa.binary(int(avro["size"]))
    if kind == "record":
        struct = pa.struct([(f["name"], arrow_type(f["type"], named)) for f in avro["fields"]])
        named[avro["name"]] = struct
        return struct
    return arrow_type(kind, named)  # {"type": "long"} and the like


@functools.cache
def _avsc(record: str) -> dict[str, Any]:
    path = resources.files("flightrec.schemas").joinpath(f"{record}.avsc")
    if not path.is_file():
        raise SchemaShapeError(f"no schemas/{record}.avsc: name an event by its Avro short name, e.g. 'Lifecycle'")
    schema: dict[str, Any] = json.loads(path.read_text("utf-8"))
    return schema


@functools.cache
def event_schema(record: str) -> pa.Schema:
    """One Arrow column per field of the event's current .avsc (``record``: the short name), in its order."""
    named: dict[str, pa.DataType] = {}
    return pa.schema([(f["name"], arrow_type(f["type"], named)) for f in _avsc(record)["fields"]])


def event_fields(record: str, *names: str) -> list[pa.Field]:
    """The named fields of an event as Arrow fields (all of them, in .avsc order, when none are named)."""
    schema = event_schema(record)
    if not names:
        return list(schema)
    missing = [n for n in names if schema.get_field_index(n) < 0]
    if missing:
        raise SchemaShapeError(f"{record}.avsc has no field {', '.join(missing)}")
    return [schema.field(n) for n in names]


def element_field(record: str, name: str, column: str | None = None) -> pa.Field:
    """One element of an array field as its own column (a LogBatch per-line array -> one value per row)."""
    f = event_fields(record, name)[0]
    if not pa.types.is_list(f.type):
        raise SchemaShapeError(f"{record}.{name} is not an array")
    return pa.field(column or name, f.type.value_type)
