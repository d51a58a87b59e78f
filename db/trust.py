"""Which events the fold may believe: each one held to the key that tagged it (schemas/auth.py), refusals said.

Guarantees (with a fleet key):

- An event is folded only when its tag is valid, for the partition it was read from, for a key that may write it
  (a verbatim copy into another partition is refused as forged: a lake's shards never hold one event twice): an
  instance's key writes only events carrying its own instance id and never manager events; manager events need
  the manager's key.
- A key enrolled before its instance's ``destroyed`` (the manager's clock) changes nothing of the record with what
  Kafka received after that ``destroyed`` (the broker's clock): a destroyed instance's key is revoked. What it
  sent late is kept, not trusted: a dead letter whose reason starts ``unverified: delivered after …`` (its bytes
  and claimed instance; the timeline shows it, flagged), never folded, so it counts as no evidence and changes no
  status. Except where the instance had committed to it before the destroy: a tagged event of the same boot that
  Kafka received before the destroy (a heartbeat, every ``FLIGHTREC_HEARTBEAT_S``) carries the boot's running
  count, its seq, signed; a late event whose seq is below it existed before the destroy and is folded (verified).
  A key enrolled later (the instance id rented again) writes.
- An event without a tag is folded only in the plainly named unauthenticated mode (``accept``), and even then
  not for an instance that has shown a valid tag before, nor as a manager event.
- Every refusal is a reason the fold writes to ``dead_letters`` with the claimed instance id.

Without a fleet key nothing can be verified: every event is folded and counts as unauthenticated. The state
(revocations, instances seen tagged, the boots' signed counts) is kept across batches and loaded from the database
at start, so a restart or a replay judges alike; one limit: an event read before its instance's ``destroyed`` was
read (a partition of another topic behind) is judged without that revocation. The signed count commits to an
event's place in its boot, not to its bytes: a thief of a destroyed instance's key may still fill a place it had
counted and never delivered (docs/security.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from flightrec.schemas.auth import Verdict, header_of, verify
from flightrec.schemas.limits import MAX_SEQ

Unauthenticated = Literal["accept", "refuse"]
COMMITTED_BOOTS = 16  # boots per instance whose signed counts are kept
UNAUTHENTICATED_MODES: tuple[str, ...] = ("accept", "refuse")


@dataclass(frozen=True)
class TrustConfig:
    """What the materializer was told: the fleet key (None: verify nothing) and what an untagged event gets."""

    fleet_key: bytes | None = field(default=None, repr=False)
    unauthenticated: Unauthenticated = "accept"


@dataclass
class Trust:
    """The fold's judge of tags; its state grows as valid events are folded (one per materializer)."""

    config: TrustConfig = field(default_factory=TrustConfig)
    revoked: dict[str, tuple[int, int]] = field(default_factory=dict)  # instance -> (destroyed ts µs, recv µs)
    tagged: set[str] = field(default_factory=set)  # instances that have shown a valid instance key
    # instance -> boot -> the running count its key signed while it was trusted (1 + the highest seq folded), for
    # its COMMITTED_BOOTS latest boots: a key inventing boot ids cannot grow this past its own instance's share
    committed: dict[str, dict[str, int]] = field(default_factory=dict)

    @property
    def verifying(self) -> bool:
        return self.config.fleet_key is not None

    def judge(
        self,
        kind: str,
        rec: dict[str, Any],
        topic: str,
        partition: int,
        key: bytes | None,
        value: bytes,
        headers: object,
        recv_us: int | None,
    ) -> tuple[str | None, str | None]:
        """(key id that wrote it, None) to fold the event; (None, reason) to refuse it. ``kind`` is the fold's
        short kind of the event (``manager`` for the manager's)."""
        if self.config.fleet_key is None:
            return None, None
        claimed = str(rec.get("instance_id", ""))
        verdict = verify(self.config.fleet_key, header_of(headers), topic, partition, key, value)
        if verdict.problem is not None:
            return None, f"forged: {verdict.problem} (claims instance {claimed!r})"
        if verdict.key_id is None:
            return self._untagged(kind, claimed)
        if verdict.manager:
            return verdict.key_id, None
        return self._instance_key(kind, claimed, verdict, recv_us, rec)

    def _untagged(self, kind: str, claimed: str) -> tuple[str | None, str | None]:
        if kind == "manager":
            return None, f"unauthenticated: a manager event about {claimed!r} without the manager's tag"
        if self.config.unauthenticated == "refuse":
            return None, (
                f"unauthenticated: no tag (claims instance {claimed!r}); enroll the instance "
                "(`flightrec manager enroll`) or run the materializer with FLIGHTREC_UNAUTHENTICATED=accept"
            )
        if claimed in self.tagged:
            return None, f"unauthenticated: no tag, and instance {claimed!r} tags its events"
        return None, None

    def _instance_key(
        self, kind: str, claimed: str, verdict: Verdict, recv_us: int | None, rec: dict[str, Any]
    ) -> tuple[str | None, str | None]:
        owner = verdict.instance_id
        if kind == "manager":
            return None, f"forged: instance {owner!r}'s key wrote a manager event about {claimed!r}"
        if owner != claimed:
            return None, f"forged: instance {owner!r}'s key wrote an event claiming instance {claimed!r}"
        boot, seq = str(rec.get("boot_id", "")), int(rec.get("seq", 0))
        destroyed = self.revoked.get(claimed)
        if (
            destroyed is not None
            and verdict.enrolled_us <= destroyed[0]
            and (recv_us is None or recv_us > destroyed[1])
        ):
            count = self.committed.get(claimed, {}).get(boot, 0)
            if seq < count:  # the boot had counted past it, signed, before the destroy: it existed then
                return verdict.key_id, None
            return None, (
                f"unverified: delivered after instance {claimed!r} was destroyed (key {verdict.key_id}); kept, not "
                f"trusted as evidence: what Kafka received of boot {boot!r} before the destroy counted "
                f"{count} events, this one is seq {seq}"
            )
        self.tagged.add(claimed)
        self.count(claimed, boot, seq)
        return verdict.key_id, None

    def count(self, instance: str, boot: str, seq: int) -> None:
        """Note that ``instance``'s key signed ``seq`` of ``boot`` while trusted (a seq past MAX_SEQ is no boot's)."""
        if not 0 <= seq <= MAX_SEQ:
            return
        boots = self.committed.setdefault(instance, {})
        if boot not in boots and len(boots) >= COMMITTED_BOOTS:
            del boots[next(iter(boots))]  # the boot first seen: an instance's latest boots are the ones delivered late
        if seq + 1 > boots.get(boot, 0):
            boots[boot] = seq + 1

    def folded_manager_event(self, rec: dict[str, Any], recv_us: int | None) -> None:
        """Learn from a manager event the fold accepted: ``destroyed`` revokes the instance's earlier keys."""
        if self.config.fleet_key is None or rec.get("kind") != "destroyed":
            return
        inst = str(rec.get("instance_id", ""))
        ts = int(rec.get("ts_us") or 0)
        recv = recv_us if recv_us is not None else ts
        if inst not in self.revoked or self.revoked[inst][0] < ts:
            self.revoked[inst] = (ts, recv)


