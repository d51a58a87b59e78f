"""Stage tokens: the mark a stage leaves in the environment of every process it starts, and finding those processes.

The other look at /proc, for the processes that write a file, is flightrec.producer.writers."""

from __future__ import annotations

import os

TOKEN_ENV = "FLIGHTREC_STAGE_TOKEN"  # set in CMD's environment: marks the processes the stage started


def carriers(tokens: set[str], *, first_only: bool = False) -> dict[str, list[int]]:
    """token -> pids of the running processes (not zombies) whose environment carries it, lowest pid first.

    One scan of /proc for all tokens. ``first_only``: stop looking for a token once one carrier was found
    (enough to know it is alive). A process that changed its own environment, or cleared it
    (``env -i``), is not found: the token is inherited, not enforced.
    """
    needles = {f"{TOKEN_ENV}={t}\0".encode(): t for t in tokens}
    found: dict[str, list[int]] = {}
    for pid in sorted(int(p) for p in os.listdir("/proc") if p.isdigit()):
        if first_only and len(found) == len(tokens):
            break
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = f.read() + b"\0"
            hits = [t for n, t in needles.items() if n in env and not (first_only and t in found)]
            if hits:
                with open(f"/proc/{pid}/stat", "rb") as st:
                    if st.read().rsplit(b")", 1)[1].split()[0] == b"Z":
                        continue
                for t in hits:
                    found.setdefault(t, []).append(pid)
        except OSError:
            continue
    return found


def alive_tokens(tokens: set[str]) -> set[str]:
    """Those of ``tokens`` that a running process carries (one a stage started, or its descendants)."""
    return set(carriers(tokens, first_only=True))


def stage_alive(token: str) -> bool:
    """Whether a process carrying the stage's token (one the stage started, or its descendants) still runs."""
    return bool(alive_tokens({token}))
