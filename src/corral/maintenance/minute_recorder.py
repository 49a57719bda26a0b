"""The leader's record of each minute (``corral.core.minutes``): after its
sweep, the sweeper's leader writes the figures of every minute that ended
since the last one written (at most the last hour's, the first time or after
a pause), all in one write that also drops the minutes older than a day."""

from __future__ import annotations

import logging

from corral.core.minutes import KEEP, READ_PER_MINUTE, aggregate, minute_of
from corral.stores.base import Store

log = logging.getLogger("corral.sweeper")

#: Minutes a recorder catches up at most (after a start or a long pause).
CATCH_UP = 60


class MinuteRecorder:
    def __init__(self, store: Store):
        self.store = store
        #: the start of the last minute written (None: ask the store)
        self.last: int | None = None

    def tick(self) -> int:
        """Write every minute that ended and is not written yet; how many were."""
        now = self.store.now()
        current = minute_of(now)
        if self.last is None:
            rows = self.store.minute_stats(current - CATCH_UP * 60)
            self.last = max((r.minute for r in rows), default=current - (CATCH_UP + 1) * 60)
        first = max(self.last + 60, current - CATCH_UP * 60)
        # every minute caught up goes in one write: a leader that starts with an
        # hour to catch up must not make sixty commits beside the claims
        rows = []
        minutes = range(first, current, 60)
        for minute in minutes:
            runs = self.store.finished_runs(minute, minute + 60, READ_PER_MINUTE)
            depths: dict[str, int] = {}
            if minute == current - 60:  # the depth is known now only: the minutes caught up have none
                counts = self.store.queue_counts()
                depths = {q: c.get("PENDING", 0) + c.get("RETRYING", 0) for q, c in counts.items()}
            rows.extend(aggregate(minute, runs, depths))
        if not minutes:
            return 0
        self.store.save_minute_stats(rows, now - KEEP)
        self.last = minutes[-1]
        written = len(minutes)
        return written


__all__ = ["MinuteRecorder", "CATCH_UP"]
