"""Events from the manager's side: a controller publishes decisions about an instance from its own spool."""

from __future__ import annotations

import logging
import socket
from collections.abc import Mapping
from pathlib import Path

from flightrec.producer.agent import SyncAgent
from flightrec.producer.names import safe_name
from flightrec.producer.spoolfolder import SpoolFolder
from flightrec.schemas import MANAGER_KINDS, ManagerEvent, new_event_id, now_us

from flightrec.errors import ConfigError, CredentialError
from flightrec.settings import Settings

log = logging.getLogger(__name__)


# Kinds after which this source says nothing more about the instance: its spool folder there is removed once
# delivered (an id rented again starts a new one).
ENDS = ("destroyed", "forgotten")


def default_source() -> str:
    """The source id a manager uses when none is given: manager@<host name>."""
    return f"manager@{socket.gethostname()}"


def manager_spool(settings: Settings, source: str) -> Path:
    """The manager source's own spool root: <spool>/manager/<quoted source id>, apart from every agent's."""
    return Path(settings.spool) / "manager" / safe_name(source)


def send_manager_event(
    settings: Settings,
    instance: str,
    kind: str,
    detail: str = "",
    attributes: Mapping[str, str] | None = None,
    source: str | None = None,
    timeout: float | None = None,
) -> tuple[ManagerEvent, bool]:
    """Spool one ManagerEvent about ``instance`` and wait up to the flush timeout for Kafka.

    Returns (the event, whether Kafka acknowledged it). Its boot_id and seq are the
    manager source's own (one boot per source and instance), so the instance's boots
    and their completeness never see it; it is keyed by the instance id, so it sits in
    the instance's partition. What Kafka did not acknowledge stays in the manager's spool.
    """
    if kind not in MANAGER_KINDS:
        raise ConfigError(f"--kind {kind!r} is not one of {', '.join(MANAGER_KINDS)}")
    if not instance:
        raise ConfigError("a manager event needs --instance ID: the instance it is about")
    source = source or default_source()
    agent = SyncAgent(instance_id=instance, settings=settings, spool_dir=str(manager_spool(settings, source)))
    with agent:
        cap = settings.max_line
        text = agent.redactor.text(detail)[:cap]
        attrs = {k[:cap]: v[:cap] for k, v in agent.redactor.mapping(dict(attributes or {})).items()}
        eid, ts = new_event_id(), now_us()

        def make(boot: str, seq: int) -> ManagerEvent:
            return ManagerEvent(
                event_id=eid,
                instance_id=instance,
                boot_id=boot,
                seq=seq,
                ts_us=ts,
                source_id=source,
                kind=kind,
                detail=text,
                attributes=attrs,
            )

        agent.spool.files.mark_ended(kind in ENDS)
        event = agent.emit_makers([make])[0]
        ok = agent.close(timeout)
    denied = agent.deliverer.denied if agent.deliverer is not None and not ok else None
    if denied is not None:  # no retry changes it: the manager is told now, not after each timeout
        raise CredentialError(
            f"{denied}; the {kind} event about {instance} stays spooled in {agent.spool.dir}: deliver it with "
            f"`flightrec agent flush --all --spool {manager_spool(settings, source)}` and a credential that may write"
        )
    if not ok:
        log.warning(
            "manager event %s about %s is spooled in %s but not yet acknowledged; deliver it with "
            "`flightrec agent flush --all --spool %s`",
            kind,
            instance,
            agent.spool.dir,
            manager_spool(settings, source),
        )
    if ok:
        remove_if_ended(manager_spool(settings, source), instance)
    return event, ok


def remove_if_ended(root: Path, instance: str) -> bool:
    """Remove the manager's spool folder of ``instance`` under ``root`` when its last event destroyed or forgot the
    instance and Kafka acknowledged everything in it (a folder kept per instance for ever otherwise)."""
    from flightrec.producer.spool import Spool

    folder = SpoolFolder.of(root, instance)
    if not folder.is_ended():
        return False
    removed = Spool(root, instance).remove_if_delivered()
    if removed:
        log.info("removed the delivered manager spool folder of %s (%s)", instance, folder.path)
    return removed
