"""The benchmark's tasks, importable by worker processes.

``build_app(url)`` returns an :class:`~corral.App` on ``url`` with the bench
tasks registered. A worker process started by the benchmarks calls
:func:`worker_process`, which builds the same app from the store URL and runs
a :class:`~corral.engine.worker.Worker` on it. ``corral worker
corral.bench.tasks:app`` also works: ``app`` is built on first access from
``$CORRAL_BENCH_STORE`` (tasks then just sleep, with nothing recorded).
"""

from __future__ import annotations

import os
import time
from typing import Any

from corral.app import App
from corral.bench.common import DownstreamRejected, Recorder, plan
from corral.core.retries import Backoff

DOWNSTREAM_LIMIT = "downstream"

_REC: Recorder | None = None


def set_recorder(rec: Recorder | None, n: int = 0, groups: int = 1, seed: int = 0) -> None:
    """Install the notes the tasks write to (rebuilding the plan's sleeps here)."""
    global _REC
    if rec is not None and rec.sleeps is None:
        rec.sleeps = plan(n, groups, seed)[1]
    _REC = rec


# ---- the tasks ------------------------------------------------------------------------
def downstream_call(i: int) -> None:
    """Call the simulated downstream (5-15 ms, rejects beyond its cap)."""
    rec = _REC
    if rec is None:
        time.sleep(0.010)
        return
    rec.call(i)


def noop(i: int) -> None:
    rec = _REC
    if rec is not None:
        rec.noop(i)


def io_sleep(i: int, ms: float = 10.0) -> None:
    rec = _REC
    if rec is None:
        time.sleep(ms / 1000.0)
        return
    rec.noop(i, ms / 1000.0)


def build_app(url: str, *, limit: int | None = 20, retries: int = 1000) -> App:
    """An app on ``url`` with the bench tasks; sets the downstream limit when
    ``limit`` is given (a worker process passes None: the store already has it)."""
    app = App(url)
    if limit is not None:
        app.limit(DOWNSTREAM_LIMIT, concurrency=limit)
    app.task(
        name="bench.downstream_call",
        retries=retries,
        limits=[DOWNSTREAM_LIMIT],
        retry_on=[DownstreamRejected],
        backoff=Backoff(base=0.005, factor=2.0, cap=0.2, jitter=0.5),
    )(downstream_call)
    app.task(name="bench.noop")(noop)
    app.task(name="bench.io_sleep")(io_sleep)
    return app


def worker_process(
    url: str, rec: Recorder | None, n: int, groups: int, seed: int, worker_opts: dict[str, Any], ready, stop, go=None
) -> None:
    """Body of a worker process: run a Worker on ``url`` until ``stop`` is set
    (starting it only once ``go`` is set, when given)."""

    set_recorder(rec, n, groups, seed)
    app = build_app(url, limit=None)
    if rec is not None:
        rec.time_claims(app.store)
    worker = app.worker(**worker_opts)
    if go is None:
        worker.start()
        ready.set()
    else:
        ready.set()
        go.wait()
        worker.start()
    stop.wait()
    worker.stop(grace=30.0)
    # the store is not closed here: Worker.stop() does not join its dispatcher,
    # which may still be inside store.wait_for_work(); the process exit closes it


def cli_worker_process(
    url: str,
    rec: Recorder | None,
    n: int,
    groups: int,
    seed: int,
    worker_opts: dict[str, Any],
    ready,
    go,
    stop=None,
    profile_to: str | None = None,
) -> None:
    """Body of a worker process run as ``corral worker APP --store URL -c C``
    runs one: :meth:`App.run` in the main thread, with the sweeper beside it
    and the fleet level followed, until SIGTERM (sent by the benchmark).
    ``profile_to``: write the process's CPU by part (from the go until
    ``stop`` is set) there, as JSON (:mod:`corral.bench.profile`)."""
    set_recorder(rec, n, groups, seed)
    app = build_app(url, limit=None)
    if rec is not None:
        rec.time_claims(app.store)
    prof = None
    if profile_to is not None:
        from corral.bench.profile import WorkerProfile

        prof = WorkerProfile(app.store)
    opts = dict(worker_opts)
    concurrency = opts.pop("concurrency")
    ready.set()
    go.wait()
    if prof is not None and profile_to is not None:
        prof.begin()
        prof.end_when(stop, profile_to)
    app.run(concurrency, grace=30.0, sweep_interval=30.0, **opts)
    if prof is not None and profile_to is not None:
        prof.write(profile_to)  # the reading taken at the stop, if it came


_app: App | None = None


def __getattr__(name: str) -> Any:
    if name == "app":
        global _app
        if _app is None:
            _app = build_app(os.environ.get("CORRAL_BENCH_STORE") or "memory://", limit=None)
        return _app
    raise AttributeError(name)
