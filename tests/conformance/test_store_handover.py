"""complete_and_claim: the outcomes of ended units and their successors'
claims in one call, a limit's place passing from one unit to the next."""

from __future__ import annotations

from corral.core.breaker import BreakerConfig, BreakerState
from corral.core.claims import ClaimRequest
from corral.core.model import LimitSpec, Outcome
from corral.core.states import State
from corral.maintenance.recovery import sweep_once

from .conftest import claim, claimed_ids, new, status_of, submit


def done(rec) -> Outcome:
    return Outcome(rec.id, rec.lease_token, rec.version, State.SUCCESS)


def hand_over(store, outcomes, places, relays=(), **kw):
    return store.complete_and_claim(outcomes, places, "w", ClaimRequest(("default",), **kw), relays=relays)


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
    (c,) = store.claim("w", ClaimRequest(["a"], 10))
    assert claimed_ids([c]) == [mine]
    applied, got = store.complete_and_claim([done(c.tasks[0])], [("api",)], "w", ClaimRequest(["a"]))
    assert applied == [True] and got == []  # the other queue's work waited first
    (other,) = store.claim("w2", ClaimRequest(["b"], 10))
    assert claimed_ids([other]) == [theirs]
    assert status_of(store, later) is State.PENDING


def test_a_place_passes_over_when_the_first_work_waiting_is_the_workers_own(store):
    store.set_limit(LimitSpec("api", concurrency=1))
    first, mine = submit(store, new(queue="a", limits=("api",)), new(queue="a", limits=("api",)))
    submit(store, new(queue="b", limits=("api",)))
    (c,) = store.claim("w", ClaimRequest(["a"], 10))
    applied, got = store.complete_and_claim([done(c.tasks[0])], [("api",)], "w", ClaimRequest(["a"]))
    assert applied == [True] and handed(store, got, [mine])


# ---- relays: a successor claimed while its predecessor still runs ------------------
def relay(store, outcomes, unit, queues=("default",)):
    return store.complete_and_claim(
        outcomes, [], "w", ClaimRequest(list(queues), chunk_size=1), relays=[(unit.token, unit.tasks[0].limits)]
    )


def test_a_relay_takes_the_place_of_a_running_unit_under_its_token(store):
    store.set_limit(LimitSpec("api", concurrency=2))
    ids = submit(store, *[new(limits=("api",)) for _ in range(4)])
    first, second = claim(store, 10)
    applied, got = relay(store, [], first)
    assert applied == []
    assert handed(store, got, [ids[2]])  # one successor, though two wait
    if not store.hands_over:
        return
    (succ,) = got
    assert succ.token == first.token  # the place the running unit holds, not a new one
    rec = store.get(ids[2])
    assert rec.status is State.RESERVED and rec.started_at is None and rec.attempt == 0  # not started yet
    assert store.limit_usage().get("api") == 2
    assert claim(store, 10) == []  # the limit stays full to everyone else
    applied, _ = store.complete_and_claim([done(first.tasks[0])], [], "w", ClaimRequest(["default"]))
    assert applied == [True]
    assert store.limit_usage().get("api") == 2  # the predecessor ended: its successor holds the place
    assert claim(store, 10) == []
    assert status_of(store, ids[3]) is State.PENDING


def test_a_relay_never_takes_a_place_under_another_limit(store):
    store.set_limit(LimitSpec("api", concurrency=2))
    store.set_limit(LimitSpec("db", concurrency=5))
    (a,) = submit(store, new(limits=("api",)))
    (both,) = submit(store, new(limits=("api", "db")))
    (only_api,) = submit(store, new(limits=("api",)))
    (c,) = claim(store, 1)
    assert claimed_ids([c]) == [a]
    _, got = relay(store, [], c)
    assert handed(store, got, [only_api])  # the db place would be taken idle
    assert status_of(store, both) is State.PENDING


def test_no_relay_under_a_rate_or_a_breaker(store):
    store.set_limit(LimitSpec("api", concurrency=2, rate="100/s", burst=10))
    store.set_limit(LimitSpec("db", concurrency=2))
    store.set_breaker("db", BreakerConfig())
    submit(store, *[new(limits=("api",)) for _ in range(3)], *[new(limits=("db",)) for _ in range(3)])
    units = claim(store, 10)
    by = {c.tasks[0].limits: c for c in units}
    for held in (("api",), ("db",)):
        _, got = relay(store, [], by[held])
        assert got == []  # a relayed head would owe a token, or a probe, while it waits


def test_a_relay_leaves_the_place_to_other_queues_work_waiting_first(store):
    store.set_limit(LimitSpec("api", concurrency=1))
    (mine,) = submit(store, new(queue="a", limits=("api",)))
    submit(store, new(queue="b", limits=("api",)), new(queue="a", limits=("api",)))
    (c,) = store.claim("w", ClaimRequest(["a"], 10))
    assert claimed_ids([c]) == [mine]
    _, got = relay(store, [], c, queues=("a",))
    assert got == []


def test_a_relay_never_takes_the_next_task_of_the_running_group(store):
    store.set_limit(LimitSpec("api", concurrency=2))
    g1, g2 = submit(store, new(group="g", limits=("api",)), new(group="g", limits=("api",)))
    (h,) = submit(store, new(group="h", limits=("api",)))
    (c,) = claim(store, 1, chunk_size=1)
    assert claimed_ids([c]) == [g1]
    _, got = relay(store, [], c)
    assert handed(store, got, [h])
    assert status_of(store, g2) is State.PENDING


def test_a_relayed_successor_of_a_dead_worker_comes_back_with_its_attempts(store, advance):
    store.set_limit(LimitSpec("api", concurrency=1))
    first, second = submit(store, new(limits=("api",), max_retries=1), new(limits=("api",), max_retries=1))
    (c,) = store.claim("w", ClaimRequest(["default"], 1, lease_seconds=30))
    _, got = store.complete_and_claim(
        [], [], "w", ClaimRequest(["default"], chunk_size=1, lease_seconds=30), relays=[(c.token, ("api",))]
    )
    if not store.hands_over:
        assert got == []
        return
    assert claimed_ids(got) == [second]
    advance(31)  # the worker died: the lease they share ran out
    report = sweep_once(store)
    assert set(report.lost_leases_retried) == {first, second}
    # it had started: a crash re-run, its attempt given back and the crash counted
    assert (store.get(first).attempt, store.get(first).crashes) == (0, 1)
    assert (store.get(second).attempt, store.get(second).crashes) == (0, 0)  # it never started: nothing burned
    assert status_of(store, second) in (State.PENDING, State.RETRYING)
