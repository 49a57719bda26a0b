"""Priorities with ageing (core/priorities.py): higher priority first, yet a
low-priority task under a steady stream of higher-priority ones still runs."""

from __future__ import annotations

from corral.core.priorities import AGE_STEP, overtake_window
from corral.core.states import State

from .conftest import claim, claim_one, claimed_ids, finish, new, status_of, submit, submit_one


def test_higher_priority_first_among_tasks_of_one_moment(store):
    low, high, mid = submit(store, new("low", priority=0), new("high", priority=2), new("mid", priority=1))
    assert [claim_one(store).id for _ in range(3)] == [high, mid, low]


def test_a_waiting_task_ages_past_later_higher_priority_work(store, advance):
    low = submit_one(store, "low", priority=0)
    advance(overtake_window(0, 2) + 1)  # two levels are worth 2 x AGE_STEP of waiting
    high = submit_one(store, "high", priority=2)
    assert claim_one(store).id == low
    assert claim_one(store).id == high


def test_higher_priority_arriving_within_the_window_still_goes_first(store, advance):
    low = submit_one(store, "low", priority=0)
    advance(overtake_window(0, 2) - 1)
    high = submit_one(store, "high", priority=2)
    assert claim_one(store).id == high
    assert claim_one(store).id == low


def test_low_priority_runs_within_a_bound_under_a_constant_stream_of_high(store, advance):
    """Two high-priority tasks arrive every 10 s and one task is served: the
    backlog of high-priority work grows without end, which under strict
    priority would hold the low-priority task forever. With ageing it runs
    once the high-priority tasks that arrived within its window are served,
    and none that arrived later passes it."""
    low = submit_one(store, "low", priority=0)
    low_at = store.get(low).created_at
    window = overtake_window(0, 3)
    before_low: list[int] = []
    for _ in range(200):
        submit(store, new("high", priority=3), new("high", priority=3))
        got = claim_one(store)
        if got.id == low:
            break
        before_low.append(got.id)
        finish(store, got)
        advance(10.0)
    else:
        raise AssertionError("the low-priority task never ran")
    # every task that passed it arrived within its window, and it ran as soon
    # as those were served (2 arrivals per 10 s step: at most 2 x window / 10 + 2)
    assert all(store.get(t).created_at - low_at <= window for t in before_low)
    assert len(before_low) <= 2 * window / 10 + 2
    assert status_of(store, low) is State.RUNNING


def test_a_claim_with_a_retry_share_orders_by_the_same_rank(store, advance):
    """The fast and the shared claim statements order by the rank too."""
    low = submit_one(store, "low", priority=0)
    advance(AGE_STEP * 5)
    highs = [submit_one(store, "high", priority=1) for _ in range(3)]
    got = claimed_ids(claim(store, 2, retry_share=0.25))
    assert got == [low, highs[0]]


def test_group_order_still_wins_over_priority_and_age(store, advance):
    first = submit_one(store, "a", group="g", priority=0)
    second = submit_one(store, "b", group="g", priority=9)
    advance(AGE_STEP * 20)
    other = submit_one(store, "c", priority=30)
    got = claimed_ids(claim(store, 10))
    assert got == [other, first]  # the group's head only, and priority 30 outranks 20 minutes of waiting
    assert status_of(store, second) is State.PENDING
