"""The writers of a followed file: the processes /proc shows holding it open for writing, and naming processes in
a message.

A stage's followed files are written by what it started; those whose environment still carries the stage's token are
found by flightrec.producer.tokens, the others (a daemon that set its own process title over it, one started with
``env -i`` or through ``sudo``) only by what they hold open, here.
"""

from __future__ import annotations

import os

MAX_NAMED = 5  # processes named in a message, the rest counted


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
