"""Who wrote an event: per-instance keys derived from the fleet key, and the HMAC tag each message carries.

The contract (the agent signs, the materializer verifies; both pure, stdlib ``hmac`` only):

- The operator holds one **fleet key** (``FLIGHTREC_FLEET_KEY``: 32 random bytes, hex). It never goes into an
  instance. ``flightrec manager enroll --instance ID`` makes a **key id** ``ID/<enrolled µs>/<random>`` and the
  instance's **secret** ``HMAC-SHA256(fleet key, "flightrec instance key\\0" + key id)``; the instance gets the
  two as one token, ``FLIGHTREC_INSTANCE_KEY=v1.<key id>.<secret hex>``. The materializer, holding the fleet key,
  derives any instance's secret from the key id alone: no table of secrets to keep, leak or sync, and nothing
  an instance can read tells it another instance's secret.
- The manager's events are signed with the **manager key**, derived from the fleet key with key id ``manager``.
- Every Kafka message carries the header ``flightrec-tag`` = ``<key id> <tag hex>``, the tag being an
  HMAC-SHA256 with the secret over the topic, the **partition**, the key (its length first) and the value
  (:func:`tag`): the Avro single-object value stays as it is. The writer picks the partition before it signs (the
  agent names it in its send, by the default partitioner of its Kafka client), so a copy of a message into another
  partition is no longer tagged: whatever partitioner a producer uses, and however many partitions a topic gains,
  the tag proves the one partition its writer chose. A tag of the first version (no partition in it) proves nothing
  of the partition: it is refused, naming the upgrade.
- A tag proves which key wrote the message. The materializer then holds the event to that key's instance: an
  instance key writes only events of its own instance id and never manager events, and a key enrolled before
  the instance's ``destroyed`` (by the manager's clock) writes nothing received after that ``destroyed``.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass, field

from flightrec.errors import ConfigError

HEADER = "flightrec-tag"
MANAGER_KEY_ID = "manager"
TOKEN_VERSION = "v1"
_INSTANCE_LABEL = b"flightrec instance key\x00"
_KEY_ID = re.compile(r"^(?P<instance>[^/\s]{1,200})/(?P<enrolled>[0-9]{1,19})/(?P<nonce>[0-9a-f]{16})$")


def parse_fleet_key(text: str) -> bytes:
    """The fleet key's bytes from its hex text (``FLIGHTREC_FLEET_KEY``); ConfigError when it is not one."""
    try:
        key = bytes.fromhex(text.strip())
    except ValueError as exc:
        raise ConfigError("FLIGHTREC_FLEET_KEY is not hex text; make one with `flightrec manager fleet-key`") from exc
    if len(key) < 16:
        raise ConfigError(
            f"FLIGHTREC_FLEET_KEY holds {len(key)} bytes; it needs at least 16 "
            "(make one with `flightrec manager fleet-key`)"
        )
    return key


def new_fleet_key() -> str:
    """A new fleet key as hex text (32 random bytes)."""
    return secrets.token_hex(32)


def secret_for(fleet_key: bytes, key_id: str) -> bytes:
    """The secret of a key id: the manager key for ``manager``, else an instance's enrolled secret."""
    if key_id == MANAGER_KEY_ID:
        return hmac.new(fleet_key, b"flightrec manager key", hashlib.sha256).digest()
    return hmac.new(fleet_key, _INSTANCE_LABEL + key_id.encode(), hashlib.sha256).digest()


@dataclass(frozen=True)
class KeyId:
    """What a key id says: whose key it is and when the manager enrolled it (its own clock, µs)."""

    instance_id: str | None  # None for the manager's key
    enrolled_us: int = 0

    @staticmethod
    def parse(text: str) -> KeyId | None:
        """The parts of a key id; None when it is not one."""
        if text == MANAGER_KEY_ID:
            return KeyId(None)
        m = _KEY_ID.fullmatch(text)
        if not m:
            return None
        return KeyId(m["instance"], int(m["enrolled"]))


