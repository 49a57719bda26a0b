"""A pause lands on a worker in another process: a group paused while its
chunks are held there stops within a second (running tasks finish, held ones
go back), keeps its order, burns no attempt, and a resume wakes the worker
at once (not at its next poll)."""

from __future__ import annotations

import time

import pytest

import corral
from corral.core.states import State
from corral.testing import History
from faults import AppWorker
from helpers import wait_for


@pytest.mark.slow
def test_a_group_paused_from_another_process_stops_within_a_second_and_resumes_in_order(durable_url, tmp_path):
    app = corral.App(durable_url)
    step = app.task(name="step")(lambda ctx, group, seq, dur: seq)
    runs = tmp_path / "runs.jsonl"
    # chunks of five tasks of 0.5 s: paused while the first runs, the fourth would start 1.5 s later; a
    # poll so slow that only a wake can start work soon after the resume
    worker = AppWorker(durable_url, runs, tmp_path / "w.log", concurrency=2, chunk_size=5, poll_interval=30)
    try:
        worker.wait_ready()
        ids = [h.id for h in step.submit_many([{"args": ["g", i, 0.5]} for i in range(8)], group="g")]
        wait_for(lambda: History.load(runs).runs, timeout=30, interval=0.01, message="the group started")
        assert app.pause(group="g", by="test")
        paused_at = time.monotonic()

        def quiet() -> bool:  # nothing of the group running nor held (RESERVED)
            counts = app.counts()
            return counts.get(State.RUNNING.value, 0) == 0 and counts.get("RESERVED", 0) == 0

        wait_for(quiet, timeout=10, interval=0.02, message="the group's running task ended and held ones went back")
        done_when_paused = sum(1 for t in ids if app.store.get(t).status is State.SUCCESS)
        assert 0 < done_when_paused < len(ids)
        history = History.load(runs)
        assert all(r.start < paused_at + 1.0 for r in history.runs), "a run started over a second after the pause"
        assert app.resume(group="g")
        resumed_at = time.monotonic()
        wait_for(
            lambda: any(r.start > resumed_at for r in History.load(runs).runs),
            timeout=5,
            interval=0.02,
            message="the worker woke on the resume",
        )
        wait_for(
            lambda: app.counts().get(State.SUCCESS.value, 0) == len(ids), timeout=60, interval=0.05, message="all done"
        )
    finally:
        worker.close()
    history = History.load(runs)
    history.assert_ok()  # one at a time, in submit order, across the pause
    assert not [r for r in history.runs if paused_at + 1.0 < r.start < resumed_at]
    assert sorted(r.task_id for r in history.runs) == ids  # each ran once
    assert {app.store.get(t).attempt for t in ids} == {1}  # no attempt burned
    app.close()
