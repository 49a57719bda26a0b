"""``app.batch(name, concurrency=N, on_complete=task)`` through real workers,
and ``corral batch show``."""

from __future__ import annotations

import threading

import pytest
from click.testing import CliRunner

import corral
from corral import State
from corral.cli import cli
from corral.core.batches import limit_name, progress
from corral.core.model import TaskFilter
from corral.errors import ConfigError
from helpers import wait_for


class Tally:
    """How many tasks of the batch run at once, at most, and the summaries the callback got."""

    def __init__(self):
        self.lock = threading.Lock()
        self.now = 0
        self.most = 0
        self.summaries: list[dict] = []

    def enter(self):
        with self.lock:
            self.now += 1
            self.most = max(self.most, self.now)

    def leave(self):
        with self.lock:
            self.now -= 1


def build(url: str, tally: Tally, *, fail: set[int] = frozenset()) -> corral.App:  # type: ignore[assignment]
    app = corral.App(url)

    @app.task
    def sync(ctx, n: int) -> int:
        tally.enter()
        try:
            threading.Event().wait(0.01)  # the workload
            if n in fail:
                raise ValueError(f"sku {n} is invalid")
            return n
        finally:
            tally.leave()

    @app.task(queue="reports")
    def report(summary: dict) -> str:
        with tally.lock:
            tally.summaries.append(summary)
        return summary["status"]

    return app


def test_batch_limit_and_callback_on_every_store(url):
    tally = Tally()
    app = build(url, tally, fail={3})
    app.batch("sku-0801", concurrency=2, on_complete="report")
    handles = app.registry["sync"].submit_many([(i,) for i in range(12)], batch="sku-0801")
    assert app.get(handles[0].id).limits == (limit_name("sku-0801"),)
    app.start(workers=6, queues=["default", "reports"])
    try:
        wait_for(lambda: len(tally.summaries) == 1, timeout=30, message="the batch callback should run")
        assert app.drain(timeout=20)
    finally:
        app.close(10)
    assert tally.most <= 2
    (summary,) = tally.summaries
    assert summary["batch"] == "sku-0801" and summary["status"] == "PARTIAL_SUCCESS"
    assert summary["total"] == 12 and summary["counts"] == {"SUCCESS": 11, "FAILED": 1}


def test_callback_runs_once_with_three_workers_racing(url):
    if url == "memory://":
        pytest.skip("memory:// is not shared between apps")
    tallies = [Tally() for _ in range(3)]
    apps = [build(url, t) for t in tallies]
    apps[0].batch("nightly", on_complete=apps[0].registry["report"])
    apps[0].registry["sync"].submit_many([(i,) for i in range(30)], batch="nightly")
    for a in apps:
        a.start(workers=4, queues=["default", "reports"])
    try:
        wait_for(lambda: sum(len(t.summaries) for t in tallies) >= 1, timeout=30)
        for a in apps:
            assert a.drain(timeout=20)
    finally:
        for a in apps:
            a.close(10)
    assert sum(len(t.summaries) for t in tallies) == 1
    checker = corral.App(url)
    try:
        reports = checker.store.list_tasks(TaskFilter(name="report"))
        assert len(reports) == 1 and reports[0].status is State.SUCCESS
    finally:
        checker.close()


def test_batch_limit_holds_across_two_worker_apps(url):
    if url == "memory://":
        pytest.skip("memory:// is not shared between apps")
    tally = Tally()
    apps = [build(url, tally) for _ in range(2)]
    apps[1].batch("shared", concurrency=3)
    # the producer learns the limit from the store, not from its own declaration
    apps[0].registry["sync"].submit_many([(i,) for i in range(20)], batch="shared")
    for a in apps:
        a.start(workers=5)
    try:
        for a in apps:
            assert a.drain(timeout=30)
        wait_for(lambda: apps[0].active_count() == 0, timeout=30)
    finally:
        for a in apps:
            a.close(10)
    assert 1 <= tally.most <= 3


def test_a_canceled_last_task_settles_the_batch():
    tally = Tally()
    app = build("memory://", tally)
    app.batch("c", on_complete="report")
    h = app.submit("sync", args=(1,), batch="c")
    app.cancel(h.id)
    (rec,) = app.store.list_tasks(TaskFilter(name="report"))
    assert rec.status is State.PENDING
    app.close()


def test_batch_options_are_checked():
    app = corral.App("memory://")
    with pytest.raises(ConfigError, match="concurrency"):
        app.batch("b", concurrency=0)
    with pytest.raises(ConfigError, match="on_complete"):
        app.batch("b", on_complete=42)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="batch name"):
        app.batch("")


def test_lifting_a_batch_limit():
    app = corral.App("memory://")
    app.batch("b", concurrency=2)
    app.batch("b")
    assert app.store.limits()[limit_name("b")].concurrency is None


def test_progress_bins():
    p = progress({"SUCCESS": 3, "FAILED": 1, "CANCELED": 1, "RUNNING": 2, "PENDING": 4, "WAITING": 1})
    assert (p.done, p.failed, p.running, p.queued, p.ended, p.total) == (3, 2, 2, 5, 5, 12)


def test_cli_batch_show_prints_one_line_without_a_terminal(sqlite_url):
    app = corral.App(sqlite_url)

    @app.task
    def t() -> None:
        return None

    t.submit_many([(), ()], batch="b7")
    app.close()
    result = CliRunner().invoke(cli, ["batch", "show", "b7", "--store", sqlite_url])
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == "batch b7: RUNNING, 0/2 ended (done 0, failed 0, running 0, queued 2)"


def test_cli_batch_show_follow_ends_when_the_batch_is_final(sqlite_url):
    app = corral.App(sqlite_url)

    @app.task
    def t() -> None:
        return None

    h = t.submit(batch="b8")
    app.start(workers=1)
    wait_for(lambda: app.get(h.id).status is State.SUCCESS)
    app.close()
    result = CliRunner().invoke(cli, ["batch", "show", "b8", "--follow", "--store", sqlite_url])
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == "batch b8: ALL_SUCCESS, 1/1 ended (done 1, failed 0, running 0, queued 0)"


def test_cli_batch_show_unknown_batch_is_one_error_line(sqlite_url):
    corral.App(sqlite_url).close()  # the store exists: commands that only read never create one
    result = CliRunner().invoke(cli, ["batch", "show", "nope", "--store", sqlite_url])
    assert result.exit_code == 1
    assert "no batch named 'nope'" in result.output and len(result.output.strip().splitlines()) == 1


def test_a_sweep_settles_a_batch_ended_outside_any_worker(url):
    from corral.maintenance.sweeper import Sweeper

    tally = Tally()
    app = build(url, tally)
    try:
        app.batch("ops", on_complete="report")
        h = app.submit("sync", args=(1,), batch="ops")
        app.store.cancel(h.id)  # as `corral cancel` in another process: no worker, no app.cancel
        assert app.store.list_tasks(TaskFilter(name="report")) == []
        Sweeper(app.store, interval=1.0).tick()
        (rec,) = app.store.list_tasks(TaskFilter(name="report"))
        assert rec.queue == "reports" and rec.status is State.PENDING
    finally:
        app.close()