@dataclass(frozen=True)
class Signer:
    """Signs messages with one key. ``repr`` never shows the secret."""

    key_id: str
    secret: bytes = field(repr=False)

    def header(self, topic: str, partition: int, key: bytes | None, value: bytes) -> tuple[str, bytes]:
        """The ``flightrec-tag`` header of one message, to be sent to ``partition`` of ``topic``."""
        return HEADER, f"{self.key_id} {tag(self.secret, topic, partition, key, value)}".encode()

    @property
    def token(self) -> str:
        """The instance's ``FLIGHTREC_INSTANCE_KEY`` value: the key id and the secret, one line."""
        return f"{TOKEN_VERSION}.{self.key_id}.{self.secret.hex()}"

    @staticmethod
    def from_token(text: str) -> Signer:
        """The signer of a ``FLIGHTREC_INSTANCE_KEY`` token; ConfigError naming what is wrong (not the secret)."""
        version, _, rest = text.strip().partition(".")
        key_id, _, secret_hex = rest.rpartition(".")
        if version != TOKEN_VERSION or KeyId.parse(key_id) is None:
            raise ConfigError(
                "FLIGHTREC_INSTANCE_KEY is not a flightrec instance key; set it to the value "
                "`flightrec manager enroll --instance ID` printed for this instance"
            )
        try:
            secret = bytes.fromhex(secret_hex)
        except ValueError as exc:
            raise ConfigError("FLIGHTREC_INSTANCE_KEY's secret is not hex; copy the whole enrolled value") from exc
        if len(secret) != 32:
            raise ConfigError("FLIGHTREC_INSTANCE_KEY's secret is cut short; copy the whole enrolled value")
        return Signer(key_id, secret)

    @staticmethod
    def manager(fleet_key: bytes) -> Signer:
        """The manager's signer."""
        return Signer(MANAGER_KEY_ID, secret_for(fleet_key, MANAGER_KEY_ID))


def enroll(fleet_key: bytes, instance_id: str, now_us: int) -> Signer:
    """A new key for ``instance_id``, enrolled at ``now_us`` (the manager's clock)."""
    if not instance_id or "/" in instance_id or any(c.isspace() for c in instance_id) or len(instance_id) > 200:
        raise ConfigError(f"cannot enroll instance id {instance_id!r}: use 1-200 characters, no '/' or spaces")
    key_id = f"{instance_id}/{now_us}/{secrets.token_hex(8)}"
    return Signer(key_id, secret_for(fleet_key, key_id))


_TAG_LABEL = b"flightrec tag v2\x00"


def tag(secret: bytes, topic: str, partition: int, key: bytes | None, value: bytes) -> str:
    """HMAC-SHA256 over the topic, the partition, the message key (after its length: no byte moves between key and
    value unseen) and the value, hex."""
    key_len = b"-1" if key is None else str(len(key)).encode()
    head = b"\x00".join((_TAG_LABEL + topic.encode(), str(partition).encode(), key_len, key or b""))
    mac = hmac.new(secret, head, hashlib.sha256)
    mac.update(value)
    return mac.hexdigest()


def first_version_tag(secret: bytes, topic: str, key: bytes | None, value: bytes) -> str:
    """The tag of agents before the partition was bound (topic, key, value only): recognised to say so, never
    accepted."""
    mac = hmac.new(secret, topic.encode() + b"\x00" + (key or b"") + b"\x00", hashlib.sha256)
    mac.update(value)
    return mac.hexdigest()


@dataclass(frozen=True)
class Verdict:
    """What a message's tag proves: the key that wrote it (None: no tag, or a tag no key made)."""

    key_id: str | None
    instance_id: str | None = None  # the key's instance; None for the manager key or when unproven
    enrolled_us: int = 0
    problem: str | None = None  # why the tag proves nothing (None: valid, or no tag at all)

    @property
    def valid(self) -> bool:
        return self.key_id is not None and self.problem is None

    @property
    def manager(self) -> bool:
        return self.valid and self.key_id == MANAGER_KEY_ID


def header_of(headers: object) -> bytes | None:
    """The ``flightrec-tag`` header's value among a record's headers (the first one); None without one."""
    for item in headers or ():  # type: ignore[attr-defined]  # aiokafka gives a sequence of (str, bytes) pairs
        try:
            name, value = item
        except (TypeError, ValueError):
            continue
        if name == HEADER:
            return bytes(value) if value is not None else b""
    return None


def verify(
    fleet_key: bytes, header: bytes | None, topic: str, partition: int, key: bytes | None, value: bytes
) -> Verdict:
    """Check one message's tag, for the partition it was read from, against the key its key id names. Pure."""
    if header is None:
        return Verdict(None)
    try:
        key_id, _, got = header.decode("utf-8").partition(" ")
    except UnicodeDecodeError:
        return Verdict(None, problem="its tag header is not text")
    parsed = KeyId.parse(key_id)
    if parsed is None:
        return Verdict(None, problem="its tag names no flightrec key")
    secret = secret_for(fleet_key, key_id)
    want = tag(secret, topic, partition, key, value)
    if not hmac.compare_digest(want.encode(), got.encode()):  # bytes: compare_digest refuses non-ASCII str
        if hmac.compare_digest(first_version_tag(secret, topic, key, value).encode(), got.encode()):
            return Verdict(
                None,
                problem=f"its tag (key {key_id!r}) does not bind the partition: an agent older than this "
                "materializer wrote it; upgrade the agent",
            )
        return Verdict(
            None,
            problem=f"its tag does not match key {key_id!r} for partition {partition}: not made by that key, made "
            "for another partition (a copy), or altered",
        )
    return Verdict(key_id, parsed.instance_id, parsed.enrolled_us)
