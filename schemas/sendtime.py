"""The send-time header: when the agent's sender handed a message to Kafka, by the instance's clock.

An event's ``ts_us`` is when it happened; an event spooled while the network was cut is sent long after. The clock
offset of an instance is judged only from messages sent in real time: the sender stamps each message with a Kafka
record header ``flightrec-sent-us`` (ASCII decimal microseconds since the epoch) as it sends it, and the
materializer compares that with when Kafka appended the record (its LogAppendTime). The Avro value and its schemas
are unchanged.

Record headers are hostile input (any producer can write any bytes there): :func:`sent_us_of` never raises,
whatever it is given, and answers None for anything but exactly one well-formed value inside the sane window.
Pure; self-contained (no aiokafka import), so the agent and the materializer share it.
"""

from __future__ import annotations

from flightrec.schemas.limits import TS_MAX_US, TS_MIN_US

SENT_HEADER = "flightrec-sent-us"
_SENT_KEY = SENT_HEADER.encode()
MAX_DIGITS = 17  # µs up to TS_MAX_US (2200-01-01) take 16 digits; a longer value is refused before int()


def sent_header(now_us: int) -> tuple[str, bytes]:
    """The header of a message sent now (``now_us``: the sender's clock, µs since the epoch)."""
    return (SENT_HEADER, str(int(now_us)).encode("ascii"))


def _name_is_ours(name: object) -> bool:
    if isinstance(name, str):
        return name == SENT_HEADER
    if isinstance(name, bytes | bytearray | memoryview):
        return bytes(name) == _SENT_KEY
    return False


def _value_us(value: object) -> int | None:
    if not isinstance(value, bytes | bytearray | memoryview):
        return None
    raw = bytes(value)
    if not 0 < len(raw) <= MAX_DIGITS or not raw.isdigit():  # ASCII digits only: no sign, space, '_' or unicode
        return None
    us = int(raw)
    return us if TS_MIN_US <= us < TS_MAX_US else None


def sent_us_of(headers: object) -> int | None:
    """The send time a record's headers carry, or None: no such header, more than one (which to believe?), a
    value that is not ASCII digits, out of the sane window, or headers that are not a sequence of pairs."""
    found: list[object] = []
    try:
        for item in headers or ():  # type: ignore[attr-defined]  # a sequence of (name, value) pairs, or anything
            try:
                name, value = item
            except (TypeError, ValueError):
                continue
            if _name_is_ours(name):
                found.append(value)
                if len(found) > 1:
                    return None
    except Exception:  # noqa: BLE001 - hostile input: an iterable that raises is no header
        return None
    return _value_us(found[0]) if found else None
