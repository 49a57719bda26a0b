"""Wake a waiting thread when a file is written, with Linux inotify.

An idle SQLite worker learns of a commit by another process from the
database's ``data_version``, which only changes when it looks. Looking every
millisecond cost an idle worker process about 6 % of a core, and a task
submitted to it waited half a millisecond on average before it was seen.
Every commit writes the WAL file (or, outside WAL mode, the database file),
so a thread can sleep on an inotify descriptor watching the file's directory
and look only when one of those files was written. Where inotify is missing
(not Linux) or refused (its per-user limits), :func:`open_watch` returns
None and the caller polls as before.

A wake says a file was written, not that a commit shows yet: SQLite makes a
commit visible by updating its ``-shm`` index in shared memory, after the WAL
writes, and that raises no event. The SQLite store's wait looks again for a
moment after a wake that shows no change (``SQLiteStore.wait_for_work``).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import select
import struct
import time
from collections.abc import Collection

IN_MODIFY = 0x00000002
IN_CREATE = 0x00000100
IN_MOVED_TO = 0x00000080
IN_NONBLOCK = 0o4000
IN_CLOEXEC = 0o2000000
_EVENT = struct.Struct("iIII")  # wd, mask, cookie, len; then len bytes of name
BROKEN_SLICE = 0.001  # how long a broken watch sleeps before "look anyway"

_libc: ctypes.CDLL | None | bool = False  # False: not looked up yet


def _load() -> ctypes.CDLL | None:
    global _libc
    if _libc is False:
        try:
            lib = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
            _libc = lib if hasattr(lib, "inotify_init1") else None
        except OSError:
            _libc = None
    return _libc  # type: ignore[return-value]


class FileWatch:
    """One inotify descriptor on a directory, for the files named ``names``.

    One per waiting thread: threads sharing a descriptor would race to
    drain it."""

    def __init__(self, fd: int, names: frozenset[bytes]):
        self._fd = fd
        self._names = names
        self.broken = False
        self._poll = select.poll()
        self._poll.register(fd, select.POLLIN)

    def wait(self, timeout: float) -> bool:
        """Sleep until one of the files is written or ``timeout`` passes;
        True if one was written (or the watch broke: look anyway).

        A broken watch (closed descriptor, failed read) still sleeps a
        polling slice, so a caller looping on it polls instead of spinning
        a core until its deadline."""
        if not self.broken:
            try:
                # poll, not select: select refuses a descriptor numbered 1024
                # or more, which a process with many files open hands out
                ready = self._poll.poll(max(0.0, timeout) * 1000.0)
            except (OSError, ValueError):
                self.broken = True
            else:
                if not ready:
                    return False
                hit = self._drain()
                if hit or not self.broken:
                    return hit
        time.sleep(min(BROKEN_SLICE, max(0.0, timeout)))
        return True

    def _drain(self) -> bool:
        hit = False
        while True:
            try:
                buf = os.read(self._fd, 65536)
            except BlockingIOError:
                return hit
            except OSError:
                self.broken = True
                return False
            if not buf:
                self.broken = True
                return False
            pos = 0
            while pos + _EVENT.size <= len(buf):
                _, _, _, length = _EVENT.unpack_from(buf, pos)
                name = buf[pos + _EVENT.size : pos + _EVENT.size + length].rstrip(b"\0")
                hit = hit or name in self._names
                pos += _EVENT.size + length

    def close(self) -> None:
        try:
            os.close(self._fd)
        except OSError:  # pragma: no cover - closing is best effort
            pass


def open_watch(directory: str, names: Collection[str]) -> FileWatch | None:
    """A watch for writes to ``names`` in ``directory``, or None where
    inotify is not available (the caller then polls)."""
    libc = _load()
    if libc is None:
        return None
    fd = libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
    if fd < 0:
        return None
    # the directory, not the files: the WAL file is removed and made again
    wd = libc.inotify_add_watch(fd, os.fsencode(directory), IN_MODIFY | IN_CREATE | IN_MOVED_TO)
    if wd < 0:
        os.close(fd)
        return None
    return FileWatch(fd, frozenset(os.fsencode(n) for n in names))
