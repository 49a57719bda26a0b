"""The worker processes of a store as ``corral workers`` and the dashboard's
Workers page show them: rows and held tasks read, assembled by :mod:`corral.core.workers`."""

from __future__ import annotations

from corral.core.workers import WorkerView, views
from corral.stores.base import Store

#: Held tasks read, all workers together: past it the last workers' lists are
#: cut (their slots say how many they run).
HELD_SCAN = 5000


def read_workers(store: Store) -> tuple[float, list[WorkerView]]:
    """The store's time and its workers, dead ones first."""
    now = store.now()
    try:
        rows = store.workers()
    except NotImplementedError:
        rows = []
    held = store.held_tasks(limit=HELD_SCAN)  # one read of the index of held rows
    return now, views(rows, held, now)


__all__ = ["read_workers", "HELD_SCAN"]
