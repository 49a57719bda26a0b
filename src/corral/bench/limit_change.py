"""``corral bench limit-change``: how soon a running fleet obeys a changed limit.

``--workers`` ``corral worker corral.bench.limit_change:app`` processes run
tasks of ``--task-seconds`` under the limit ``live``. Each round lowers its
concurrency to 1 (``Store.change_limit``, as ``corral limit set`` does), waits
until one task runs, then raises it to ``--high`` and waits until that many
run. Measured from the store's own records (the change's ``changed_at`` and
the tasks' ``started_at``/``finished_at``, one clock):

- after a raise: the first new start, and the start that fills the last new
  place (the time to obey a raise);
- after a lowering: starts made while the new cap was already held (must be
  none), and how long the tasks already running kept more than the new cap in
  flight (they finish; that is the task's length, not a delay).

The benchmark runs in this process; the workers are separate processes.
"""

from __future__ import annotations

import time
from typing import Any

from corral.app import App
from corral.bench.common import emit_progress, temp_store_url
from corral.core.stats import percentile
from corral.edges.fleet import WorkerFleet, lazy_app

LIMIT = "live"
APP_SPEC = "corral.bench.limit_change:app"
TASK = "limit_change.hold"


def hold(seconds: float) -> None:
    """A call to a partner that takes ``seconds``."""
    time.sleep(seconds)


def build_app(store: str | None = None) -> App:
    app = App(store)
    app.task(name=TASK, limits=[LIMIT])(hold)
    return app


#: ``app`` is built on first access, so importing this module opens no store.
__getattr__ = lazy_app(build_app)


def _wait(pred, timeout: float, what: str, fleet: WorkerFleet) -> None:
    end = time.monotonic() + timeout
    while not pred():
        fleet.check()
        if time.monotonic() > end:
            raise RuntimeError(f"{what} did not happen within {timeout:g}s")
        time.sleep(0.005)


def run(
    kind: str, pg_url: str | None, *, workers: int, slots: int, high: int, rounds: int, task_seconds: float, progress
) -> dict[str, Any]:
    """One store's rounds; the figures in milliseconds."""
    with temp_store_url(kind, pg_url) as url:
        app = build_app(url)
        app.limit(LIMIT, concurrency=high)
        task = app.registry.get(TASK)
        assert task is not None
        total = int(rounds * (high + 2) * 2 + 50)
        ids = [h.id for h in task.submit_many([{"args": [task_seconds]} for _ in range(total)])]
        changes: list[tuple[str, float, int]] = []  # (lower|raise, changed_at, new cap)

        def running() -> int:
            return int(app.store.counts().get("RUNNING", 0))

        with WorkerFleet(APP_SPEC, url, workers, slots) as fleet:
            fleet.wait_ready()
            _wait(lambda: running() == high, 60, f"{high} in flight", fleet)
            for r in range(rounds):
                spec = app.store.change_limit(LIMIT, {"concurrency": 1}, by="app")
                changes.append(("lower", spec.changed_at or 0.0, 1))
                _wait(lambda: running() <= 1, 60, "1 in flight", fleet)
                time.sleep(task_seconds / 3)  # the raise lands while the one place is held
                spec = app.store.change_limit(LIMIT, {"concurrency": high}, by="app")
                changes.append(("raise", spec.changed_at or 0.0, high))
                _wait(lambda: running() >= high, 60, f"{high} in flight", fleet)
                if progress:
                    emit_progress(r + 1, rounds)
            time.sleep(task_seconds)
        recs = [app.store.get(i) for i in ids]
        app.close()
    runs = [(t.started_at, t.finished_at or float("inf")) for t in recs if t is not None and t.started_at is not None]

    def in_flight(at: float) -> int:
        return sum(1 for s, e in runs if s <= at < e)

    first, filled, over, extra = [], [], [], 0
    for pos, (what, at, cap) in enumerate(changes):
        until = changes[pos + 1][1] if pos + 1 < len(changes) else float("inf")
        starts = sorted(s for s, _ in runs if at <= s < until)
        if what == "raise":
            held = in_flight(at)
            need = cap - held
            if starts:
                first.append(starts[0] - at)
            if need > 0 and len(starts) >= need:
                filled.append(starts[need - 1] - at)
        else:
            extra += sum(1 for s in starts if in_flight(s) > cap)
            ends = sorted(e for s, e in runs if s < at < e)
            if len(ends) > cap:
                over.append(ends[len(ends) - cap - 1] - at)

    def ms(xs: list[float], q: float) -> float | None:
        got = percentile(xs, q)
        return None if got is None else round(got * 1000, 1)

    return {
        "store": kind,
        "workers": workers,
        "slots": slots,
        "high": high,
        "rounds": rounds,
        "task_seconds": task_seconds,
        "raise_first_start_ms": {"p50": ms(first, 0.5), "max": ms(first, 1.0)},
        "raise_all_places_ms": {"p50": ms(filled, 0.5), "max": ms(filled, 1.0)},
        "raises_measured": len(filled),
        "lower_starts_over_cap": extra,
        "lower_running_over_cap_ms": {"p50": ms(over, 0.5), "max": ms(over, 1.0)},
    }


__all__ = ["APP_SPEC", "build_app", "run"]
