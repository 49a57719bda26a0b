"""The worker never runs a task twice at once, and drain/close always end.

A timed-out thread cannot be stopped: its task stays leased (its group and
limits held) until the thread really ends, a worker holds at most a few such
threads, and drain/close wait only for what this worker can run now.
"""

from __future__ import annotations

import logging
import threading

import pytest

import corral
from corral import State
from corral.core.clock import FakeClock
from corral.core.model import NewTask, dumps
from helpers import wait_for

FAST = corral.Backoff(base=0.001, cap=0.01, jitter=0.5)


@pytest.fixture
def clock():
    return FakeClock()


@pytest.fixture
def app(fake_clock_url, clock):
    a = corral.App(fake_clock_url, clock=clock)
    yield a
    a.close(timeout=10)


def test_group_next_task_waits_for_a_timed_out_thread_to_end(app, clock):
    release = threading.Event()
    events = []

    @app.task(timeout=5)
    def step(name):
        events.append(("start", name))
        if name == "a":
            release.wait(20)
        events.append(("end", name))

    a = step.submit("a", group="order-1")
    b = step.submit("b", group="order-1")
    app.start(workers=2)
    wait_for(lambda: events == [("start", "a")], message="a started")
    clock.advance(6)
    wait_for(lambda: app._worker.abandoned_threads == 1, message="a timed out")
    # a's thread still runs: the store still sees it running, so b stays behind it
    assert a.status() is State.RUNNING and b.status() is State.PENDING
    release.set()
    wait_for(lambda: b.status() is State.SUCCESS, message="b runs once a's thread ended")
    assert a.status() is State.TIMEOUT
    assert events == [("start", "a"), ("end", "a"), ("start", "b"), ("end", "b")]


def test_lease_of_a_timed_out_thread_is_renewed(fake_clock_url, clock):
    release = threading.Event()
    app = corral.App(fake_clock_url, clock=clock)

    began = threading.Event()

    @app.task(timeout=5)
    def hang():
        began.set()
        release.wait(20)

    h = hang.submit()
    app.start(workers=1, lease_seconds=30, heartbeat_interval=1)
    wait_for(began.is_set)  # its deadline is set: the clock may move
    clock.advance(6)
    wait_for(lambda: app._worker.abandoned_threads == 1)
    first = h.get().lease_expires_at
    clock.advance(20)  # past a renewal, and past the lease the claim gave
    wait_for(lambda: h.get().lease_expires_at > first, message="the heartbeat renews the held lease")
    release.set()
    wait_for(lambda: h.status() is State.TIMEOUT)
    app.close(timeout=10)


def test_abandoned_threads_are_capped_and_the_worker_stops_claiming(fake_clock_url, clock, caplog):
    app = corral.App(fake_clock_url, clock=clock)
    release = threading.Event()
    started = []

    @app.task(timeout=5)
    def hang(i):
        started.append(i)
        release.wait(20)
        return i

    handles = [hang.submit(i) for i in range(3)]
    with caplog.at_level(logging.WARNING, logger="corral.worker"):
        app.start(workers=1, max_abandoned_threads=2)
        worker = app._worker
        for n in (1, 2):
            wait_for(lambda n=n: len(started) == n, message=f"task {n} started")
            clock.advance(6)
            wait_for(lambda n=n: worker.abandoned_threads == n, message=f"task {n} timed out")
        wait_for(worker.halted.is_set, message="the worker stops at the cap")
        assert any("max_abandoned_threads=2" in r.getMessage() for r in caplog.records if r.levelno == logging.ERROR)
        wait_for(lambda: worker.busy == 0, message="its slot is free")
        assert handles[2].status() is State.PENDING
        release.set()
        wait_for(lambda: handles[1].status() is State.TIMEOUT, message="the threads end")
        wait_for(lambda: handles[0].status() is State.TIMEOUT, message="the threads end")
    assert worker.abandoned_threads == 0 and handles[2].status() is State.PENDING
    assert started == [0, 1]  # nothing claimed after the cap
    report = app.close(timeout=10)
    assert report.drained and report.left == {"blocked": 1}


def test_abandoned_thread_at_stop_keeps_its_lease_and_writes_nothing(fake_clock_url, clock):
    app = corral.App(fake_clock_url, clock=clock)
    release = threading.Event()

    began = threading.Event()

    @app.task(timeout=5, retries=2, backoff=FAST)
    def hang():
        began.set()
        release.wait(20)

    h = hang.submit()
    app.start(workers=1)
    wait_for(began.is_set)
    clock.advance(6)
    wait_for(lambda: app._worker.abandoned_threads == 1)
    worker = app._worker
    store = app.store if fake_clock_url == "memory://" else None
    report = app.close(timeout=5)
    assert report.abandoned_threads == 1 and "still running" in report.summary()
    release.set()
    if store is not None:  # left for the sweeper once the lease runs out, not retried here
        wait_for(lambda: worker.ledger.runs == {}, message="the thread ends")
        assert store.get(h.id).status is State.RUNNING


def _submit_raw(store, name, queue="default", run_at=None):
    [r] = store.submit([NewTask(name, dumps({"args": [], "kwargs": {}}), queue=queue, run_at=run_at)])
    return r.id