# What a database already knows (loaded at start): the latest destroyed per instance, the instances seen tagged.
STATE_SQL = {
    "revoked": """
        SELECT instance_id, max(ts_us) AS ts_us, arg_max(coalesce(recv_us, ts_us), ts_us) AS recv_us
        FROM manager_events WHERE kind = 'destroyed' GROUP BY instance_id""",
    "tagged": "SELECT DISTINCT instance_id FROM events_seen WHERE key_id IS NOT NULL AND key_id <> 'manager'",
    "committed": f"""
        SELECT instance_id, boot_id, max(seq) FROM events_seen
        WHERE key_id IS NOT NULL AND key_id <> 'manager' GROUP BY instance_id, boot_id
        QUALIFY row_number() OVER (PARTITION BY instance_id ORDER BY max(ts_us) DESC) <= {COMMITTED_BOOTS}
        ORDER BY instance_id, max(ts_us)""",
}


def load_state(trust: Trust, con: Any) -> None:
    """Fill ``trust`` from a database's tables (``con``: a DuckDB connection whose search path has them)."""
    if trust.config.fleet_key is None:
        return
    for inst, ts, recv in con.execute(STATE_SQL["revoked"]).fetchall():
        trust.revoked[inst] = (int(ts), int(recv))
    trust.tagged.update(r[0] for r in con.execute(STATE_SQL["tagged"]).fetchall())
    for inst, boot, seq in con.execute(STATE_SQL["committed"]).fetchall():
        trust.count(inst, boot, int(seq))
