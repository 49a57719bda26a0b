"""Why tasks wait, read from a store: the snapshot :func:`corral.core.why.why`
judges, read once for a task or a page of them (``corral why``, the task's
page and the lists of waiting tasks on the dashboard).

Bounded: the limits the tasks name (and their keyed limits), the places held
(one read of the running rows), the breakers, the level, the pauses by hand, the workers' rows
and their newest health reports (the last 500 events of that kind), one seek
per group for its head and one read per WAITING task for its upstream tasks;
never a scan of the history."""

from __future__ import annotations

from collections.abc import Sequence

from corral.core.model import TaskRecord
from corral.core.states import FINAL, State
from corral.core.why import Reason, Snapshot, why
from corral.edges.workers import health_reports
from corral.stores.base import Store


def snapshot(store: Store, tasks: Sequence[TaskRecord]) -> Snapshot:
    """What may hold ``tasks``, read once for all of them."""
    live = [t for t in tasks if t.status not in FINAL]
    names: set[str] = set()
    for t in live:
        names.update(t.limits)
        names.add(t.name)
    gates = store.gate_rows(names) if live else None
    now = gates.now if gates is not None else store.now()
    try:
        workers = store.workers()
    except NotImplementedError:  # a store that keeps no presence rows: who serves is not known
        workers = None
    heads: dict[str, TaskRecord | None] = {}
    for g in sorted({t.group for t in live if t.group is not None}):
        try:
            heads[g] = store.line_head(g)
        except NotImplementedError:
            break
    upstream = {t.id: store.upstream(t.id) for t in live if t.status is State.WAITING}
    unregistered = {
        wid: frozenset((rep.get("unregistered") or {}).keys()) for wid, rep in health_reports(store).items()
    }
    level = store.fleet_level().level if live else 0
    try:
        pauses = store.pauses() if live else []
    except NotImplementedError:  # a store that keeps no pauses: none holds
        pauses = []
    return Snapshot(now, gates, level, workers, heads, upstream, unregistered, pauses)


def explain(store: Store, tasks: Sequence[TaskRecord]) -> dict[int, list[Reason]]:
    """Each task's reasons (main first), from one shared snapshot."""
    snap = snapshot(store, tasks)
    return {t.id: why(t, snap) for t in tasks}


def explain_one(store: Store, task: TaskRecord) -> list[Reason]:
    return explain(store, [task])[task.id]


__all__ = ["explain", "explain_one", "snapshot"]
