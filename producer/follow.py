"""Follow a file by name like ``tail -F``: from its end if it exists, read on through truncation and rotation."""

from __future__ import annotations

import logging
import os
import stat
from typing import BinaryIO

log = logging.getLogger(__name__)

CHUNK = 1 << 20


class FileFollower:
    """Reads whatever is appended to the file at ``path`` from where the stage finds it.

    Guarantees: a file that already exists when following starts is read from its
    end (only what the stage adds is shipped: no line of an earlier stage twice, no
    stale tail); a file that does not exist yet is waited for (``exists`` stays
    False until it appears) and read from its first byte; when the file is truncated
    (copytruncate) reading restarts at its new start; when it is rotated (renamed or
    deleted and created anew) the old file is read to its end first, then the new one
    from its start. A special file (FIFO, device, socket) is never opened nor read,
    so it can never block (``last_error`` says so). Never raises for a missing or
    unreadable file (``last_error`` says why).
    """

    def __init__(self, path: str, *, from_end: bool = True) -> None:
        self.path = path
        self.exists = False
        self.rotations = 0
        self.truncations = 0
        self.last_error: str | None = None
        self._f: BinaryIO | None = None
        self._ino: tuple[int, int] | None = None
        self._offset = 0
        self._from_end = from_end
        self._until: tuple[tuple[int, int] | None, int] | None = None
        self.done = False  # stopped at another follower's claim: nothing more to read here
        if from_end:  # the end is taken now, when the stage starts: what it writes from here on is read
            self._open()
        self._from_end = False

    def _open(self) -> bool:
        from_end, self._from_end = self._from_end, False
        try:
            st = os.stat(self.path)
            if not stat.S_ISREG(st.st_mode):
                if self.last_error is None:
                    log.warning("%s is not a regular file (a FIFO or a device); it is not followed", self.path)
                self.last_error = "not a regular file: not followed"
                self.exists = True
                return False
            fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except FileNotFoundError:
            return False
        except OSError as exc:
            self.last_error = str(exc)
            return False
        f = os.fdopen(fd, "rb")
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):  # replaced by a special file between stat and open
            f.close()
            return False
        self._f, self._ino, self._offset = f, (st.st_dev, st.st_ino), 0
        if from_end:
            self._offset = f.seek(0, os.SEEK_END)
        self.exists = True
        return True

    def state(self) -> tuple[int | None, int, tuple[int, int] | None]:
        """(open fd or None, offset read to, (dev, inode)): what :meth:`resume` needs in another process."""
        return (self._f.fileno() if self._f is not None else None), self._offset, self._ino

    def resume(self, fd: int | None, offset: int, ino: tuple[int, int] | None, exists: bool) -> None:
        """Go on from another follower's :meth:`state` (``fd`` passed to this process)."""
        self._from_end = False
        self.exists = exists
        if fd is not None:
            self._f = os.fdopen(fd, "rb")
            self._f.seek(offset)
            self._offset, self._ino = offset, ino

    def _drain(self, out: list[bytes], budget: int) -> int:
        assert self._f is not None
        got = 0
        while got < budget:
            data = self._f.read(min(CHUNK, budget - got))
            if not data:
                break
            out.append(data)
            got += len(data)
            self._offset += len(data)
        return got

    def stop_at(self, ino: tuple[int, int] | None, offset: int) -> None:
        """Another follower took this file over from ``offset`` of file ``ino``: the next poll reads up to
        there (all of this file when it is another one) and the follower is ``done``."""
        self._until = (ino, offset)

    def _final_poll(self) -> list[bytes | None]:
        assert self._until is not None
        ino, offset = self._until
        out: list[bytes] = []
        if self._f is not None:
            if ino == self._ino:
                while self._offset < offset and self._drain(out, offset - self._offset):
                    pass
            else:
                while self._drain(out, 8 * CHUNK):
                    pass
        self.done = True
        return list(out)

    def poll(self, budget: int = 8 * CHUNK) -> list[bytes | None]:
        """New bytes since the last call (about ``budget`` at most); ``None`` marks where a new file begins.

        At a ``None`` the caller ends any unfinished line of the old file (rotation or truncation).
        """
        if self.done:
            return []
        if self._until is not None:
            return self._final_poll()
        out: list[bytes | None] = []
        if self._f is None and not self._open():
            return out
        got = self._drain(out, budget)  # type: ignore[arg-type]  # out holds bytes and None (a rotation mark); _drain appends bytes only
        if got >= budget:
            return out
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return out  # deleted or being rotated: keep the old one open until a new one appears
        except OSError as exc:
            self.last_error = str(exc)
            return out
        if (st.st_dev, st.st_ino) != self._ino:
            got += self._drain(out, budget)  # type: ignore[arg-type]  # the old file's last words
            assert self._f is not None
            self._f.close()
            self._f = None
            self.rotations += 1
            log.debug("%s was rotated; following the new file", self.path)
            out.append(None)
            if self._open():
                self._drain(out, max(CHUNK, budget - got))  # type: ignore[arg-type]  # out holds bytes and None (a rotation mark); _drain appends bytes only
            return out
        if st.st_size < self._offset:
            self.truncations += 1
            log.debug("%s was truncated; reading from its start", self.path)
            assert self._f is not None
            self._f.seek(0)
            self._offset = 0
            out.append(None)
            self._drain(out, max(CHUNK, budget - got))  # type: ignore[arg-type]  # out holds bytes and None (a rotation mark); _drain appends bytes only
        return out

    def close(self) -> None:
        """Close the file (following ends)."""
        if self._f is not None:
            self._f.close()
            self._f = None
