"""What a worker knows of the pauses by hand, for work it holds but has not started.

A claim never takes paused work (the store decides, in the claim's
transaction). Work claimed before a pause landed and not started yet (a
prefetched unit, a chunk's later members, a relayed successor) is checked
here before it starts: paused, it goes back to the queue with its attempts
intact. A unit claimed less than :data:`FRESH` seconds ago starts without a
look (its claim obeyed the pauses then); an older one is checked against the
pauses as read at most :data:`FRESH` seconds before, read again on the
slot's own thread when older. So a pause holds for held work within
:data:`FRESH` seconds plus a read, and a worker that runs the units it
claims at once never reads the pauses at all.
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

#: How old the knowledge of the pauses a held task starts under may be (seconds).
FRESH = 0.25


class PauseWatch:
    """The store's pauses, read again when older than ``fresh`` seconds."""

    def __init__(self, store: Store, fresh: float = FRESH):
        self.store = store
        self.fresh = fresh
        self._paused = Paused()
        self._read_at = float("-inf")
        self._lock = threading.Lock()
        self._supported = True

    def holds(self, rec: TaskRecord, claimed: float) -> bool:
        """Is ``rec`` (held, not started, claimed at monotonic ``claimed``)
        held back by a pause now?"""
        now = time.monotonic()
        if not self._supported or now - claimed <= self.fresh:
            return False
        return self._read(now).holds(rec.queue, rec.group, rec.limits)

    def _read(self, now: float) -> Paused:
        with self._lock:
            if now - self._read_at > self.fresh:
                try:
                    self._paused = Paused.of((p.kind, p.name) for p in self.store.pauses())
                    self._read_at = time.monotonic()
                except NotImplementedError:  # a store that keeps no pauses
                    self._supported = False
                except StoreError as exc:  # keep what was read last; the next start looks again
                    log.warning("reading the pauses before a held task's start failed: %s", exc)
            return self._paused
