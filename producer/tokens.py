"""Stage tokens: the mark a stage leaves in the environment of every process it starts, and finding those processes."""

from __future__ import annotations

import os

TOKEN_ENV = "FLIGHTREC_STAGE_TOKEN"  # set in CMD's environment: marks the processes the stage started
MAX_NAMED = 5  # processes named in a message, the rest counted


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


def writers(paths: set[str]) -> dict[str, list[int]]:
    """path -> pids of the running processes that hold it open for writing (``/proc/PID/fd`` and its ``fdinfo``
    flags): the writers of a followed file, also those whose environment no longer shows the stage's token (a
    daemon that set its own process title over it, one started with ``env -i`` or through ``sudo``)."""
    real = {os.path.realpath(p): p for p in paths}
    found: dict[str, list[int]] = {}
    if not real:
        return found
    for pid in sorted(int(p) for p in os.listdir("/proc") if p.isdigit()):
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            path = real.get(target)
            if path is None:
                continue
            try:
                with open(f"/proc/{pid}/fdinfo/{fd}") as f:
                    flags = next((int(line.split()[1], 8) for line in f if line.startswith("flags:")), 0)
            except (OSError, ValueError):
                continue
            if flags & os.O_ACCMODE in (os.O_WRONLY, os.O_RDWR) and pid not in found.get(path, []):
                found.setdefault(path, []).append(pid)
    return found


def describe(pids: list[int]) -> str:
    """'pid 12 (sh daemon.sh /var/log/d.log), pid 13 (sleep 4)' for the first few, then 'and N more'."""
    named = []
    for pid in pids[:MAX_NAMED]:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().rstrip(b"\0").split(b"\0")
        except OSError:
            continue
        cmd = " ".join(
            os.path.basename(a) if i == 0 else a
            for i, a in enumerate(x.decode("utf-8", "backslashreplace") for x in argv if x)
        )
        named.append(f"pid {pid} ({cmd[:120]})" if cmd else f"pid {pid}")
    more = len(pids) - MAX_NAMED
    return ", ".join(named) + (f" and {more} more" if more > 0 else "")
