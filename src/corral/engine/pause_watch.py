"""What a worker knows of the pauses by hand, for work it holds but has not started.

A claim never takes paused work (the store decides, in the claim's
transaction). Work claimed before a pause landed and not started yet (a
prefetched unit, a chunk's later members, a relayed successor) is checked
here before it starts: paused, it goes back to the queue with its attempts
intact. The pauses are read from the store at most every
:data:`LOOK_EVERY` seconds, and only when such a start comes, so a worker
running single claimed tasks never reads them.
"""

from __future__ import annotations

import logging
import threading
import time

from corral.core.model import TaskRecord
from corral.core.pauses import Paused
from corral.errors import StoreError
from corral.stores.base import Store

log = logging.getLogger("corral.worker")

#: How old the pauses a held task's start is checked against may be (seconds).
LOOK_EVERY = 0.05


class PauseWatch:
    """The store's pauses, read again when older than :data:`LOOK_EVERY`."""

    def __init__(self, store: Store, look_every: float = LOOK_EVERY):
        self.store = store
        self.look_every = look_every
        self._paused = Paused()
        self._read_at = float("-inf")
        self._lock = threading.Lock()
        self._supported = True

    def paused(self) -> Paused:
        """The pauses in force, as of at most ``look_every`` ago (a store
        that cannot be read keeps the last ones read)."""
        if not self._supported:
            return self._paused
        with self._lock:
            now = time.monotonic()
            if now - self._read_at >= self.look_every:
                try:
                    self._paused = Paused.of((p.kind, p.name) for p in self.store.pauses())
                except NotImplementedError:
                    self._supported = False
                except StoreError as exc:
                    log.warning("reading the pauses before a held task's start failed: %s", exc)
                self._read_at = now
            return self._paused

    def holds(self, rec: TaskRecord) -> bool:
        """Is ``rec`` (held, not started) held back by a pause now?"""
        return self.paused().holds(rec.queue, rec.group, rec.limits)
