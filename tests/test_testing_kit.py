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
