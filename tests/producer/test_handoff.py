"""The hand-off message: plain versioned JSON that round-trips every field; nothing else is read."""

from __future__ import annotations

import pickle

import pytest
from flightrec.producer.handoff import FORMAT, HandedFile, HandedPipe, Handoff, HandoffError, decode, encode
from flightrec.producer.redact import Carry

from flightrec.settings import Settings


def _handoff() -> Handoff:
    settings = Settings(
        bootstrap="k1:9092,k2:9092", instance="h100-01", redact=("API_TOKEN", "DB_PASSWORD"), sasl_mechanism=None
    )
    pipes = (
        HandedPipe(
            fd=7,
            out_fd=1,
            source="stdout",
            pid=42,
            next_no=17,
            pending=b"\xff\x00half a li",
            overflow=True,
            carry=Carry(tail="sk-12", follow="private_key"),
            strip=True,
            early=3,
        ),
        HandedPipe(fd=8, out_fd=None, source="stderr", pid=42, next_no=0),
    )
    files = (
        HandedFile(
            path="/var/log/d\u00e9mon.log",
            fd=9,
            offset=4096,
            ino=(2049, 131),
            exists=True,
            next_no=5,
            pending=b"no newline",
        ),
        HandedFile(path="/tmp/later.log", fd=None, offset=0, ino=None, exists=False, next_no=0),
    )
    return Handoff(settings=settings, stage="benchmark", boot_id="b-1", token="t-1", pipes=pipes, files=files)


def test_a_hand_off_round_trips_every_field():
    h = _handoff()
    back = decode(encode(h))
    assert back == h
    assert back.settings.redact == ("API_TOKEN", "DB_PASSWORD") and back.pipes[0].carry.follow == "private_key"
    assert back.with_fds([70, 80, 10, 90]).fds() == [70, 80, 10, 90]


def test_the_message_is_json_of_a_known_format():
    import json

    doc = json.loads(encode(_handoff()))
    assert doc["format"] == FORMAT and doc["handoff"]["stage"] == "benchmark"


@pytest.mark.parametrize(
    "data",
    [
        pickle.dumps(_handoff()),  # what an older agent sent: never unpickled (it could run code)
        b'{"format": 99, "handoff": {}}',
        b'{"format": 1}',
        b"\x00\x01 not json",
        b'{"format": 1, "handoff": {"stage": "x"}}',
    ],
)
def test_anything_else_is_refused_with_what_to_do(data):
    with pytest.raises(HandoffError):
        decode(data)
