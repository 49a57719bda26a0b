"""Following a store's event stream: one loop over :meth:`Store.read_events`,
shared by ``App.events()``, ``corral events`` and the dashboard.

A reader holds the store's cursor (a position in the stream, never a time),
so it sees each event once, in commit order, however many processes write;
between reads it waits on :meth:`Store.wait_for_events` (a notification on
PostgreSQL, a condition in memory, a cheap look at the newest id on SQLite).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Iterator

from corral.core.events import check_kinds
from corral.stores.base import Event, Store

#: Events read per round trip.
PAGE = 500
#: The longest single wait, so a stop request is seen this soon.
WAIT = 0.5


def iter_events(
    store: Store,
    *,
    follow: bool = False,
    kinds: Iterable[str] | str | None = None,
    since: int | None = None,
    stop: threading.Event | None = None,
    timeout: float | None = None,
) -> Iterator[Event]:
    """Events of ``store`` in stream order.

    ``since``: the id of the last event already seen (0: from the oldest
    kept). Without it, a follower starts at the present and gets only new
    events, and a plain read (``follow=False``) gets every event kept.
    ``follow`` keeps waiting for new events until ``stop`` is set or
    ``timeout`` seconds pass without one; ``kinds`` keeps only those kinds.
    """
    wanted = check_kinds(kinds)
    # the starting point is taken now, not at the first next(): "new events"
    # means those after this call
    cursor = store.event_cursor(since if since is not None or follow else 0)
    return _follow(store, cursor, wanted, follow, stop, timeout)


def _follow(
    store: Store,
    cursor: object,
    wanted: frozenset[str] | None,
    follow: bool,
    stop: threading.Event | None,
    timeout: float | None,
) -> Iterator[Event]:
    quiet_since = time.monotonic()
    while True:
        batch, cursor = store.read_events(cursor, PAGE)
        for ev in batch:
            if wanted is None or ev.kind in wanted:
                yield ev
        if batch:
            quiet_since = time.monotonic()
        if len(batch) == PAGE:
            continue
        if not follow or (stop is not None and stop.is_set()):
            return
        wait = WAIT
        if timeout is not None:
            left = timeout - (time.monotonic() - quiet_since)
            if left <= 0:
                return
            wait = min(wait, left)
        store.wait_for_events(wait)
        if stop is not None and stop.is_set():
            return
