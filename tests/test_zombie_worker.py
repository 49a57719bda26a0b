"""A zombie worker: stopped (SIGSTOP) mid-task past its lease, then resumed.

Meanwhile the sweeper re-queues its task and a second worker runs it. When
the zombie wakes, its late writes change nothing, and it says it lost the lease.
"""

from __future__ import annotations

import signal
import sqlite3
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import corral
from corral.core.states import State
from corral.errors import StoreError
from corral.maintenance.recovery import sweep_once
from corral.testing import History
from faults import AppWorker
from helpers import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.postgres]


def _side_by_side(scenario, sqlite_url: str, pg_url: str, tmp_path: Path) -> None:
    """Run ``scenario(url, tmp)`` on SQLite and PostgreSQL at once: each mostly
    waits (a task's sleep, a lease running out), so together they cost the
    suite one run. A failure on either fails the test, naming its store."""
    urls = {"sqlite": sqlite_url, "postgres": pg_url}
    for kind in urls:
        (tmp_path / kind).mkdir()
    with ThreadPoolExecutor(len(urls)) as pool:
        runs = {kind: pool.submit(scenario, url, tmp_path / kind) for kind, url in urls.items()}
    for kind, run in runs.items():
        try:
            run.result()
        except BaseException as exc:
            raise AssertionError(f"on {kind}: {exc}") from exc


def test_a_resumed_zombie_changes_nothing_and_knows_it_lost_the_lease(sqlite_url, pg_url, tmp_path):
    _side_by_side(_zombie_changes_nothing, sqlite_url, pg_url, tmp_path)


def test_a_resumed_zombie_starts_nothing_more_of_the_chunk_it_lost(sqlite_url, pg_url, tmp_path):
    """Stopped past its lease while a chunk's head runs, the zombie wakes after
    the sweep re-queued the chunk and a second worker ran it: it must not start
    the chunk's next member (it would run twice, beside later tasks of its group)."""
    _side_by_side(_zombie_starts_nothing_more, sqlite_url, pg_url, tmp_path)


def _zombie_changes_nothing(url: str, tmp_path: Path) -> None:
    runs = tmp_path / "runs.jsonl"
    app = corral.App(url)
    app.task(name="slow", retries=3)(lambda ctx, first_run: None)
    # the first run outlasts the sweep and the re-run even on a loaded
    # machine (a run that ended while the test let the stopped zombie finish
    # a write would not overlap the re-run)
    task_id = app.submit("slow", args=[8.0]).id
    opts = {"concurrency": 1, "lease_seconds": 1.0, "poll_interval": 0.05}
    zombie = AppWorker(url, runs, tmp_path / "zombie.log", **opts)
    second = None
    try:
        wait_for(lambda: History.load(runs).runs, timeout=30, message="the zombie started the task")
        zombie.proc.send_signal(signal.SIGSTOP)

        def swept() -> bool:
            try:
                return sweep_once(app.store).lost_leases_retried == [task_id]
            except StoreError:
                # stopped inside a write, holding SQLite's write lock: let it
                # finish that write, and stop it again outside one
                zombie.proc.send_signal(signal.SIGCONT)
                wait_for(lambda: _write_lock_free(url), timeout=10, interval=0.001)
                zombie.proc.send_signal(signal.SIGSTOP)
                return False

        wait_for(swept, timeout=20, interval=0.1)
        second = AppWorker(url, runs, tmp_path / "second.log", **opts)
        wait_for(lambda: app.get(task_id).status is State.SUCCESS, timeout=30, message="the second worker ran it")
        done = app.get(task_id)
        # the lost run was a crash: its attempt given back, counted apart
        assert done.result_value == second.proc.pid and (done.attempt, done.crashes) == (1, 1)
        zombie.proc.send_signal(signal.SIGCONT)
        # it learns of the loss from its heartbeat, or, when its task's sleep
        # ran out while it was stopped and the outcome goes first, from the
        # store refusing that outcome (then no lease is left to renew)
        wait_for(
            lambda: "lost 1 lease" in zombie.log or "discarded" in zombie.log,
            timeout=20,
            message="the zombie noticed its lost lease",
        )
        wait_for(lambda: len([r for r in History.load(runs).runs if r.end is not None]) == 2, timeout=20)
        wait_for(lambda: "discarded" in zombie.log, timeout=20, message="the zombie's late outcome is discarded")
        after = app.get(task_id)
        assert (after.status, after.result, after.attempt, after.version, after.finished_at) == (
            done.status,
            done.result,
            done.attempt,
            done.version,
            done.finished_at,
        ), "the zombie's late writes changed the row"
        history = History.load(runs)
        assert [r.worker for r in history.runs] == [zombie.pid, second.pid]
        # the only overlap is the one the lost lease allowed: the zombie's run and the re-run
        assert [v.rule for v in history.check()] == ["self-overlap"]
    finally:
        zombie.proc.send_signal(signal.SIGCONT)
        zombie.close()
        if second is not None:
            second.close()
        app.close()


