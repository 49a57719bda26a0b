"""The engine's seams: the clock, the hooks, the registry it is given, and
process-isolated tasks judged by their own retry rules."""

from __future__ import annotations

import threading

import pytest

import corral
from corral import State
from corral.core.clock import FakeClock, poll_until
from corral.engine.hooks import UNLIMITED, HookChain, Hooks
from corral.engine.worker import Worker
from corral.stores.memory import MemoryStore
from helpers import wait_for

FAST = corral.Backoff(base=0.001, cap=0.01, jitter=0.0)


# ---- the clock -----------------------------------------------------------------------------
def test_fake_clock_moves_only_when_told_and_never_back():
    clock = FakeClock(start=1000.0)
    assert (clock.time(), clock.monotonic()) == (1000.0, 0.0)
    assert clock.advance(2.5) == 1002.5
    assert (clock.time(), clock.monotonic()) == (1002.5, 2.5)
    with pytest.raises(ValueError):
        clock.advance(-1)
    assert clock.time() == 1002.5


def test_poll_until_returns_the_answer_and_gives_up_at_the_timeout():
    answers = iter([False, False, True])
    assert poll_until(lambda: next(answers), timeout=5) is True
    calls = []
    assert poll_until(lambda: calls.append(1) or False, timeout=0) is False
    assert calls == [1]  # asked once even with no time to wait


def test_a_thread_task_times_out_when_the_clock_is_moved_past_its_timeout():
    clock = FakeClock()
    app = corral.App("memory://", clock=clock)
    release = threading.Event()
    started = threading.Event()

    @app.task(timeout=3600)  # an hour, on the fake clock
    def hang():
        started.set()
        release.wait(30)

    h = hang.submit()
    app.start(workers=1)
    try:
        assert started.wait(10)
        clock.advance(3599)
        assert h.status() is State.RUNNING  # not yet: one second left on the clock
        clock.advance(2)
        wait_for(lambda: app._worker.abandoned_threads == 1, message="watchdog should time the task out")
        assert h.status() is State.RUNNING  # leased until its thread ends
        release.set()
        wait_for(lambda: h.status() is State.TIMEOUT, message="the timeout is written when the thread ends")
        assert "timed out after 3600s" in h.get().error
    finally:
        release.set()
        app.close(timeout=10)


# ---- hooks ---------------------------------------------------------------------------------
class Recorder(Hooks):
    def __init__(self, budget: int | None = UNLIMITED):
        self.budget = budget
        self.claims: list[int] = []
        self.outcomes: list[tuple[int, State, bool]] = []

    def dispatch_budget(self) -> int | None:
        return self.budget

    def on_claims(self, worker_id, claims) -> None:
        self.claims += [c.tasks[0].id for c in claims]

    def on_outcomes(self, outcomes, applied) -> None:
        self.outcomes += [(o.task_id, o.status, ok) for o, ok in zip(outcomes, applied)]


def _echo_app(hooks) -> corral.App:
    app = corral.App("memory://", hooks=hooks)

    @app.task(name="echo")
    def echo(x):
        return x

    return app


def test_hooks_see_every_claim_and_outcome():
    rec = Recorder()
    app = _echo_app([rec])
    hs = app.registry["echo"].submit_many([(i,) for i in range(5)])
    app.start(workers=2)
    try:
        assert [h.result(timeout=10) for h in hs] == list(range(5))
        wait_for(lambda: len(rec.outcomes) == 5)
        assert sorted(rec.claims) == [h.id for h in hs]
        assert sorted(rec.outcomes) == [(h.id, State.SUCCESS, True) for h in hs]
    finally:
        app.close(timeout=10)


def test_a_budget_of_none_pauses_dispatch_and_a_number_caps_each_claim():
    rec = Recorder(budget=None)
    app = _echo_app([rec])
    hs = app.registry["echo"].submit_many([(i,) for i in range(6)])
    app.start(workers=4)
    try:
        # paused: the worker asks the budget in a loop and claims nothing
        assert not poll_until(lambda: bool(rec.claims), timeout=0.3)
        assert all(h.status() is State.PENDING for h in hs)
        rec.budget = 1
        wait_for(lambda: all(h.status() is State.SUCCESS for h in hs))
        assert len(rec.claims) == 6  # one unit per claim
    finally:
        app.close(timeout=10)


def test_a_hook_that_raises_does_not_stop_the_worker():
    class Broken(Hooks):
        def on_outcomes(self, outcomes, applied) -> None:
            raise RuntimeError("metrics backend down")

    app = _echo_app([Broken()])
    hs = app.registry["echo"].submit_many([(i,) for i in range(3)])
    app.start(workers=1)
    try:
        assert [h.result(timeout=10) for h in hs] == [0, 1, 2]
    finally:
        app.close(timeout=10)


def test_chained_hooks_take_the_smallest_budget_and_none_wins():
    assert HookChain(Recorder(5), Recorder(3)).dispatch_budget() == 3
    assert HookChain(Recorder(5), Recorder(None)).dispatch_budget() is None
    assert HookChain().dispatch_budget() == UNLIMITED


# ---- the registry ----------------------------------------------------------------------------
def test_a_worker_runs_from_a_plain_registry_without_an_app():
    store = MemoryStore()
    app = corral.App(store)
    seen = []

    @app.task(name="note")
    def note(x):
        seen.append(x)

    note.submit("a")
    worker = Worker(store, {"note": app.registry["note"]}, concurrency=1).start()
    try:
        wait_for(lambda: seen == ["a"])
    finally:
        worker.stop(grace=5)


# ---- process isolation: the task's own retry rules ---------------------------------------------
class Flaky(Exception):
    pass


def _raise_value_error():
    raise ValueError("bad input, but this task says it is worth retrying")


def _raise_flaky():
    raise Flaky("transient")


def test_a_process_task_retries_by_its_own_retry_on():
    app = corral.App("memory://")
    # ValueError is permanent by default; this task says to retry it
    t = app.task(name="v", isolation="process", retries=1, backoff=FAST, retry_on=[ValueError])(_raise_value_error)
    h = t.submit()
    app.start(workers=1)
    try:
        rec = app.wait(h.id, timeout=20)
        assert rec.status is State.FAILED
        assert rec.attempt == 2  # retried once, as its retry_on says
    finally:
        app.close(timeout=10)


def test_a_process_task_fails_at_once_by_its_own_permanent_on():
    app = corral.App("memory://")
    t = app.task(name="f", isolation="process", retries=3, backoff=FAST, permanent_on=[Flaky])(_raise_flaky)
    h = t.submit()
    app.start(workers=1)
    try:
        rec = app.wait(h.id, timeout=20)
        assert rec.status is State.FAILED
        assert rec.attempt == 1  # never retried: its permanent_on names the error
    finally:
        app.close(timeout=10)
