"""A materializer on a full disk: it holds the batch it could not commit, takes no more, says so, and goes on by itself
when there is room again. Nothing is lost (the batch is committed whole once it fits; what it did not read yet stays
in Kafka) and nothing doubles (a commit is all or nothing, and stored event ids are dropped).

While the disk is full (the database file's, or a lake's data path) the guard:
- says so in one line (the cause, what is held, that nothing is lost), once per episode, and again when it resumes;
- sets ``flightrec_disk_full`` on /metrics (consumers/storefigures.py);
- leaves an empty file ``<db>.disk-full`` beside a database file (an empty file needs no data block, so it can be
  made on a full disk), which the dashboard shows as a banner (analytics/ui.py) and removes when done;
- posts one message to the webhook (``FLIGHTREC_WEBHOOK``) straight away (the alerts' outbox is a table in the
  full database) and one when it resumes;
- tries the commit again after 1 s, doubling to 30 s; where DuckDB invalidated the database (a checkpoint that
  could not write), the store is opened again first.
SIGTERM or Ctrl-C during the wait ends the run (exit 1): the held batch is read again at the next start.
"""

from __future__ import annotations

import asyncio
import errno
import json
import logging
import shutil
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

from flightrec.consumers import webhook
from flightrec.consumers.storefigures import StoreFigures
from flightrec.db.markers import disk_full_path

from flightrec.errors import MaterializeError

log = logging.getLogger(__name__)
T = TypeVar("T")
FIRST_PAUSE_S = 1.0
MAX_PAUSE_S = 30.0
_FULL = ("no space left on device", "disk quota exceeded", "disk full")


def _chain(exc: BaseException | None) -> list[BaseException]:
    out: list[BaseException] = []
    while exc is not None and all(exc is not e for e in out):
        out.append(exc)
        exc = exc.__cause__ or exc.__context__
    return out


def is_disk_full(exc: BaseException) -> bool:
    """Whether an error (or one it came from) says a disk is full: ENOSPC, EDQUOT, or DuckDB's text of them."""
    for e in _chain(exc):
        if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if any(word in str(e).lower() for word in _FULL):
            return True
    return False


def needs_reopen(exc: BaseException) -> bool:
    """Whether DuckDB invalidated the database (a fatal error, e.g. a checkpoint that could not write): it must be
    opened again before it can be used."""
    return any("invalidated" in str(e).lower() or type(e).__name__ == "FatalException" for e in _chain(exc))


def marker_path(db: str | Path) -> Path:
    """The empty file beside a database file that says its materializer waits for disk space."""
    return disk_full_path(db)


def free_bytes_at(where: str | Path | None) -> int | None:
    """Free bytes of the file system holding ``where`` (a file or folder; the nearest existing parent)."""
    if where is None or "://" in str(where):
        return None
    path = Path(where)
    while not path.exists() and path != path.parent:
        path = path.parent
    try:
        return shutil.disk_usage(path).free
    except OSError:
        return None


class DiskFullGuard:
    """Commits through :meth:`commit`, which waits out a full disk (see the module's doc)."""

    def __init__(
        self,
        where: str,
        *,
        marker: Path | None = None,
        space_of: str | Path | None = None,
        webhook_url: str | None = None,
        figures: StoreFigures | None = None,
        timeout: float = 10.0,
    ) -> None:
        self.where = where  # the database, for messages
        self.marker = marker
        self.space_of = space_of  # the folder whose file system fills
        self.webhook_url = webhook_url
        self.figures = figures
        self.timeout = timeout
        self.full_since: float | None = None
        self.episodes = 0
        self.posts: list[threading.Thread] = []

    async def commit(
        self,
        attempt: Callable[[], Awaitable[T]],
        reopen: Callable[[], Awaitable[None]],
        stop: asyncio.Event,
        held: str,
        settle: bool = True,
    ) -> T:
        """``attempt()`` until it does not fail for want of space; ``reopen()`` first where DuckDB requires it.
        ``held`` says what waits (for messages). MaterializeError when ``stop`` is set meanwhile. ``settle=False``:
        a step on the way (the store opened again), whose success does not end the wait (the held batch's does)."""
        pause, reopen_first = FIRST_PAUSE_S, False
        while True:
            try:
                if reopen_first:
                    await reopen()
                    reopen_first = False
                result = await attempt()
            except Exception as exc:
                if not (is_disk_full(exc) or (self.full_since is not None and needs_reopen(exc))):
                    raise
                reopen_first = reopen_first or needs_reopen(exc)
                self._full(exc, held)
                try:
                    await asyncio.wait_for(stop.wait(), pause)
                except TimeoutError:
                    pause = min(MAX_PAUSE_S, pause * 2)
                    continue
                raise MaterializeError(
                    f"stopped while the disk of {self.where} was full: the held {held} was not committed and is read "
                    "again from Kafka at the next start (nothing is lost)"
                ) from exc
            if settle:
                self._room_again()
            return result

    def _full(self, exc: BaseException, held: str) -> None:
        if self.full_since is not None:
            log.debug("still no room on %s: %s", self.where, exc)
            return
        self.full_since = time.monotonic()
        self.episodes += 1
        free = free_bytes_at(self.space_of)
        cause = " ".join(str(exc).split())[:300]
        log.error(
            "the disk of %s is full (%s%s): holding the %s, taking no more; nothing is lost (Kafka keeps what is not "
            "committed); going on by itself when there is room",
            self.where,
            cause,
            f"; {free:,} bytes free" if free is not None else "",
            held,
        )
        if self.figures is not None:
            self.figures.update(disk_full=True)
        if self.marker is not None:
            try:
                self.marker.touch()
            except OSError as err:
                log.debug("cannot leave %s: %s", self.marker, err)
        self._post(
            f"flightrec: the disk of {self.where} is full: the materializer holds its batch and takes no more "
            "(nothing is lost); it goes on by itself when there is room",
            "full",
        )

    def _room_again(self) -> None:
        if self.full_since is None:
            return
        waited = time.monotonic() - self.full_since
        self.full_since = None
        log.warning("room again on %s after %.0f s: the held batch is committed; taking batches on", self.where, waited)
        if self.figures is not None:
            self.figures.update(disk_full=False)
        if self.marker is not None:
            self.marker.unlink(missing_ok=True)
        self._post(f"flightrec: room again on {self.where} after {waited:.0f} s: the materializer goes on", "resumed")

    def _post(self, text: str, kind: str) -> None:
        """One message to the webhook, in a thread of its own (never waited for)."""
        url = self.webhook_url
        if not url:
            return
        alert_id = f"disk-{kind}-{self.where}-{self.episodes}-{time.time_ns()}"
        body = json.dumps({"text": text, "flightrec": {"kind": f"disk_{kind}", "alert_id": alert_id}}).encode()

        def send() -> None:
            result = webhook.post(url, body, webhook.idempotency_key(alert_id), self.timeout)
            if result.outcome != webhook.DELIVERED:
                log.warning("the disk-%s alert was not delivered: %s %s", kind, result.outcome, result.why)

        thread = threading.Thread(target=send, name="flightrec-disk-alert", daemon=True)
        thread.start()
        self.posts.append(thread)
