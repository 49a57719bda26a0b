"""A snooze (``Retry``) never costs an attempt, however the task was claimed:
as the head of a claim, as a prefetched unit, or as a member of a chunk, on
every store. Were it to count, a task with ``retries=1`` that snoozes once and
then fails once would end FAILED."""

from __future__ import annotations

import threading

import pytest

import corral
from corral import State
from corral.errors import Retry
from helpers import wait_for

N = 12


def _snooze_fail_succeed(app: corral.App, go: threading.Event):
    """Each task asks to run later once, then fails once, then succeeds; the
    first run of task 0 waits for ``go``."""
    lock = threading.Lock()
    runs: dict[int, int] = {}

    @app.task(retries=1, backoff=corral.Backoff(base=0.01, jitter=0.0))
    def job(i):
        with lock:
            runs[i] = runs.get(i, 0) + 1
            n = runs[i]
        if n == 1:
            if i == 0:
                assert go.wait(60)
            raise Retry(after=0)
        if n == 2:
            raise ConnectionError("a real failure")
        return i

    return job, runs


@pytest.mark.parametrize("how", ["prefetch", "chunk"])
def test_a_snooze_never_burns_an_attempt(url, how):
    app = corral.App(url)
    go = threading.Event()
    job, runs = _snooze_fail_succeed(app, go)
    if how == "chunk":  # one group: every task after a claim's head is a chunk member
        handles = [job.submit(i, group="g") for i in range(N)]
        worker = app.worker(1, chunk_size=N, prefetch=0, poll_interval=0.05)
    else:  # one slot, many units held ahead of it: all but the first are prefetched
        handles = [job.submit(i) for i in range(N)]
        worker = app.worker(1, chunk_size=1, prefetch=N - 1, poll_interval=0.05)
    worker.start()
    try:
        if how == "prefetch":  # every unit held while task 0 runs: N - 1 of them prefetched
            wait_for(lambda: worker.busy == N, timeout=30, message="all units held")
        go.set()
        wait_for(lambda: all(app.get(h.id).status.final for h in handles), timeout=120, message="all tasks ended")
    finally:
        go.set()
        worker.stop(grace=10)
    got = [app.get(h.id) for h in handles]
    assert [r.status for r in got] == [State.SUCCESS] * N, [(r.id, r.status, r.error) for r in got]
    assert [(r.attempt, r.snoozes) for r in got] == [(2, 1)] * N
    assert all(runs[i] == 3 for i in range(N))
    app.close(10)