def test_close_ends_with_work_this_worker_cannot_run(app, clock):
    @app.task
    def mine():
        return "done"

    stray = _submit_raw(app.store, "not_here")  # a name this app does not register
    other = mine.submit(queue="reports")  # a queue this worker does not serve
    later = mine.submit(delay=24 * 3600)  # due tomorrow
    now = mine.submit()
    app.start(workers=2)
    assert app.drain(timeout=30)
    assert now.status() is State.SUCCESS
    assert {app.get(i).status for i in (stray, other.id, later.id)} == {State.PENDING}
    result = {}
    closer = threading.Thread(target=lambda: result.setdefault("report", app.close()), daemon=True)
    closer.start()
    wait_for(lambda: "report" in result, timeout=30, message="close() returns")
    report = result["report"]
    assert report.drained and report.handed_back == 0
    assert report.left == {"unregistered": 1, "other_queue": 1, "delayed": 1}


def test_drain_waits_for_a_retry_due_before_its_deadline(fake_clock_url):
    app = corral.App(fake_clock_url)
    runs = []

    @app.task(retries=2, backoff=corral.Backoff(base=0.2, cap=0.2, jitter=0))
    def flaky(ctx):
        runs.append(ctx.attempt)
        if ctx.attempt == 1:
            raise ConnectionError("reset")
        return ctx.attempt

    @app.task(retries=1, backoff=corral.Backoff(base=3600, cap=3600, jitter=0))
    def fails_once():
        raise ConnectionError("reset")

    h = flaky.submit()
    app.start(workers=1)
    assert app.drain(timeout=30)
    assert runs == [1, 2] and h.status() is State.SUCCESS

    later = fails_once.submit()
    assert app.drain(timeout=30)  # its retry is due in an hour: not waited for
    assert later.status() is State.RETRYING
    report = app.close(timeout=10)
    assert report.drained and report.left == {"delayed": 1}


def test_drain_does_not_end_on_a_retry_claimed_while_it_looked(sqlite_url):
    """The retry falls due and is claimed between the drain's last empty
    claim and its look for retries: it is RUNNING then, no longer RETRYING,
    and the drain must wait for it rather than end. (The store's read is
    where the test makes the claim happen; on SQLite the drain reads the
    retry before it is due.)"""
    app = corral.App(sqlite_url)
    ended = []

    @app.task(retries=1, backoff=corral.Backoff(base=0.05, cap=0.05, jitter=0))
    def flaky(ctx):
        if ctx.attempt == 1:
            raise ConnectionError("reset")
        threading.Event().wait(0.5)  # the retry's run: still going when the look ends
        ended.append(ctx.attempt)

    h = flaky.submit()
    looks = app.store.list_tasks

    def look(f):
        rows = looks(f)
        if f.status is State.RETRYING and rows:
            # the dispatcher claims the retry while the drain reads
            wait_for(lambda: app.store.get(h.id).attempt == 2, message="the retry claimed")
            return looks(f)
        return rows

    app.store.list_tasks = look
    app.start(workers=1)
    try:
        assert app.drain(timeout=30)
        assert ended == [2] and h.status() is State.SUCCESS
    finally:
        app.close(timeout=10)


def test_close_at_timeout_hands_back_what_is_in_flight(fake_clock_url):
    app = corral.App(fake_clock_url)
    release = threading.Event()

    @app.task
    def slow():
        release.wait(20)

    h = slow.submit()
    app.start(workers=1)
    wait_for(lambda: h.status() is State.RUNNING)
    report = app.close(timeout=0.2)
    release.set()
    assert not report.drained and report.handed_back == 1
    assert "not drained" in report.summary()


def test_worker_warns_once_of_queued_tasks_it_does_not_register(fake_clock_url, caplog):
    app = corral.App(fake_clock_url)

    @app.task
    def mine():
        return 1

    _submit_raw(app.store, "not_here")
    _submit_raw(app.store, "not_here")
    with caplog.at_level(logging.WARNING, logger="corral.worker"):
        app.start(workers=1, stray_check_interval=0.05, cancel_poll_interval=0.05)

        def warned():
            return [r.getMessage() for r in caplog.records if "does not register" in r.getMessage()]

        wait_for(warned, message="a warning names the stray tasks")
        worker = app._worker
        wait_for(lambda: worker.heartbeat.stray_checks >= 3, message="later checks ran")
        msgs = warned()
    assert len(msgs) == 1 and "'not_here'" in msgs[0] and "'default'" in msgs[0] and " 2 " in msgs[0]
    app.close(timeout=10)


def test_corral_status_shows_what_workers_cannot_run(tmp_path):
    """Tasks of a name no worker registers are counted in `corral status`
    (from the workers' reports), with the timed-out threads still running."""
    import json

    from click.testing import CliRunner

    from corral.cli import cli
    from corral.core.model import NewTask, dumps

    url = f"sqlite:///{tmp_path}/h.db"
    app = corral.App(url)

    @app.task(name="known")
    def known():
        return None

    app.store.submit([NewTask("ghost", dumps({"args": [], "kwargs": {}})) for _ in range(2)])
    worker = app.worker(1, stray_check_interval=0.05).start()
    try:

        def report():
            out = CliRunner().invoke(cli, ["status", "--store", url, "--json"]).output
            workers = json.loads(out)["workers"]
            return workers if workers["unregistered"] else None

        workers = wait_for(report, message="a worker's report reaches corral status")
        assert workers["unregistered"] == {"default:ghost": 2}
        assert workers["abandoned_threads"] == 0 and workers["reporting"] == 1
        text = CliRunner().invoke(cli, ["status", "--store", url]).output
        assert "pending tasks of names no worker registers" in text and "ghost" in text
    finally:
        worker.stop(grace=5)
        app.close(5)
