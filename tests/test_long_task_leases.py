"""A task that runs for three leases on a healthy worker, with sweepers active,
runs exactly once: its heartbeats keep the lease, so no sweep recovers it."""

from __future__ import annotations

import pytest

import corral
from corral.core.states import State
from corral.testing import History
from faults import AppWorker
from helpers import wait_for

pytestmark = pytest.mark.slow

LEASE = 1.0


def test_a_task_running_three_leases_runs_exactly_once(durable_url, tmp_path):
    url = durable_url
    app = corral.App(url)
    app.task(name="slow", retries=3)(lambda ctx, first_run: None)
    runs = tmp_path / "runs.jsonl"
    opts = {"concurrency": 1, "lease_seconds": LEASE, "heartbeat_interval": LEASE / 3, "sweep_interval": 0.2}
    # two workers, each with a sweeper: the idle one would take the task the moment it were recovered
    workers = [AppWorker(url, runs, tmp_path / f"w{i}.log", poll_interval=0.05, **opts) for i in range(2)]
    try:
        for w in workers:
            w.wait_ready()
        task_id = app.submit("slow", args=[3 * LEASE + 0.3]).id
        wait_for(lambda: app.get(task_id).status is State.SUCCESS, timeout=30, message="the long task finished")
        assert app.get(task_id).attempt == 1
    finally:
        for w in workers:
            w.close()
        app.close(5)
    history = History.load(runs)
    assert len(history.runs_of(task_id)) == 1, [str(r) for r in history.runs_of(task_id)]
    history.assert_ok()
