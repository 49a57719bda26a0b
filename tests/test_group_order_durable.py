"""Group order under random failures and timeouts on the durable stores, with
two worker processes: every group runs one task at a time, in submit order
(checked over every run with the history checker)."""

from __future__ import annotations

import random

import pytest

import corral
from corral.core.states import State
from corral.testing import History
from faults import AppWorker
from helpers import wait_for

pytestmark = pytest.mark.slow

GROUPS, PER_GROUP = 8, 15


def test_order_holds_in_every_group_under_failures_and_timeouts_with_two_processes(durable_url, tmp_path):
    url = durable_url
    app = corral.App(url)
    app.task(name="step", retries=5)(lambda ctx, group, seq, dur, fail_first=False, first_dur=None: seq)
    rng = random.Random(11)
    calls, fails, timeouts = [], 0, 0
    for i in range(PER_GROUP):
        for g in range(GROUPS):
            call = {"args": [f"g{g}", i, rng.uniform(0.002, 0.01)], "group": f"g{g}"}
            roll = rng.random()
            if roll < 0.15:
                call["kwargs"] = {"fail_first": True}
                fails += 1
            elif roll < 0.22:
                call["kwargs"] = {"first_dur": 0.6}  # the first run times out
                call["timeout"] = 0.3
                timeouts += 1
            calls.append(call)
    assert fails > 5 and timeouts > 3
    app.submit_many("step", calls)
    runs = tmp_path / "runs.jsonl"
    opts = {"concurrency": 4, "chunk_size": 3, "poll_interval": 0.05}
    workers = [AppWorker(url, runs, tmp_path / f"w{i}.log", **opts) for i in range(2)]
    try:
        wait_for(
            lambda: app.counts().get(State.SUCCESS.value, 0) == len(calls),
            timeout=90,
            interval=0.1,
            message="every task SUCCESS",
        )
    finally:
        for w in workers:
            w.close()
        app.close(5)
    history = History.load(runs)
    assert len({r.task_id for r in history.runs}) == len(calls)
    assert len(history.runs) >= len(calls) + fails + timeouts, "the failures and timeouts really happened"
    history.assert_ok()
    assert len({r.worker for r in history.runs}) == 2, "both processes ran tasks"