def _zombie_starts_nothing_more(url: str, tmp_path: Path) -> None:
    runs = tmp_path / "runs.jsonl"
    app = corral.App(url)
    app.task(name="step", retries=5)(lambda ctx, group, seq, dur, fail_first=False, first_dur=None: seq)
    first_run = 1.5  # the head's first run: over by the time the zombie wakes
    ids = [app.submit("step", args=["g", i, 0.01], kwargs={"first_dur": first_run}, group="g").id for i in range(4)]
    opts = {"concurrency": 1, "lease_seconds": 1.0, "poll_interval": 0.05, "prefetch": 0}
    zombie = AppWorker(url, runs, tmp_path / "zombie.log", chunk_size=4, **opts)
    second = None
    try:
        started = wait_for(lambda: History.load(runs).runs, timeout=30, message="the zombie started the head")
        assert [r.task_id for r in started] == [ids[0]]
        zombie.proc.send_signal(signal.SIGSTOP)
        swept: set[int] = set()

        def all_swept() -> bool:
            try:
                swept.update(sweep_once(app.store).lost_leases_retried)
            except StoreError:  # stopped inside a SQLite write: see _zombie_changes_nothing
                zombie.proc.send_signal(signal.SIGCONT)
                wait_for(lambda: _write_lock_free(url), timeout=10, interval=0.001)
                zombie.proc.send_signal(signal.SIGSTOP)
            return swept >= set(ids)

        wait_for(all_swept, timeout=20, interval=0.1, message="the zombie's chunk swept")
        second = AppWorker(url, runs, tmp_path / "second.log", **opts)
        wait_for(
            lambda: all(app.get(i).status is State.SUCCESS for i in ids),
            timeout=30,
            message="the second worker ran all",
        )
        # the head's first run has surely ended when the zombie wakes: its slot goes straight to the next member
        wait_for(lambda: time.time() > started[0].start + first_run + 0.5, timeout=30)
        zombie.proc.send_signal(signal.SIGCONT)
        # it learns of the loss from its heartbeat (then it starts nothing more), or before its
        # next start; whatever it does with the chunk's last member (run it, give it back), that
        # write is discarded
        wait_for(
            lambda: "lost 1 lease" in zombie.log or f"task {ids[-1]}: late or stale outcome" in zombie.log,
            timeout=20,
            message="the zombie noticed the loss",
        )
        history = History.load(runs)
        assert [r.task_id for r in history.runs if r.worker == zombie.pid] == [ids[0]], [str(r) for r in history.runs]
        assert [r.task_id for r in history.runs if r.worker == second.pid] == ids
        # the only overlaps are those of the zombie's head run, which the lost lease allowed
        for v in history.check():
            assert zombie.pid in (v.first.worker, v.second.worker) and ids[0] in (v.first.task_id, v.second.task_id), v
    finally:
        zombie.proc.send_signal(signal.SIGCONT)
        zombie.close()
        if second is not None:
            second.close()
        app.close()


def _write_lock_free(url: str) -> bool:
    """Can a write begin now (SQLite)? Another store's writer is not waited for."""
    con = sqlite3.connect(url.removeprefix("sqlite:///"), timeout=0)
    try:
        con.execute("BEGIN IMMEDIATE")
        con.execute("ROLLBACK")
        return True
    except sqlite3.OperationalError:
        return False
    finally:
        con.close()
