"""A prefetch claim (``ClaimRequest(prefetch=True)``): units a worker holds
before a slot is free for them. They never name a limit (an idle unit must
not hold a limit's place or a rate's token), they record no start (a
hand-back or a crash costs them no attempt), and group order and
exclusivity hold as for any claim."""

from __future__ import annotations

from corral.core.model import LimitSpec, Outcome
from corral.core.states import State
from corral.maintenance.recovery import sweep_once

from .conftest import claim, claimed_ids, expire_lease, new, status_of, submit


def test_prefetch_never_takes_a_task_under_a_capped_limit_or_a_rate(store):
    store.set_limit(LimitSpec("api", concurrency=5))
    store.set_limit(LimitSpec("paced", rate="100/s"))
    capped, paced, plain = submit(store, new(limits=("api",)), new(limits=("paced",)), new())
    got = claim(store, 10, prefetch=True)
    assert claimed_ids(got) == [plain]
    assert status_of(store, capped) is State.PENDING and status_of(store, paced) is State.PENDING
    assert store.limit_usage().get("api", 0) == 0
    # a claim into a free slot takes them as usual
    assert sorted(claimed_ids(claim(store, 10))) == [capped, paced]


def test_prefetch_records_no_start_and_the_outcome_does(store):
    (tid,) = submit(store, new(max_retries=2))
    (c,) = claim(store, 1, prefetch=True)
    rec = c.tasks[0]
    stored = store.get(tid)
    assert stored.status is State.RESERVED and stored.attempt == 0 and stored.started_at is None
    assert rec.attempt == 0
    now = store.now()
    (ok,) = store.complete([Outcome(tid, c.token, rec.version, State.SUCCESS, started_at=now, attempt=1)])
    assert ok
    done = store.get(tid)
    assert done.status is State.SUCCESS and done.attempt == 1 and done.started_at == now


def test_a_prefetched_unit_handed_back_keeps_its_attempt(store):
    (tid,) = submit(store, new(max_retries=0))
    (c,) = claim(store, 1, prefetch=True)
    rec = c.tasks[0]
    (ok,) = store.complete([Outcome(tid, c.token, rec.version, State.PENDING, attempt=rec.attempt)])
    assert ok
    back = store.get(tid)
    assert back.status is State.PENDING and back.attempt == 0
    # and it runs as usual afterwards
    (again,) = claim(store, 1)
    assert again.tasks[0].attempt == 1


def test_a_crash_hands_prefetched_units_back_without_burning_an_attempt(store, advance):
    ids = submit(store, new(max_retries=0), new("t", group="g", max_retries=0), new("t", group="g"))
    got = claim(store, 10, prefetch=True, chunk_size=5)
    assert sorted(claimed_ids(got)) == sorted(ids)
    expire_lease(store, got[0].tasks[0], advance)
    sweep_once(store)
    for tid in ids:
        rec = store.get(tid)
        assert rec.status is State.PENDING, rec
        assert rec.attempt == 0
    # with no retries left to burn, they still run
    assert sorted(claimed_ids(claim(store, 10, chunk_size=5))) == sorted(ids)


def test_a_prefetched_group_unit_holds_its_group(store):
    first, second = submit(store, new(group="g"), new(group="g"))
    (c,) = claim(store, 1, prefetch=True)
    assert claimed_ids([c]) == [first]
    assert claim(store, 10) == []  # the next of the group waits for the prefetched head
    rec = c.tasks[0]
    store.complete([Outcome(first, c.token, rec.version, State.SUCCESS, attempt=1)])
    assert claimed_ids(claim(store, 10)) == [second]


def test_a_prefetched_chunk_stops_before_a_limited_member(store):
    store.set_limit(LimitSpec("api", concurrency=5))
    a, b, lim, d = submit(store, new(group="g"), new(group="g"), new(group="g", limits=("api",)), new(group="g"))
    (c,) = claim(store, 1, prefetch=True, chunk_size=10)
    assert claimed_ids([c]) == [a, b]
    assert status_of(store, lim) is State.PENDING and status_of(store, d) is State.PENDING
