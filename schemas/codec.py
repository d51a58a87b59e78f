"""The wire codec: Avro single-object encoding (C3 01, CRC-64-AVRO fingerprint, binary body)."""

from __future__ import annotations

import io
import json
import re
from dataclasses import dataclass
from importlib import resources
from typing import Any

import fastavro
from fastavro.schema import fingerprint, parse_schema, to_parsing_canonical_form
from flightrec.schemas.events import EVENT_BY_NAME, Event

from flightrec.errors import CodecError

_ADDRESS = re.compile(r" object at 0x[0-9a-fA-F]+")  # object addresses in library messages

MAGIC = b"\xc3\x01"
HEADER_LEN = 10  # magic (2) + fingerprint (8)


@dataclass(frozen=True)
class SchemaVersion:
    """One known writer schema: its full name, parsed form, and 8-byte little-endian fingerprint."""

    name: str
    parsed: Any
    fingerprint: bytes
    current: bool
    source: str


def schema_fingerprint(schema: dict[str, Any]) -> bytes:
    """The CRC-64-AVRO fingerprint of the schema's parsing canonical form, little-endian."""
    return bytes.fromhex(fingerprint(to_parsing_canonical_form(schema), "CRC-64-AVRO"))


def _load_schema_files() -> list[tuple[str, dict[str, Any], bool]]:
    root = resources.files("flightrec.schemas")
    found: list[tuple[str, dict[str, Any], bool]] = []
    for entry in sorted(root.iterdir(), key=lambda e: e.name):
        if entry.name.endswith(".avsc"):
            found.append((entry.name, json.loads(entry.read_text("utf-8")), True))
    prev = root / "previous"
    if prev.is_dir():
        for entry in sorted(prev.iterdir(), key=lambda e: e.name):
            if entry.name.endswith(".avsc"):
                found.append((f"previous/{entry.name}", json.loads(entry.read_text("utf-8")), False))
    return found


class Codec:
    """Encodes events and decodes messages. Schemas are parsed once, at construction.

    Guarantees: ``encode`` output decodes with any Avro implementation given the
    .avsc files; ``decode`` either returns an event of a known type or raises
    :class:`CodecError` with the reason; it never raises anything else for bad bytes.
    Older writer schemas (``schemas/previous``) are resolved against the current
    reader schema, so their new fields take their defaults.
    """

    def __init__(self) -> None:
        self._current: dict[str, SchemaVersion] = {}
        self._by_fp: dict[bytes, SchemaVersion] = {}
        for source, raw, current in _load_schema_files():
            parsed = parse_schema(raw, _write_hint=False)
            name = raw["namespace"] + "." + raw["name"] if "." not in raw["name"] else raw["name"]
            version = SchemaVersion(name, parsed, schema_fingerprint(raw), current, source)
            if version.fingerprint in self._by_fp:
                continue  # an identical schema kept twice resolves the same way
            self._by_fp[version.fingerprint] = version
            if current:
                if name in self._current:
                    raise CodecError(f"two current schemas are named {name}")
                self._current[name] = version
        missing = set(EVENT_BY_NAME) - set(self._current)
        if missing:
            raise CodecError(f"no .avsc schema for event types {sorted(missing)}")

    @property
    def versions(self) -> tuple[SchemaVersion, ...]:
        """Every known writer schema, current ones and previous ones."""
        return tuple(self._by_fp.values())

    def current(self, name: str) -> SchemaVersion:
        """The current schema of an event type, by Avro full name."""
        return self._current[name]

    # -- encoding ---------------------------------------------------------

    def encode_record(self, name: str, record: dict[str, Any]) -> bytes:
        """Encode one Avro record of the named current schema (no dataclass needed)."""
        version = self._current[name]
        buf = io.BytesIO()
        buf.write(MAGIC)
        buf.write(version.fingerprint)
        try:
            fastavro.schemaless_writer(buf, version.parsed, record)
        except (ValueError, TypeError, KeyError, AttributeError, OverflowError) as exc:
            raise CodecError(f"cannot encode {name}: {exc}") from exc
        return buf.getvalue()

    def encode(self, event: Event) -> bytes:
        """Encode one event as an Avro single-object message."""
        return self.encode_record(event.name, event.to_record())

    # -- decoding ---------------------------------------------------------

    def decode_record(self, data: bytes | bytearray | memoryview | None) -> tuple[str, dict[str, Any]]:
        """Decode a message to (schema full name, record dict), resolved to the current schema.

        The hot path for consumers: a LogBatch record keeps its per-line fields
        as parallel lists, ready to become Arrow columns.
        """
        if not data:
            raise CodecError("empty message")
        data = bytes(data)
        if len(data) < HEADER_LEN:
            raise CodecError(f"truncated header: {len(data)} bytes, need at least {HEADER_LEN}")
        if data[:2] != MAGIC:
            raise CodecError(f"not Avro single-object encoding: magic {data[:2].hex()} is not c301")
        fp = data[2:HEADER_LEN]
        version = self._by_fp.get(fp)
        if version is None:
            raise CodecError(f"unknown schema fingerprint {fp.hex()}: written by a schema this build does not know")
        body = io.BytesIO(data)
        body.seek(HEADER_LEN)
        reader = None if version.current else self._current.get(version.name)
        if reader is None and not version.current:
            raise CodecError(f"schema {version.name} is no longer read by this build")
        try:
            record = fastavro.schemaless_reader(body, version.parsed, reader.parsed if reader else None)
        except Exception as exc:  # fastavro raises many kinds for corrupt bodies
            why = _ADDRESS.sub("", f"{type(exc).__name__}: {exc}")  # the same bytes give the same reason
            raise CodecError(f"body does not decode as {version.name} ({version.source}): {why}") from exc
        rest = len(data) - body.tell()
        if rest:
            raise CodecError(f"{rest} trailing bytes after a {version.name} body")
        if not isinstance(record, dict):
            raise CodecError(f"body of {version.name} is not a record")
        return version.name, record

    def decode(self, data: bytes | bytearray | memoryview | None) -> Event:
        """Decode a message to its event dataclass; bad bytes raise :class:`CodecError`."""
        name, record = self.decode_record(data)
        try:
            return EVENT_BY_NAME[name].from_record(record)
        except (TypeError, ValueError) as exc:
            raise CodecError(f"{name} record does not build an event: {exc}") from exc


_default: Codec | None = None


def default_codec() -> Codec:
    """The process-wide codec (schemas parsed on first use)."""
    global _default
    if _default is None:
        _default = Codec()
    return _default


def encode(event: Event) -> bytes:
    """Encode an event with the default codec."""
    return default_codec().encode(event)


def decode(data: bytes | bytearray | memoryview | None) -> Event:
    """Decode a message with the default codec; bad bytes raise :class:`CodecError`."""
    return default_codec().decode(data)


def decode_record(data: bytes | bytearray | memoryview | None) -> tuple[str, dict[str, Any]]:
    """Decode a message to (schema name, record dict) with the default codec."""
    return default_codec().decode_record(data)
