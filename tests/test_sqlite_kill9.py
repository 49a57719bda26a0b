"""SQLite under kill -9 during write bursts: the file stays sound and nothing
whose submit returned is lost."""

from __future__ import annotations

import signal
import sqlite3
import sys
from pathlib import Path

import pytest

from corral.stores import open_store
from corral.testing import History
from helpers import wait_for

pytestmark = pytest.mark.slow
SUBMITTER = Path(__file__).parent / "apps" / "burst_submitter.py"


def _acked(path: Path) -> list[int]:
    if not path.exists():
        return []
    lines = path.read_text().splitlines()
    # the last line may be cut short by the kill: only whole lines were acknowledged
    return [int(x) for line in lines if line.endswith(tuple("0123456789")) for x in line.split()]


def test_kill_9_during_submit_and_complete_bursts_loses_nothing(sqlite_url, tmp_path, processes):
    acked = tmp_path / "acked.txt"
    open_store(sqlite_url).migrate()
    for round_ in range(5):
        before = len(_acked(acked))
        runs = tmp_path / "runs.jsonl"
        submitter = processes.start(
            [sys.executable, SUBMITTER], f"submitter{round_}", store=sqlite_url, env={"ACKED": acked}
        )
        worker = processes.worker(sqlite_url, runs, f"worker{round_}", concurrency=4)
        try:
            wait_for(lambda n=before + 400: len(_acked(acked)) >= n, timeout=30, message="bursts under way")
            ran = len(History.load(runs).runs)
            wait_for(
                lambda p=runs, n=ran + 50: len(History.load(p).runs) >= n, timeout=30, message="the worker runs tasks"
            )
        finally:  # both at once, mid-burst
            submitter.signal(signal.SIGKILL)
            worker.signal(signal.SIGKILL)
            submitter.kill()
            worker.kill()

    with sqlite3.connect(sqlite_url.removeprefix("sqlite:///")) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
    store = open_store(sqlite_url)
    try:
        ids = _acked(acked)
        assert len(ids) >= 5 * 400
        missing = [i for i in ids if store.get(i) is None]
        assert not missing, f"{len(missing)} acknowledged task(s) lost, e.g. {missing[:5]}"
        assert store.counts().get("SUCCESS", 0) > 0, "the worker completed nothing: the test proved little"
    finally:
        store.close()
