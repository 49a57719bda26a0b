"""Deadlines through an app: ``expires=`` checked at ``@app.task`` and at
submit, a held (prefetched) task past its deadline never started by its
worker, and no task started after its deadline across worker processes."""

from __future__ import annotations

import datetime
import threading

import pytest
from click.testing import CliRunner

import corral
from corral import State
from corral.cli import cli
from corral.core.claims import ClaimRequest
from corral.core.model import EXPIRED
from corral.errors import BadArguments, ConfigError
from helpers import wait_for


@pytest.mark.parametrize(
    ("expires", "says"),
    [
        (0, "expires"),
        (-5, "expires"),
        (float("inf"), "expires"),
        (float("nan"), "expires"),
        ("soon", "expires must be seconds or a duration"),
        (True, "expires must be seconds or a duration"),
        (datetime.datetime(2030, 1, 1, tzinfo=datetime.UTC), "a datetime is per submit"),
    ],
)
def test_bad_deadlines_are_refused_in_one_line_at_the_task(expires, says):
    app = corral.App("memory://")
    with pytest.raises(ConfigError) as err:
        app.task(name="t", expires=expires)(lambda: None)
    assert says in str(err.value) and "\n" not in str(err.value)
    assert "t" not in app.task_names


def test_bad_deadlines_are_refused_in_one_line_at_submit():
    app = corral.App("memory://")
    send = app.task(name="send")(lambda phone: phone)
    cases = [
        ({"expires": 0}, "expires"),
        ({"expires": "5x"}, "expires must be seconds or a duration"),
        ({"expires": datetime.datetime(2030, 1, 1)}, "timezone-aware"),
        ({"expires": 10, "delay": 30}, "expires (10s) must be later than delay (30s)"),
    ]
    for options, says in cases:
        with pytest.raises(BadArguments) as err:
            send.submit("+1", **options)
        assert says in str(err.value) and "\n" not in str(err.value)
    assert app.tasks(name="send") == []  # nothing stored


def test_a_deadline_is_seconds_from_submit_on_the_stores_clock(url):
    app = corral.App(url)
    send = app.task(name="send", expires="5m")(lambda phone: phone)
    try:
        before = app.store.now()
        default = send.submit("+1").get()
        given = send.submit("+1", expires=30).get()
        at = datetime.datetime.now(datetime.UTC) + datetime.timedelta(hours=1)
        moment = send.submit("+1", expires=at).get()
        after = app.store.now()
        assert before + 300 <= default.expires_at <= after + 300
        assert before + 30 <= given.expires_at <= after + 30
        assert moment.expires_at == pytest.approx(at.timestamp())
        assert app.task(name="plain")(lambda: 0).submit().get().expires_at is None
    finally:
        app.close(timeout=10)


def test_a_held_task_past_its_deadline_is_not_started(url):
    """A prefetched task whose deadline passes while it waits for a slot ends
    CANCELED "expired" at its turn, never run, its attempt not counted."""
    app = corral.App(url)
    release = threading.Event()
    ran: list[int] = []

    @app.task
    def job(i):
        ran.append(i)
        if i == 0:
            release.wait(30)

    first = job.submit(0)
    worker = app.worker(1, prefetch=2, chunk_size=1).start()
    try:
        wait_for(lambda: ran == [0], message="the first task runs")
        held = job.submit(1, expires=2)
        wait_for(lambda: held.status() is State.RESERVED, message="the second is prefetched before its deadline")
        deadline = held.get().expires_at
        wait_for(lambda: app.store.now() > deadline, message="its deadline passed while it was held")
        release.set()
        wait_for(lambda: held.status() is State.CANCELED, message="its worker ended it at its turn")
        rec = held.get()
        assert (rec.error, rec.attempt, rec.started_at) == (EXPIRED, 0, None)
        assert first.result(timeout=10) is None
        assert ran == [0]
    finally:
        release.set()
        worker.stop(grace=10)
        app.close(timeout=10)


def test_corral_show_shows_the_deadline_and_why_it_was_canceled(sqlite_url):
    app = corral.App(sqlite_url)
    send = app.task(name="send")(lambda phone: phone)
    try:
        h = send.submit("+1", expires=0.05)
        wait_for(lambda: app.store.now() > h.get().expires_at)
        app.store.claim("w", ClaimRequest(("default",), 1))  # meets it: ends it
        assert (h.status(), h.get().error) == (State.CANCELED, EXPIRED)
    finally:
        app.close(timeout=10)
    result = CliRunner().invoke(cli, ["show", str(h.id), "--store", sqlite_url], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert "CANCELED" in result.output and "not started by then: expired" in result.output


def test_no_task_starts_after_its_deadline_across_worker_processes(durable_url, processes, tmp_path):
    """Two worker processes, each with more prefetched than its slots run in
    time: the tasks that start do so before their deadline (the claim's
    check, or the worker's for a held one), every other ends "expired"."""
    history = tmp_path / "history.jsonl"
    workers = [
        processes.worker(durable_url, history, name=f"w{i}", concurrency=2, prefetch=4, sweep_interval=0.5)
        for i in range(2)
    ]
    for w in workers:
        w.wait_ready()
    app = corral.App(durable_url)
    app.task(name="otp")(lambda dur: None)  # submitted here, run by the workers
    try:
        handles = app.submit_many("otp", [{"args": (1.0,), "expires": 1.5} for _ in range(24)])
        ids = [h.id for h in handles]
        wait_for(lambda: all(app.get(i).status.final for i in ids), timeout=60, message="every task ended")
        recs = [app.get(i) for i in ids]
        ran = [r for r in recs if r.status is State.SUCCESS]
        expired = [r for r in recs if r.status is State.CANCELED and r.error == EXPIRED]
        assert len(ran) + len(expired) == len(ids), [(r.id, r.status, r.error) for r in recs]
        assert ran and expired
        late = [(r.id, r.started_at - r.expires_at) for r in ran if r.started_at > r.expires_at + 0.25]
        assert late == [], "started after the deadline"
        assert all(r.attempt == 0 and r.started_at is None for r in expired)
    finally:
        app.close(timeout=10)
