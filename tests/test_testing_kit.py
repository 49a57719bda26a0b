"""corral.testing as a user meets it: a task with retries and a group, tested
in process on a fake clock (this file is the worked example of the docs)."""

from __future__ import annotations

import pytest

import corral
from corral import State
from corral.testing import FakeClock, assert_enqueued, run_until_idle


def make_app(clock: FakeClock) -> tuple[corral.App, list, list]:
    app = corral.App("memory://", clock=clock)
    calls: list[float] = []
    pushed: list[int] = []

    @app.task(retries=2, backoff=corral.Backoff(base=30, jitter=0))
    def sync_sku(sku: str) -> str:
        calls.append(clock.time())
        if len(calls) < 3:
            raise ConnectionError("partner API down")
        return sku

    @app.task
    def notify(merchant: str, seq: int) -> None:
        pushed.append(seq)

    return app, calls, pushed


def test_a_task_retries_on_the_fake_clock_and_its_group_keeps_order():
    clock = FakeClock(start=1_000.0)
    app, calls, pushed = make_app(clock)
    app.registry["sync_sku"].submit("A1", group="merchant-1")
    for seq in range(3):
        app.registry["notify"].submit("merchant-1", seq, group="merchant-1")
    assert_enqueued(app.registry["sync_sku"], args=["A1"], group="merchant-1")

    done = run_until_idle(app)

    assert [(r.name, r.status) for r in done] == [("sync_sku", State.SUCCESS)] + [("notify", State.SUCCESS)] * 3
    assert [c - calls[0] for c in calls] == [0.0, 30.0, 90.0]  # backoff 30 s then 60 s, waited on the fake clock
    assert pushed == [0, 1, 2]  # the group waited for its retrying head, then ran in order
    app.close()


def test_assert_enqueued_says_what_is_queued_when_nothing_matches():
    app, _, _ = make_app(FakeClock())
    app.registry["sync_sku"].submit("A1")
    with pytest.raises(AssertionError, match=r"no queued run of sync_sku with args=\['B2'\]; queued: #1"):
        assert_enqueued(app.registry["sync_sku"], args=["B2"])
    app.close()


# ---- run_until_idle on realistic apps: it moves the clock to what frees work next, or fails loudly ----
def test_run_until_idle_waits_for_each_token_of_a_rate(fake_clock_url):
    clock = FakeClock(start=1_000.0)
    app = corral.App(fake_clock_url, clock=clock)
    app.limit("partner", rate="5/s")
    started: list[float] = []

    @app.task(limits=["partner"])
    def call(i: int) -> None:
        started.append(clock.time())

    for i in range(20):
        call.submit(i)
    done = run_until_idle(app, timeout=30)
    assert [r.status for r in done] == [State.SUCCESS] * 20
    assert started[-1] - started[0] >= 15 / 5  # the rate held, on the fake clock
    app.close()


def test_run_until_idle_runs_retries_with_the_default_backoff(fake_clock_url):
    clock = FakeClock(start=1_000.0)
    app = corral.App(fake_clock_url, clock=clock)
    failed: set[int] = set()

    @app.task(retries=1)
    def flaky(i: int) -> int:
        if i not in failed:
            failed.add(i)
            raise ConnectionError("partner API down")
        return i

    for i in range(3):
        flaky.submit(i)
    done = run_until_idle(app, timeout=30)
    assert sorted(r.result_value for r in done) == [0, 1, 2]
    assert all(r.status is State.SUCCESS and r.attempt == 2 for r in done)
    app.close()


def test_run_until_idle_fails_loudly_when_nothing_will_free_the_work(fake_clock_url):
    clock = FakeClock(start=1_000.0)
    app = corral.App(fake_clock_url, clock=clock)

    @app.task
    def job() -> None:
        pass

    job.submit()
    app.set_level("EMERGENCY", reason="stop everything")
    with pytest.raises(AssertionError, match=r"1 task\(s\) can never start here.*EMERGENCY"):
        run_until_idle(app, timeout=30)
    app.close()


def test_run_until_idle_on_the_real_clock_waits_for_a_rates_next_tokens(fake_clock_url):
    app = corral.App(fake_clock_url)
    app.limit("partner", rate="50/s")

    @app.task(limits=["partner"])
    def call(i: int) -> int:
        return i

    for i in range(60):
        call.submit(i)
    done = run_until_idle(app, timeout=60)
    assert sorted(r.result_value for r in done) == list(range(60))
    app.close()
