"""A worker process and what it leaves behind when it dies or gives up.

A process task's child dies with its worker (kill -9, or a second signal),
so the sweeper never re-queues a task whose orphan still runs. A worker with
too many timed-out threads exits 4 for its supervisor to restart it.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from corral.cli import EXIT_ABANDONED, EXIT_FORCED
from corral.core.model import NewTask, dumps
from corral.core.states import State
from corral.engine import foreground
from corral.stores import open_store
from faults import CORRAL, Process
from helpers import wait_for

REPO = Path(__file__).resolve().parent.parent
APP = "tests.apps.runtime_app:app"

pytestmark = pytest.mark.slow


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie counts as dead
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.fixture
def worker(processes, sqlite_url):
    """``worker(*args)``: `corral worker` of the runtime app in the repository root."""

    def start(*args: str) -> Process:
        return processes.start([*CORRAL, "worker", APP, "--store", sqlite_url, *args], "worker", cwd=REPO)

    return start


def _submit(url: str, name: str, *args: object, timeout: float | None = None) -> int:
    store = open_store(url)
    try:
        [r] = store.submit([NewTask(name, dumps({"args": list(args), "kwargs": {}}), timeout=timeout)])
        return r.id
    finally:
        store.close()


def _child_pid(pidfile: Path) -> int:
    wait_for(pidfile.exists, timeout=30, message="the child process started")
    return int(pidfile.read_text())


@pytest.mark.parametrize("how", ["kill -9", "double SIGTERM"])
def test_process_task_child_dies_with_its_worker(worker, sqlite_url, tmp_path, how):
    pidfile = tmp_path / "child.pid"
    _submit(sqlite_url, "hold_in_child", str(pidfile))
    w = worker("--concurrency", "1", "--grace", "60")
    child = _child_pid(pidfile)
    assert pid_alive(child)
    if how == "kill -9":
        w.signal(signal.SIGKILL)
        assert w.wait(10) == -signal.SIGKILL
    else:
        w.signal(signal.SIGTERM)
        w.wait_log("SIGTERM received", timeout=20)
        w.signal(signal.SIGTERM)
        assert w.wait(10) == EXIT_FORCED, w.log
    wait_for(lambda: not pid_alive(child), timeout=10, message="the orphaned child is gone")


def test_worker_exits_4_at_its_abandoned_thread_cap(worker, sqlite_url):
    assert EXIT_ABANDONED == foreground.EXIT_ABANDONED == 4
    tid = _submit(sqlite_url, "hang_in_thread", timeout=0.3)
    w = worker("--concurrency", "2", "--grace", "1", "--max-abandoned-threads", "1")
    code = w.wait(30)
    assert code == EXIT_ABANDONED, w.log
    text = w.log
    assert "max_abandoned_threads=1" in text and "Traceback" not in text
    store = open_store(sqlite_url)
    try:  # still leased: the sweeper recovers it once the lease runs out, not before
        assert store.get(tid).status is State.RUNNING
    finally:
        store.close()
