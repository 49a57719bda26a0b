"""SQLite under kill -9 during write bursts: the file stays sound and nothing
whose submit returned is lost."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from corral.stores import open_store
from corral.testing import History
from faults import AppWorker
from helpers import wait_for

pytestmark = pytest.mark.slow
SUBMITTER = Path(__file__).parent / "apps" / "burst_submitter.py"


def _acked(path: Path) -> list[int]:
    if not path.exists():
        return []
    lines = path.read_text().splitlines()
    # the last line may be cut short by the kill: only whole lines were acknowledged
    return [int(x) for line in lines if line.endswith(tuple("0123456789")) for x in line.split()]


def test_kill_9_during_submit_and_complete_bursts_loses_nothing(sqlite_url, tmp_path):
    acked = tmp_path / "acked.txt"
    env = dict(os.environ, CORRAL_STORE=sqlite_url, ACKED=str(acked), PYTHONPATH=os.pathsep.join(sys.path))
    open_store(sqlite_url).migrate()
    for round_ in range(5):
        before = len(_acked(acked))
        runs = tmp_path / "runs.jsonl"
        submitter = subprocess.Popen([sys.executable, str(SUBMITTER)], env=env, stderr=subprocess.DEVNULL)
        worker = AppWorker(sqlite_url, runs, tmp_path / f"worker{round_}.log", concurrency=4)
        try:
            wait_for(lambda n=before + 400: len(_acked(acked)) >= n, timeout=30, message="bursts under way")
            ran = len(History.load(runs).runs)
            wait_for(
                lambda p=runs, n=ran + 50: len(History.load(p).runs) >= n, timeout=30, message="the worker runs tasks"
            )
        finally:
            submitter.send_signal(signal.SIGKILL)
            worker.proc.send_signal(signal.SIGKILL)
            submitter.wait(10)
            worker.close()

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
