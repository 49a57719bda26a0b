"""Testing your own tasks: a fake clock, a run-everything-now helper, and assertions.

::

    from corral.testing import FakeClock, assert_enqueued, run_until_idle

    def test_sync_retries_then_succeeds():
        clock = FakeClock()
        app = make_app("memory://", clock=clock)     # your App, on a fake clock
        sync_sku.submit("A1", group="merchant-1")
        assert_enqueued(sync_sku, args=["A1"], group="merchant-1")
        done = run_until_idle(app)                  # backoff waits pass on the fake clock
        assert [r.status.value for r in done] == ["SUCCESS"]

``run_until_idle`` runs a real worker in this process, so tasks run exactly
as in production (groups, limits, retries, timeouts); only time is fake:
whenever nothing is left to run now, the clock jumps to the next task due.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from corral.core.clock import FakeClock
from corral.core.model import Outcome, TaskFilter, TaskRecord
from corral.core.states import FINAL, QUEUED, State
from corral.engine.hooks import Hooks

if TYPE_CHECKING:
    from corral.app import App, TaskDef

__all__ = ["FakeClock", "run_until_idle", "assert_enqueued", "enqueued", "fire_ticks"]


class _Finished(Hooks):
    """Task ids in the order their final outcome was written."""

    def __init__(self) -> None:
        self.ids: list[int] = []
        self._lock = threading.Lock()

    def on_outcomes(self, outcomes: Sequence[Outcome], applied: Sequence[bool]) -> None:
        with self._lock:
            self.ids += [o.task_id for o, ok in zip(outcomes, applied) if ok and o.status in FINAL]


def _next_due(app: App, now: float) -> float | None:
    """When the next queued task falls due after ``now`` (None: none will)."""
    due = [
        t.run_at
        for s in QUEUED
        for t in app.store.list_tasks(TaskFilter(status=s, limit=100_000))
        if t.run_at is not None and t.run_at > now
    ]
    return min(due, default=None)


def run_until_idle(app: App, *, workers: int = 1, timeout: float = 60.0, advance: bool = True) -> list[TaskRecord]:
    """Run every task of ``app`` that is due, and (on a :class:`FakeClock`,
    with ``advance``) every one due later, moving the clock to each in turn.

    Returns the tasks that reached a final state, as they ended, in order.
    Raises AssertionError if work is still running after ``timeout`` real
    seconds (a task that never returns, or one blocked behind a group or a
    limit that never frees). Periodic ticks are not enqueued here: move the
    clock and call :func:`fire_ticks`."""
    finished = _Finished()
    # periodic ticks come only when the test says so (fire_ticks): a cron never goes idle
    worker = app.worker(workers, poll_interval=0.01, extra_hooks=[finished], schedules=())
    worker.start()
    end = time.monotonic() + timeout
    try:
        while True:
            if not worker.drain(timeout=max(0.0, min(0.5, end - time.monotonic()))):
                if time.monotonic() >= end:
                    raise AssertionError(f"run_until_idle: still running after {timeout:g}s")
                continue
            clock = app.clock
            if not (advance and isinstance(clock, FakeClock)):
                break
            now = app.store.now()
            nxt = _next_due(app, now)
            if nxt is None:  # what is left waits on something other than time
                break
            clock.advance(nxt - now)
    finally:
        worker.stop(grace=5.0)
    return [app.get(i) for i in finished.ids]


_schedulers: weakref.WeakKeyDictionary[App, Any] = weakref.WeakKeyDictionary()


def fire_ticks(app: App) -> list[TaskRecord]:
    """Enqueue the periodic ticks of ``app`` due on its clock, as a worker
    would; returns the tasks enqueued.

    Call it once before moving the clock (that stores the schedules: no tick
    from before then is due), then after each move; :func:`run_until_idle`
    runs what it enqueued. Catch-up rules apply as in production, so a jump
    over several ticks enqueues only the newest unless ``catch_up="all"``."""
    from corral.maintenance.periodic import Scheduler

    sched = _schedulers.get(app)
    if sched is None or sched.schedules != list(app.schedules.values()):
        sched = _schedulers[app] = Scheduler(app.store, list(app.schedules.values()), clock=app.clock)
    return [app.get(r.task_id) for _, _, r in sched.check() if r.task_id is not None]


def enqueued(task: TaskDef, **filters: Any) -> list[TaskRecord]:
    """Queued (waiting, pending or retrying) runs of ``task``, oldest first."""
    app = task.app
    return sorted(
        (
            t
            for s in (State.WAITING, *QUEUED)
            for t in app.store.list_tasks(TaskFilter(status=s, name=task.name, **filters))
        ),
        key=lambda t: t.id,
    )


def assert_enqueued(
    task: TaskDef,
    *,
    args: Sequence[Any] | None = None,
    kwargs: Mapping[str, Any] | None = None,
    group: str | None = None,
    batch: str | None = None,
    queue: str | None = None,
) -> TaskRecord:
    """Assert that a run of ``task`` matching what is given is queued; return it."""
    found = enqueued(task)
    for t in found:
        a, kw = t.arguments
        if args is not None and list(a) != list(args):
            continue
        if kwargs is not None and dict(kw) != dict(kwargs):
            continue
        if (group, batch, queue) != (
            t.group if group is not None else None,
            t.batch if batch is not None else None,
            t.queue if queue is not None else None,
        ):
            continue
        return t
    want = ", ".join(
        f"{k}={v!r}"
        for k, v in (("args", args), ("kwargs", kwargs), ("group", group), ("batch", batch), ("queue", queue))
        if v is not None
    )
    shown = "; ".join(f"#{t.id} args={t.args} group={t.group!r}" for t in found[:10]) or "nothing"
    raise AssertionError(f"no queued run of {task.name} with {want or 'any arguments'}; queued: {shown}")
