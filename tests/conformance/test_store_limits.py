"""Named concurrency limits count claims RUNNING, across calls and store instances."""

from __future__ import annotations

from corral.core.claims import ClaimRequest
from corral.core.model import LimitSpec
from corral.core.states import State

from .conftest import claim, claimed_ids, finish, new, status_of, submit, submit_one


def limited(store, n: int, limit: str = "api", **kw) -> list[int]:
    return submit(store, *[new(limits=(limit,), **kw) for _ in range(n)])


def test_set_limit_is_listed(store):
    store.set_limit(LimitSpec("api", concurrency=2))
    store.set_limit(LimitSpec("db", concurrency=7, rate="10/s"))
    got = store.limits()
    assert got["api"].concurrency == 2
    assert got["db"].concurrency == 7
    assert got["db"].rate == "10/s"
    store.set_limit(LimitSpec("api", concurrency=5))
    assert store.limits()["api"].concurrency == 5


def test_concurrency_limit_caps_one_claim_call(store):
    store.set_limit(LimitSpec("api", concurrency=2))
    limited(store, 6)
    got = claim(store, 10)
    assert len(got) == 2
    assert store.limit_usage().get("api") == 2


def test_concurrency_limit_holds_across_claim_calls(store):
    store.set_limit(LimitSpec("api", concurrency=2))
    ids = limited(store, 6)
    assert len(claim(store, 1)) == 1
    assert len(claim(store, 1)) == 1
    assert claim(store, 10) == []
    assert store.counts().get("RUNNING", 0) == 2
    assert [status_of(store, i) for i in ids].count(State.PENDING) == 4


def test_full_limit_is_skipped_not_blocking(store):
    store.set_limit(LimitSpec("api", concurrency=1))
    a, b = limited(store, 2)
    free = submit_one(store, "free")
    got = claim(store, 10)
    assert sorted(claimed_ids(got)) == sorted([a, free])
    assert status_of(store, b) is State.PENDING


def test_completing_frees_a_slot(store):
    store.set_limit(LimitSpec("api", concurrency=2))
    ids = limited(store, 5)
    got = claim(store, 10)
    assert len(got) == 2
    assert finish(store, got[0].tasks[0])
    assert store.limit_usage().get("api") == 1
    more = claim(store, 10)
    assert len(more) == 1
    assert store.limit_usage().get("api") == 2
    assert claim(store, 10) == []
    assert len(set(claimed_ids(got + more))) == 3
    assert all(i in ids for i in claimed_ids(got + more))


def test_retrying_and_hand_back_free_the_slot(store):
    store.set_limit(LimitSpec("api", concurrency=1))
    limited(store, 3, max_retries=2)
    (c,) = claim(store, 10)
    assert finish(store, c.tasks[0], State.RETRYING, run_at=store.now() + 3600)
    (c2,) = claim(store, 10)
    assert finish(store, c2.tasks[0], State.PENDING, burn_attempt=False)
    (c3,) = claim(store, 10)
    assert c3.tasks[0].id != c.tasks[0].id  # still waiting for its backoff
    assert claim(store, 10) == []
    assert store.limit_usage().get("api") == 1


def test_limit_usage_counts_per_limit(store):
    store.set_limit(LimitSpec("api", concurrency=10))
    store.set_limit(LimitSpec("db", concurrency=10))
    limited(store, 3, "api")
    limited(store, 1, "db")
    submit(store, new(limits=("api", "db")))
    assert store.limit_usage() == {}  # pinned: a limit with no claim is absent
    claim(store, 10)
    usage = store.limit_usage()
    assert usage.get("api") == 4
    assert usage.get("db") == 2


def test_task_with_two_limits_needs_both(store):
    store.set_limit(LimitSpec("api", concurrency=5))
    store.set_limit(LimitSpec("db", concurrency=1))
    first = submit_one(store, limits=("db",))
    both = submit_one(store, limits=("api", "db"))
    api_only = submit_one(store, limits=("api",))
    got = claim(store, 10)
    assert sorted(claimed_ids(got)) == sorted([first, api_only])
    assert status_of(store, both) is State.PENDING


def test_a_chunk_counts_as_one(store):
    store.set_limit(LimitSpec("api", concurrency=2))
    chunk = submit(store, *[new(group="g", limits=("api",)) for _ in range(4)])
    singles = limited(store, 3)
    got = claim(store, 10, chunk_size=4)
    assert len(got) == 2
    by_size = sorted(got, key=lambda c: -len(c.tasks))
    assert [t.id for t in by_size[0].tasks] == chunk
    assert claimed_ids([by_size[1]]) == [singles[0]]
    assert store.limit_usage().get("api") == 2
    assert claim(store, 10, chunk_size=4) == []


def test_limit_holds_across_store_instances(store, second_store):
    store.set_limit(LimitSpec("api", concurrency=2))
    assert second_store.limits()["api"].concurrency == 2
    limited(store, 6)
    assert len(store.claim("w1", ClaimRequest(["default"], 1))) == 1
    assert len(second_store.claim("w2", ClaimRequest(["default"], 10))) == 1
    assert store.claim("w1", ClaimRequest(["default"], 10)) == []
    assert second_store.claim("w2", ClaimRequest(["default"], 10)) == []
    assert second_store.limit_usage().get("api") == 2
