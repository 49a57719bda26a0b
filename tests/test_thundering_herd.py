"""Eight worker processes start together on 10 000 queued tasks: no task is
claimed twice, and all finish."""

from __future__ import annotations

from collections import Counter

import pytest

import corral
from corral.testing import History
from faults import AppWorker
from helpers import wait_for

pytestmark = pytest.mark.slow
N, WORKERS = 10_000, 8


def test_eight_workers_start_together_and_claim_nothing_twice(durable_url, tmp_path):
    url = durable_url
    runs = tmp_path / "runs.jsonl"
    app = corral.App(url)
    app.task(name="noop")(lambda ctx: 0)
    app.submit_many("noop", [{} for _ in range(N)])
    workers = [AppWorker(url, runs, tmp_path / f"w{i}.log", concurrency=4, poll_interval=0.05) for i in range(WORKERS)]
    try:
        wait_for(lambda: app.counts().get("SUCCESS", 0) == N, timeout=100, interval=0.2, message="all finished")
    finally:
        for w in workers:
            w.close()
    assert app.counts() == {"SUCCESS": N}
    history = History.load(runs)
    starts = Counter(r.task_id for r in history.runs)
    assert len(starts) == N and set(starts.values()) == {1}, "a task ran twice"
    assert len({r.worker for r in history.runs}) > 1, "the workers did not really race"
    assert {t.attempt for t in app.tasks(limit=N)} == {1}
    app.close()
