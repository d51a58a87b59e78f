"""The operating figures of a database, as `flightrec status` prints them and the materializer's /health serves them:
when it last committed, how far its input is read, its dead letters, the agent versions seen, its instances by
status, its disk. The SQL runs on any flightrec database (a file, live, or a lake); the judgement is pure."""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BEHIND_AFTER_S = 30.0  # consumers/progress.py: the input is behind when last caught up longer ago than this
QUIET_COMMIT_S = 600.0  # no commit for this long: said (an idle fleet commits nothing; a stopped materializer too)
LOW_DISK_FRACTION = 0.10  # less free than this on the database's disk: said

# One row of figures (a single statement: one round trip live). materializer_progress may be missing from a
# database no materializer of this version has opened (then its figures read NULL: see figures_sql()).
FIGURES = """
SELECT (SELECT max(last_commit_us) FROM materializer_runs) AS last_commit_us,
       (SELECT arg_max(mode, last_commit_us) FROM materializer_runs) AS last_mode,
       {progress} AS caught_up_us,
       (SELECT count(*) FROM dead_letters) AS dead_letters,
       (SELECT count(*) FROM instances) AS instances"""
PROGRESS = "(SELECT max(caught_up_us) FROM materializer_progress)"
VERSIONS = """
SELECT coalesce(attributes['agent_version'], 'unknown') AS version, count(DISTINCT instance_id) AS instances,
       max(ts_us) AS last_us
FROM instance_facts GROUP BY ALL ORDER BY last_us DESC"""
OFFSETS = 'SELECT consumer_group, topic, "partition", next_offset FROM consumer_offsets'
STATUSES = "SELECT status, count(*) AS n FROM instance_status GROUP BY ALL ORDER BY n DESC"


def figures_sql(has_progress: bool = True) -> str:
    return FIGURES.format(progress=PROGRESS if has_progress else "CAST(NULL AS BIGINT)")


@dataclass(frozen=True)
class Health:
    """What an operator asks first; ``problems`` says what is wrong, in words (empty: healthy)."""

    last_commit_us: int | None = None
    caught_up_us: int | None = None
    dead_letters: int = 0
    instances: int = 0
    lag_messages: int | None = None  # None: Kafka not asked, or it did not answer
    disk_free_bytes: int | None = None
    disk_total_bytes: int | None = None
    versions: tuple[tuple[str, int], ...] = ()  # (agent version, instances), newest first
    statuses: tuple[tuple[str, int], ...] = ()
    disk_full_since_us: int | None = None  # the materializer waits for disk space since then (db/markers.py)
    problems: tuple[str, ...] = field(default=())

    def as_dict(self) -> dict[str, Any]:
        return {
            "ok": not self.problems,
            "problems": list(self.problems),
            "last_commit_us": self.last_commit_us,
            "caught_up_us": self.caught_up_us,
            "lag_messages": self.lag_messages,
            "dead_letters": self.dead_letters,
            "instances": self.instances,
            "disk_free_bytes": self.disk_free_bytes,
            "disk_total_bytes": self.disk_total_bytes,
            "disk_full_since_us": self.disk_full_since_us,
            "agent_versions": dict(self.versions),
            "statuses": dict(self.statuses),
        }


def ago(us: int | None, now_us: int) -> str:
    """'42 s ago', '4 min ago', 'never'."""
    if us is None:
        return "never"
    s = max(0, (now_us - us) // 1_000_000)
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if s >= 2 * size:
            return f"{s // size} {unit} ago"
    return f"{s} s ago"


def judge(h: Health, now_us: int, serving: bool | None = None) -> tuple[str, ...]:
    """The problems an operator must hear about (pure). ``serving``: whether a materializer is known to run."""
    out = []
    if serving is False:
        out.append("no materializer is running on this database")
    if h.caught_up_us is None:
        out.append("its input was never recorded caught up (no materializer of this version has read it to the end)")
    elif now_us - h.caught_up_us > BEHIND_AFTER_S * 1e6:
        out.append(
            f"its input was last caught up {ago(h.caught_up_us, now_us)} (behind: more than {BEHIND_AFTER_S:g} s); "
            "no instance turns lost meanwhile"
        )
    if h.disk_full_since_us is not None:
        out.append("the materializer is " + disk_full_line(h.disk_full_since_us, now_us, serving))
    free, total = h.disk_free_bytes, h.disk_total_bytes
    if free is not None and total and free < LOW_DISK_FRACTION * total:
        out.append(f"the database's disk is {100 * (1 - free / total):.0f}% full")
    return tuple(out)


def disk_full_line(since_us: int, now_us: int, serving: bool | None = None) -> str:
    """The materializer stopped on a full disk (its marker, db/markers.py), in words that follow "the materializer
    is". ``serving`` False: the marker of a run that ended during the wait."""
    since = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(since_us / 1e6)) + f" ({ago(since_us, now_us)})"
    if serving is False:
        return (
            f"stopped on a full disk since {since} and no longer runs (free space, then start it: it reads again "
            "what it held; nothing is lost)"
        )
    return f"stopped, disk full since {since} (free space: it resumes by itself; nothing is lost)"


def disk(path: str | os.PathLike[str]) -> tuple[int | None, int | None]:
    """(free, total) bytes of the disk holding ``path`` (its nearest existing folder); (None, None) if unknown."""
    p = Path(path).absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    try:
        usage = shutil.disk_usage(p)
    except OSError:
        return None, None
    return usage.free, usage.total


def lag(ends: Mapping[tuple[str, int], int], committed: Mapping[tuple[str, int], int]) -> int:
    """Messages in Kafka beyond what the database holds, summed over the partitions."""
    return sum(max(0, end - committed.get(tp, 0)) for tp, end in ends.items())
