"""`corral worker` as a real process: graceful SIGTERM, forced second signal.

Nothing queued may be lost: after a graceful stop every task is SUCCESS or
back in PENDING (none stuck RUNNING), and a second worker finishes them all.
After a forced stop the sweeper recovers what was left RUNNING.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from corral.cli import EXIT_FORCED, load_app
from corral.core.claims import ClaimRequest
from corral.core.clock import FakeClock
from corral.core.model import NewTask, dumps
from corral.core.states import State
from corral.stores import open_store
from faults import CORRAL, Process
from helpers import wait_for

REPO = Path(__file__).resolve().parent.parent
SHOP = "examples.shop:app"

pytestmark = pytest.mark.slow


@pytest.fixture
def shop(sqlite_url, monkeypatch):
    """The example app, bound to this test's database (CORRAL_STORE restored after)."""
    monkeypatch.chdir(REPO)
    monkeypatch.setenv("CORRAL_STORE", sqlite_url)
    app = load_app(SHOP, sqlite_url)
    yield app


@pytest.fixture
def workers(processes, sqlite_url):
    """``workers(*args, name=...)``: `corral worker` of the example app in the repository root."""

    def start(*args: str, name: str = "worker") -> Process:
        return processes.start([*CORRAL, "worker", SHOP, "--store", sqlite_url, *args], name, cwd=REPO)

    return start


def _states(store, ids):
    return {i: store.get(i).status for i in ids}


def test_sigterm_finishes_or_hands_back_and_a_second_worker_finishes_all(shop, workers, sqlite_url):
    store = open_store(sqlite_url)
    grace = 1.5
    # Two tasks finish well within the grace period, two do not; four more wait in the queue.
    short = [shop.submit("sync_sku", args=[f"S{i}", "tmall"], kwargs={"latency": 0.4}).id for i in range(2)]
    long = [shop.submit("sync_sku", args=[f"L{i}", "tmall"], kwargs={"latency": 4.0}).id for i in range(2)]
    queued = [shop.submit("notify_merchant", args=["m-1", f"n{i}"], delay=1.0).id for i in range(4)]
    every = short + long + queued

    # no prefetch: exactly the four tasks due are in flight (prefetched units
    # are handed back at once; tests/test_prefetch_worker.py covers that)
    w1 = workers("--concurrency", "4", "--prefetch", "0", "--grace", str(grace))
    w1.wait_log("started:")
    assert "concurrency=4" in w1.log and sqlite_url in w1.log
    wait_for(lambda: store.counts().get("RUNNING", 0) == 4, timeout=20, message="four tasks in flight")
    assert all(store.get(i).status is State.RUNNING for i in short + long)

    sent = time.monotonic()
    w1.signal(signal.SIGTERM)
    assert w1.wait(timeout=grace + 15) == 0, w1.log
    assert time.monotonic() - sent < grace + 10
    assert "SIGTERM received" in w1.log and "stopped after" in w1.log and "handed back" in w1.log
    assert "Traceback" not in w1.log

    states = _states(store, every)
    assert set(states.values()) <= {State.SUCCESS, State.PENDING}, states
    assert all(states[i] is State.SUCCESS for i in short), "in-flight work finished within the grace period"
    assert all(states[i] is State.PENDING for i in long), "unfinished work is handed back, nothing lost"
    for i in long:
        rec = store.get(i)
        assert rec.attempt == 0 and rec.lease_token is None, "a hand-back does not burn an attempt"
    assert sum(store.counts().values()) == len(every)

    w2 = workers("--concurrency", "4", "--grace", "5", name="worker2")
    wait_for(
        lambda: all(s is State.SUCCESS for s in _states(store, every).values()),
        timeout=30,
        interval=0.05,
        message="the second worker finishes everything",
    )
    assert store.get(long[0]).attempt == 1
    w2.signal(signal.SIGTERM)
    assert w2.wait(timeout=15) == 0, w2.log
    assert "all in-flight tasks finished" in w2.log and "Traceback" not in w2.log
    store.close()


def test_second_signal_during_grace_stops_at_once_and_the_sweeper_recovers(shop, workers, sqlite_url):
    store = open_store(sqlite_url)
    ids = [shop.submit("sync_sku", args=[f"H{i}", "jd"], kwargs={"latency": 60.0}).id for i in range(2)]

    w = workers("--concurrency", "2", "--grace", "60", "--lease", "1s")
    wait_for(lambda: store.counts().get("RUNNING", 0) == 2, timeout=20, message="two tasks in flight")
    w.signal(signal.SIGTERM)
    w.wait_log("SIGTERM received")
    sent = time.monotonic()
    w.signal(signal.SIGINT)
    assert w.wait(timeout=10) == EXIT_FORCED, w.log
    assert time.monotonic() - sent < 10, "a second signal does not wait out the 60 s grace"
    assert "stopping at once" in w.log
    assert all(s is State.RUNNING for s in _states(store, ids).values()), "left for the sweeper"

    # `corral sweep` as its own process, as an operator would run it.
    def sweep_once():
        subprocess.run(
            [sys.executable, "-m", "corral", "sweep", "--store", sqlite_url],
            cwd=REPO,
            check=True,
            capture_output=True,
            timeout=60,
        )
        return all(s is State.RETRYING for s in _states(store, ids).values())

    wait_for(sweep_once, timeout=20, interval=0.2, message="lost leases recovered by the sweeper")
    for i in ids:
        assert "worker crashed" in store.get(i).error
    store.close()


def test_sweep_loop_runs_as_its_own_process_and_stops_on_sigterm(shop, processes, sqlite_url):
    store = open_store(sqlite_url, clock=FakeClock(start=time.time() - 3600))  # an hour ago
    [sub] = store.submit([NewTask("notify_merchant", dumps({"args": ["m", "x"], "kwargs": {}}), max_retries=2)])
    tid = sub.id
    [claim] = store.claim("ghost", ClaimRequest(["default"], 1, lease_seconds=30))
    assert claim.tasks[0].id == tid
    proc = processes.start(
        [*CORRAL, "sweep", "--loop", "--interval", "0.2s", "--store", sqlite_url], "sweeper", cwd=REPO
    )
    wait_for(lambda: store.get(tid).status is State.RETRYING, timeout=20, message="the loop recovers the task")
    proc.signal(signal.SIGTERM)
    assert proc.wait(timeout=10) == 0
    text = proc.log
    assert "sweeper" in text and "started" in text and "stopped" in text
    store.close()
