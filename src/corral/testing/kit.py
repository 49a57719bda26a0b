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
whenever nothing is left to run now, the clock jumps to whatever frees work
next (a task or retry due, a rate's next token, a pause's end), and when
nothing will, it fails saying what holds the work back.
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
    from corral.engine.worker import Worker

__all__ = ["FakeClock", "run_until_idle", "assert_enqueued", "enqueued", "fire_ticks"]


class _Finished(Hooks):
    """Task ids in the order their final outcome was written."""

    def __init__(self) -> None:
        self.ids: list[int] = []
        self._lock = threading.Lock()

    def on_outcomes(self, outcomes: Sequence[Outcome], applied: Sequence[bool]) -> None:
        with self._lock:
            self.ids += [o.task_id for o, ok in zip(outcomes, applied) if ok and o.status in FINAL]


#: Real seconds one look at the worker waits for it to be idle.
_LOOK = 0.2
#: The least a jump of the fake clock moves it (a wait the store rounds to nothing must still pass).
_LEAST_STEP = 0.001


def _next_free(app: App, now: float) -> float | None:
    """When (store time) something next frees work held back now, after
    ``now``: a delayed task or a retry falling due, a limit's next token or
    the end of its pause (the store says when: :meth:`Store.limit_frees_at`),
    a circuit breaker letting its probes through. None: nothing will."""
    due = [
        t.run_at
        for s in QUEUED
        for t in app.store.list_tasks(TaskFilter(status=s, limit=100_000))
        if t.run_at is not None and t.run_at > now
    ]
    due += [at for at in app.store.limit_frees_at().values() if at > now]
    for _config, b in app.store.breakers().values():
        at = b.reopens_at()
        if not b.forced and at is not None and at > now:
            due.append(at)
    return min(due, default=None)


def _in_flight(app: App) -> int:
    """Tasks some worker holds (claimed, running, or held for a slot)."""
    counts = app.store.active_counts()
    return sum(
        n for s, n in counts.items() if s not in (State.PENDING.value, State.RETRYING.value, State.WAITING.value)
    )


def _why_stuck(app: App, worker: Worker) -> str | None:
    """What holds back the queued work of this worker that nothing will free (None: none is held)."""
    left = worker.leftovers()
    held = left.get("blocked", 0) + left.get("waiting", 0)
    if not held:
        return None
    reasons = []
    level = app.level()
    if level.value:
        reasons.append(f"fleet level {level.name}")
    opened = sorted(n for n, (_c, b) in app.store.breakers().items() if b.state.value == "OPEN")
    if opened:
        reasons.append(f"breaker(s) OPEN by hand: {', '.join(opened)}")
    usage, specs = app.store.limit_usage(), app.store.limits()
    full = sorted(
        n for n, spec in specs.items() if spec.concurrency is not None and usage.get(n, 0) >= spec.concurrency
    )
    if full:
        reasons.append(f"limit(s) at their concurrency: {', '.join(full)}")
    if left.get("waiting"):
        reasons.append(f"{left['waiting']} waiting on dependencies")
    if left.get("blocked") and not reasons:
        reasons.append("held behind a group, a limit or the level")
    return f"{held} task(s) can never start here: nothing due frees them ({'; '.join(reasons)})"


def run_until_idle(app: App, *, workers: int = 1, timeout: float = 60.0, advance: bool = True) -> list[TaskRecord]:
    """Run every task of ``app`` that is due, and (on a :class:`FakeClock`,
    with ``advance``) every one due later, moving the clock in turn to
    whatever frees work next: a delayed task or a retry falling due, a rate
    limit's next token, a paused limit's end, a breaker's cool-down.

    Returns the tasks that reached a final state, as they ended, in order.
    Raises AssertionError when work of this app is left that nothing will
    free (the fleet level pauses it, a breaker or limit is held, a group's
    head never ends, a dependency never runs here), saying what holds it;
    and when work is still running after ``timeout`` real seconds (a task
    that never returns). On a real clock, or with ``advance=False``, delayed
    tasks and retries not yet due are left queued. Periodic ticks are not
    enqueued here: move the clock and call :func:`fire_ticks`."""
    finished = _Finished()
    # periodic ticks come only when the test says so (fire_ticks): a cron never goes idle
    worker = app.worker(workers, poll_interval=0.01, extra_hooks=[finished], schedules=())
    worker.start()
    end = time.monotonic() + timeout
    clock = app.clock
    fake = advance and isinstance(clock, FakeClock)
    stuck_since: tuple[float, int] | None = None  # (when, tasks finished then): held, nothing to free it
    try:
        while True:
            left = end - time.monotonic()
            if left <= 0:
                why = _why_stuck(app, worker)
                raise AssertionError(f"run_until_idle: still running after {timeout:g}s" + (f"; {why}" if why else ""))
            idle = worker.drain(timeout=min(_LOOK, left))
            now = app.store.now()
            if not idle:
                # A worker that claimed nothing but waits for a retry due within
                # its look ahead (store time) is idle too: on a fake clock that
                # time comes only when moved.
                nxt = _next_free(app, now) if fake and not _in_flight(app) else None
                if nxt is not None and nxt <= now + _LOOK:
                    assert isinstance(clock, FakeClock)
                    clock.advance(max(nxt - now, _LEAST_STEP))
                continue
            nxt = _next_free(app, now)
            if fake and nxt is not None:
                assert isinstance(clock, FakeClock)
                clock.advance(max(nxt - now, _LEAST_STEP))
                continue
            why = _why_stuck(app, worker)
            if why is None:
                break
            if nxt is not None:
                if not isinstance(clock, FakeClock) and nxt - now < end - time.monotonic():
                    continue  # the real clock frees it (a token, a pause's end) before the timeout: wait
                break  # held until a time this call does not move to (advance=False) or wait for
            if stuck_since is None or stuck_since[1] != len(finished.ids):
                # a rate may let starts through already, before its worker
                # looks again (behind a busy rate it looks when a few may
                # start, not at each): held for a look's time before failing
                stuck_since = (time.monotonic(), len(finished.ids))
            if time.monotonic() - stuck_since[0] < _LOOK:
                time.sleep(_LEAST_STEP * 10)
                continue
            raise AssertionError(f"run_until_idle: {why}")
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
