"""Kill a worker with SIGKILL mid-run: nothing is lost, order holds, and only
what was in flight on the killed worker runs twice."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import pytest

import corral
from helpers import wait_for

APP = Path(__file__).parent / "apps" / "crash_app.py"
GROUPS, PER_GROUP = 50, 40


def _start_worker(url: str, log: Path) -> subprocess.Popen:
    env = dict(os.environ, CORRAL_STORE=url, CRASH_LOG=str(log), PYTHONPATH=os.pathsep.join(sys.path))
    return subprocess.Popen([sys.executable, str(APP)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def _read(log: Path):
    lines = log.read_text().splitlines() if log.exists() else []
    return [(k, int(p), g, int(s), float(t)) for k, p, g, s, t in (ln.split() for ln in lines)]


def run_crash_scenario(url: str, log: Path) -> None:
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
    workers = [_start_worker(url, log), _start_worker(url, log)]
    try:
        wait_for(lambda: sum(1 for r in _read(log) if r[0] == "E") >= 500, timeout=60, message="work under way")
        victim = workers[0]
        victim.send_signal(signal.SIGKILL)
        victim.wait(10)
        kill_time = time.time()
        workers.append(_start_worker(url, log))
        wait_for(
            lambda: submitter.counts().get("SUCCESS", 0) == GROUPS * PER_GROUP,
            timeout=120,
            interval=0.1,
            message="every task SUCCESS after the crash",
        )
    finally:
        for w in workers:
            if w.poll() is None:
                w.kill()
                w.wait(10)
    assert submitter.counts() == {"SUCCESS": GROUPS * PER_GROUP}

    records = _read(log)
    killed = victim.pid
    starts, ends = defaultdict(list), defaultdict(list)
    for kind, pid, g, s, t in records:
        (starts if kind == "S" else ends)[(g, s)].append((t, pid))
    assert len(starts) == GROUPS * PER_GROUP  # nothing lost: every task ran

    in_flight_on_victim = 0
    for key, ss in starts.items():
        if len(ss) > 1:  # ran more than once: every extra run must be the victim's
            assert all(pid == killed for _, pid in ss[:-1]), (
                f"{key} re-ran though it was not on the killed worker: {ss}"
            )
            assert ss[-1][1] != killed
            in_flight_on_victim += 1
    assert in_flight_on_victim > 0, "the kill hit no task in flight; the test proved nothing"

    for g in range(GROUPS):
        # one in flight per group, over every execution (the victim's included)
        runs = []
        for s in range(PER_GROUP):
            key = (f"g{g}", s)
            for t0, pid in starts[key]:
                done = [t for t, p in ends[key] if p == pid and t >= t0]
                runs.append((t0, min(done) if done else kill_time, s))
        runs.sort()
        for (_a0, a1, sa), (b0, _b1, sb) in zip(runs, runs[1:]):
            assert b0 >= a1 - 0.002, f"group g{g}: task {sb} started while {sa} was in flight"
        # submit order over the runs that counted (each task's last run)
        final = sorted((starts[(f"g{g}", s)][-1][0], s) for s in range(PER_GROUP))
        assert [s for _, s in final] == list(range(PER_GROUP)), f"group g{g} out of order"


@pytest.mark.slow
def test_crash_recovery_sqlite(tmp_path):
    run_crash_scenario(f"sqlite:///{tmp_path}/crash.db", tmp_path / "runs.log")


@pytest.mark.slow
@pytest.mark.postgres
def test_crash_recovery_postgres(pg_url, tmp_path):
    run_crash_scenario(pg_url, tmp_path / "runs.log")
