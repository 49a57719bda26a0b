"""Kill a worker with SIGKILL mid-run: nothing is lost, order holds, and only
what was in flight on the killed worker runs twice."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest

import corral
from corral.testing import History, HistoryLog
from faults import APPS, Process
from helpers import order_violations_past_a_crash, wait_for

APP = APPS / "crash_app.py"
GROUPS, PER_GROUP = 50, 40


def run_crash_scenario(url: str, log: Path, processes) -> None:
    submitter = corral.App(url)

    @submitter.task(name="step", retries=5)
    def step(group, seq, dur):  # body runs in the worker processes
        raise AssertionError

    rng = random.Random(3)
    step.submit_many(
        [
            {"args": (f"g{g}", i, rng.uniform(0.005, 0.02)), "group": f"g{g}"}
            for i in range(PER_GROUP)
            for g in range(GROUPS)
        ]
    )

    def start(name: str) -> Process:
        return processes.start([sys.executable, APP], name, store=url, env={"CRASH_LOG": log})

    victim = start("worker0")
    start("worker1")
    wait_for(
        lambda: sum(r.end is not None for r in History.load(log).runs) >= 500,
        timeout=60,
        message="work under way",
    )
    victim.kill()
    HistoryLog(log).died(str(victim.pid))
    start("worker2")
    wait_for(
        lambda: submitter.counts().get("SUCCESS", 0) == GROUPS * PER_GROUP,
        timeout=120,
        interval=0.1,
        message="every task SUCCESS after the crash",
    )
    assert submitter.counts() == {"SUCCESS": GROUPS * PER_GROUP}

    history = History.load(log)
    killed = str(victim.pid)
    ran = {r.task_id for r in history.runs}
    assert len(ran) == GROUPS * PER_GROUP  # nothing lost: every task ran

    in_flight_on_victim = 0
    for task_id in ran:
        runs = history.runs_of(task_id)
        if len(runs) > 1:  # ran more than once: every extra run must be the victim's
            assert all(r.worker == killed for r in runs[:-1]), f"task {task_id} re-ran off the killed worker: {runs}"
            assert runs[-1].worker != killed
            in_flight_on_victim += 1
    assert in_flight_on_victim > 0, "the kill hit no task in flight; the test proved nothing"
    bad = order_violations_past_a_crash(history, killed)
    assert not bad, "\n".join(str(v) for v in bad[:20])


@pytest.mark.slow
def test_crash_recovery_sqlite(tmp_path, processes):
    run_crash_scenario(f"sqlite:///{tmp_path}/crash.db", tmp_path / "runs.log", processes)


@pytest.mark.slow
@pytest.mark.postgres
def test_crash_recovery_postgres(pg_url, tmp_path, processes):
    run_crash_scenario(pg_url, tmp_path / "runs.log", processes)
