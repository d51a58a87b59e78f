"""Follow claims: the stage that follows a file now makes a leftover late-output follower of it stop where it began."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass

from flightrec.producer.spoolfolder import SpoolFolder

log = logging.getLogger(__name__)

# Two stages of one boot may follow the same file: the benchmark starts the GPU daemon and
# follows its log, the supervisor follows the same log while that daemon (left behind by the
# benchmark, so followed on by the benchmark's late-output process) goes on writing. Each
# byte must be shipped once: a stage that starts following a file writes a claim (the file's
# identity and the offset it starts from) into the boot's spool; a late-output process of an
# earlier stage that sees someone else's claim reads up to that offset and stops following.


@dataclass(frozen=True)
class Claim:
    """Who follows ``path`` from where: the stage's token, the file's (dev, inode), the offset it starts at."""

    token: str
    ino: tuple[int, int] | None
    offset: int


def write_claim(folder: SpoolFolder, boot_id: str, path: str, claim: Claim) -> None:
    """Record that the stage of ``claim.token`` follows ``path`` from here on (never raises)."""
    text = json.dumps({"token": claim.token, "ino": list(claim.ino) if claim.ino else None, "offset": claim.offset})
    try:
        folder.write_claim(boot_id, path, text)
    except OSError as exc:
        log.warning(
            "cannot record that this stage follows %s (%s); an earlier stage's leftover may ship its new lines too",
            path,
            exc,
        )


def read_claim(folder: SpoolFolder, boot_id: str, path: str) -> Claim | None:
    """The latest claim on ``path`` in this boot, or None."""
    try:
        data = json.loads(folder.read_claim(boot_id, path))
        ino = tuple(data["ino"]) if data.get("ino") else None
        return Claim(str(data["token"]), ino, int(data["offset"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None
