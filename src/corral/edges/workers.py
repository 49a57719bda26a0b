"""The worker processes of a store as ``corral workers`` and the dashboard's
Workers page show them: rows and held tasks read, assembled by :mod:`corral.core.workers`."""

from __future__ import annotations

import json
from typing import Any

from corral.core.workers import WorkerView, views
from corral.stores.base import Store

#: Worker reports older than this are not shown: that worker is gone.
HEALTH_FRESH_S = 600.0
#: Health reports read (newest first): each worker's newest is among them.
HEALTH_SCAN = 500
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


def health_reports(store: Store) -> dict[str, dict[str, Any]]:
    """Each worker's newest report of what it cannot fix itself (from the
    last :data:`HEALTH_FRESH_S` seconds), by worker id: ``unregistered``
    (``queue:name`` -> pending tasks of a name it does not register) and
    ``abandoned_threads``. One bounded read of the event stream."""
    from corral.engine.heartbeat import HEALTH_EVENT

    try:
        events = store.events(HEALTH_EVENT, limit=HEALTH_SCAN)
    except NotImplementedError:
        return {}
    now = store.now()
    latest: dict[str, dict[str, Any]] = {}
    for e in events:  # newest first: keep each worker's newest report
        if e.subject not in latest and e.at >= now - HEALTH_FRESH_S:
            try:
                data = json.loads(e.data)
            except ValueError:
                continue
            if isinstance(data, dict):
                latest[e.subject] = data
    return latest


def worker_health(store: Store) -> dict[str, Any]:
    """What workers reported in the last minutes and cannot fix themselves:
    pending tasks of names no worker registers (by ``queue:name``, the most
    any worker saw) and timed-out threads still running (summed)."""
    latest = health_reports(store)
    unregistered: dict[str, int] = {}
    for rep in latest.values():
        for key, n in (rep.get("unregistered") or {}).items():
            unregistered[key] = max(unregistered.get(key, 0), int(n))
    return {
        "reporting": len(latest),
        "unregistered": dict(sorted(unregistered.items())),
        "abandoned_threads": sum(int(r.get("abandoned_threads", 0)) for r in latest.values()),
    }


__all__ = ["HEALTH_FRESH_S", "HELD_SCAN", "health_reports", "read_workers", "worker_health"]
