"""The worker processes of a store as ``corral workers`` and the dashboard's
Workers page show them: rows and held tasks read, assembled by :mod:`corral.core.workers`."""

from __future__ import annotations

from corral.core.model import TaskFilter
from corral.core.states import State
from corral.core.workers import WorkerView, views
from corral.stores.base import Store

#: Held tasks read per state: past it a worker's list is cut (its slots say how many it runs).
HELD_SCAN = 5000


def read_workers(store: Store) -> tuple[float, list[WorkerView]]:
    """The store's time and its workers, dead ones first."""
    now = store.now()
    try:
        rows = store.workers()
    except NotImplementedError:
        rows = []
    held = []
    for state in (State.RUNNING, State.RESERVED):
        held += store.list_tasks(TaskFilter(status=state, limit=HELD_SCAN, newest_first=False))
    return now, views(rows, held, now)


__all__ = ["read_workers", "HELD_SCAN"]
