"""complete_and_claim: the outcomes of ended units and their successors'
claims in one call, a limit's place passing from one unit to the next."""

from __future__ import annotations

from corral.core.breaker import BreakerConfig, BreakerState
from corral.core.model import LimitSpec, Outcome
from corral.core.states import State

from .conftest import claim, claimed_ids, new, status_of, submit


def done(rec) -> Outcome:
    return Outcome(rec.id, rec.lease_token, rec.version, State.SUCCESS)


def hand_over(store, outcomes, places, **kw):
    return store.complete_and_claim(outcomes, places, "w", ["default"], **kw)


def handed(store, got, ids) -> bool:
    """The successors a store that hands over must claim; one that does not
    (memory, where freeing and claiming cost nothing) claims none."""
    return claimed_ids(got) == (ids if store.hands_over else [])


def test_a_place_passes_to_one_successor_under_its_limit(store):
    store.set_limit(LimitSpec("api", concurrency=2))
    ids = submit(store, *[new(limits=("api",)) for _ in range(5)])
    first, second = claim(store, 10)
    applied, got = hand_over(store, [done(first.tasks[0])], [("api",)])
    assert applied == [True]
    assert handed(store, got, [ids[2]])  # one unit ended: one successor, though three wait
    if store.hands_over:
        assert store.limit_usage().get("api") == 2
        assert claim(store, 10) == []  # the place never looked free to anyone else
    assert status_of(store, first.tasks[0].id) is State.SUCCESS
    assert [status_of(store, i) for i in ids[3:]] == [State.PENDING, State.PENDING]


def test_the_next_task_of_the_ended_units_group_can_follow_it(store):
    a, b = submit(store, new(group="g"), new(group="g"))
    (c,) = claim(store, 10)
    assert claimed_ids([c]) == [a]
    applied, got = hand_over(store, [done(c.tasks[0])], [()])
    assert applied == [True]
    assert handed(store, got, [b])  # the group's line moved on in the same call


def test_no_successor_past_a_cap_lowered_meanwhile(store):
    store.set_limit(LimitSpec("api", concurrency=2))
    submit(store, *[new(limits=("api",)) for _ in range(4)])
    first, _ = claim(store, 10)
    store.set_limit(LimitSpec("api", concurrency=1))
    applied, got = hand_over(store, [done(first.tasks[0])], [("api",)])
    assert applied == [True] and got == []
    assert store.limit_usage().get("api") == 1


def test_no_successor_without_a_token_of_its_rate(store):
    store.set_limit(LimitSpec("api", concurrency=2, rate="1/m", burst=1))
    submit(store, *[new(limits=("api",)) for _ in range(3)])
    (c,) = claim(store, 10)
    applied, got = hand_over(store, [done(c.tasks[0])], [("api",)])
    assert applied == [True] and got == []  # the place is free, the bucket empty


def test_no_successor_past_an_open_breaker(store):
    store.set_limit(LimitSpec("api", concurrency=2))
    store.set_breaker("api", BreakerConfig())
    submit(store, *[new(limits=("api",)) for _ in range(3)])
    (c, _) = claim(store, 10)
    store.force_breaker("api", BreakerState.OPEN, "test")
    applied, got = hand_over(store, [done(c.tasks[0])], [("api",)])
    assert applied == [True] and got == []


def test_a_place_of_one_limit_does_not_make_room_under_another(store):
    store.set_limit(LimitSpec("api", concurrency=1))
    store.set_limit(LimitSpec("db", concurrency=1))
    a, b = submit(store, new(limits=("api",)), new(limits=("db",)))
    more_db = submit(store, new(limits=("db",)))
    got = claim(store, 10)
    assert sorted(claimed_ids(got)) == [a, b]
    api_unit = next(c for c in got if c.tasks[0].id == a)
    applied, succ = hand_over(store, [done(api_unit.tasks[0])], [("api",)])
    assert applied == [True] and succ == []  # only db work waits, and db is full
    assert status_of(store, more_db[0]) is State.PENDING
    assert store.limit_usage().get("db") == 1


def test_a_stale_outcome_is_refused_and_claims_still_bounded(store):
    store.set_limit(LimitSpec("api", concurrency=1))
    ids = submit(store, *[new(limits=("api",)) for _ in range(3)])
    (c,) = claim(store, 10)
    stale = Outcome(c.tasks[0].id, "not-the-token", c.tasks[0].version, State.SUCCESS)
    applied, got = hand_over(store, [stale], [("api",)])
    assert applied == [False] and got == []  # the unit still runs: its place is not free
    assert status_of(store, ids[0]) is State.RUNNING


def test_a_place_goes_back_to_every_worker_when_others_work_waits_first(store):
    store.set_limit(LimitSpec("api", concurrency=1))
    (mine,) = submit(store, new(queue="a", limits=("api",)))
    (theirs,) = submit(store, new(queue="b", limits=("api",)))
    (later,) = submit(store, new(queue="a", limits=("api",)))
    (c,) = store.claim("w", ["a"], 10)
    assert claimed_ids([c]) == [mine]
    applied, got = store.complete_and_claim([done(c.tasks[0])], [("api",)], "w", ["a"])
    assert applied == [True] and got == []  # the other queue's work waited first
    (other,) = store.claim("w2", ["b"], 10)
    assert claimed_ids([other]) == [theirs]
    assert status_of(store, later) is State.PENDING


def test_a_place_passes_over_when_the_first_work_waiting_is_the_workers_own(store):
    store.set_limit(LimitSpec("api", concurrency=1))
    first, mine = submit(store, new(queue="a", limits=("api",)), new(queue="a", limits=("api",)))
    submit(store, new(queue="b", limits=("api",)))
    (c,) = store.claim("w", ["a"], 10)
    applied, got = store.complete_and_claim([done(c.tasks[0])], [("api",)], "w", ["a"])
    assert applied == [True] and handed(store, got, [mine])
