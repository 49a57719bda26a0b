"""Acceptance: three worker processes, one forced clock, exactly one run per tick.

The test moves the workers' cron clock a minute at a time (a file their
clock reads) over 50 ticks and waits, on the store, for each tick to be
handled before the next; in the middle one worker is killed with SIGKILL
right after its clock moved, possibly inside the tick's transaction. Every
tick must still have exactly one task, on SQLite and on PostgreSQL.
"""

from __future__ import annotations

import os
import sys
from collections import Counter
from pathlib import Path

import pytest

from corral.core.cron import ENQUEUED
from corral.core.model import TaskFilter
from corral.core.states import State
from corral.stores import open_store
from faults import APPS
from helpers import wait_for

pytestmark = pytest.mark.slow
APP = APPS / "periodic_app.py"
T0 = 1_700_000_100  # a whole minute
TICKS = 50
KILL_AT = 25


def _set_clock(path: Path, at: float) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(repr(float(at)))
    os.replace(tmp, path)  # readers see the old time or the new one, never half a number


def test_three_workers_run_each_tick_once_with_one_killed(durable_url, tmp_path, processes):
    url = durable_url
    store = open_store(url)
    store.migrate()
    clock, runs = tmp_path / "clock.txt", tmp_path / "runs.log"
    _set_clock(clock, T0 + 30)
    procs = [
        processes.start([sys.executable, APP], f"worker{i}", store=url, env={"CLOCK_FILE": clock, "RUNS_LOG": runs})
        for i in range(3)
    ]
    wait_for(lambda: [s.name for s in store.schedules()] == ["every_minute"], timeout=60, message="schedule stored")
    for k in range(1, TICKS + 1):
        tick = T0 + 60 * k
        _set_clock(clock, tick + 1)
        if k == KILL_AT:
            procs[0].kill()
        wait_for(
            lambda t=tick: store.schedules()[0].last_tick == t,
            timeout=60,
            message=f"tick {k} handled",
        )
    wait_for(
        lambda: (
            [t.status for t in store.list_tasks(TaskFilter(name="every_minute", limit=1000))] == [State.SUCCESS] * TICKS
        ),
        timeout=90,
        message="every tick's task ran",
    )
    assert [p.running() for p in procs[1:]] == [True, True], "the other workers kept running"

    ticks = store.schedule_ticks("every_minute", limit=1000)
    assert sorted(t.tick for t in ticks) == [T0 + 60 * k for k in range(1, TICKS + 1)]
    assert {t.outcome for t in ticks} == {ENQUEUED}
    tasks = store.list_tasks(TaskFilter(name="every_minute", limit=1000))
    assert sorted(t.task_id for t in ticks) == sorted(t.id for t in tasks)
    assert len(tasks) == TICKS
    ran = Counter(int(x) for x in runs.read_text().split())
    assert set(ran) == {t.id for t in tasks}
    # delivery is at least once: only a run the kill cut short may have run again
    assert sum(n - 1 for n in ran.values()) <= 1, ran.most_common(3)
    store.close()
