"""Keyed limits: one budget (concurrency, rate) per key of a limit, counted
and charged by every store's claim, across calls and store instances."""

from __future__ import annotations

from collections import Counter

from corral.core.claims import ClaimRequest
from corral.core.gates import keyed_name, split_key
from corral.core.model import LimitSpec

from .conftest import claim, finish, new, submit


def keyed(store, key: str, n: int, limit: str = "merchant", *more: str) -> list[int]:
    return submit(store, *[new(limits=(keyed_name(limit, key), *more)) for _ in range(n)])


def keys_of(claims) -> Counter:
    return Counter(split_key(n)[1] for c in claims for t in c.tasks for n in t.limits if split_key(n)[1])


def test_each_key_has_its_own_concurrency(store):
    store.set_limit(LimitSpec("merchant", concurrency=2))
    keyed(store, "a", 5)
    keyed(store, "b", 5)
    keyed(store, "c", 1)
    got = claim(store, 20)
    assert keys_of(got) == {"a": 2, "b": 2, "c": 1}
    assert claim(store, 20) == []
    assert store.limit_usage()["merchant"] == 5  # the keys' places summed: one line per limit
    assert store.busiest_keys(2) == {"merchant": [("a", 2), ("b", 2)]}
    assert "merchant\x1fa" not in store.limits()


def test_a_key_frees_its_own_place_only(store):
    store.set_limit(LimitSpec("merchant", concurrency=1))
    keyed(store, "a", 3)
    keyed(store, "b", 3)
    got = claim(store, 20)
    assert keys_of(got) == {"a": 1, "b": 1}
    done = next(c for c in got if keys_of([c]) == {"a": 1})
    assert finish(store, done.tasks[0])
    assert keys_of(claim(store, 20)) == {"a": 1}


def test_keys_hold_across_store_instances(store, second_store):
    store.set_limit(LimitSpec("merchant", concurrency=2))
    keyed(store, "a", 6)
    assert len(store.claim("w1", ClaimRequest(("default",), 1))) == 1
    assert len(second_store.claim("w2", ClaimRequest(("default",), 10))) == 1
    assert store.claim("w1", ClaimRequest(("default",), 10)) == []
    assert second_store.claim("w2", ClaimRequest(("default",), 10)) == []


def test_keyed_and_plain_limits_together(store):
    store.set_limit(LimitSpec("merchant", concurrency=2))
    store.set_limit(LimitSpec("partner", concurrency=3))
    keyed(store, "a", 4, "merchant", "partner")
    keyed(store, "b", 4, "merchant", "partner")
    got = claim(store, 20)
    assert len(got) == 3  # the plain limit's cap over both keys
    assert max(keys_of(got).values()) == 2


def test_each_key_has_its_own_rate(store, advance):
    store.set_limit(LimitSpec("merchant", rate="1/s"))
    keyed(store, "a", 3)
    keyed(store, "b", 3)
    assert keys_of(claim(store, 20)) == {"a": 1, "b": 1}
    assert claim(store, 20) == []
    assert set(store.limits()) == {"merchant"} and set(store.limit_tokens()) <= {"merchant"}
    advance(1.5)
    assert keys_of(claim(store, 20)) == {"a": 1, "b": 1}


def test_a_keys_rate_is_shared_by_store_instances(store, second_store, advance):
    store.set_limit(LimitSpec("merchant", rate="1/s"))
    keyed(store, "a", 3)
    assert len(store.claim("w1", ClaimRequest(("default",), 5))) == 1
    assert second_store.claim("w2", ClaimRequest(("default",), 5)) == []
    advance(1.5)
    assert len(second_store.claim("w2", ClaimRequest(("default",), 5))) == 1


def test_an_idle_keys_row_is_forgotten_and_its_budget_holds_across_it(store, advance):
    store.set_limit(LimitSpec("merchant", concurrency=1, rate="1/s"))
    keyed(store, "a", 4)
    keyed(store, "b", 1)
    first = claim(store, 20)
    assert keys_of(first) == {"a": 1, "b": 1}
    assert store.forget_keys() == 0  # the starts are in the window: the rows stay
    advance(1.5)
    assert store.forget_keys() == 2  # the window is empty again, running or not
    assert store.forget_keys() == 0
    assert claim(store, 20) == []  # a's place is still held: counted from its running task
    assert all(finish(store, t) for c in first for t in c.tasks)
    again = claim(store, 20)
    assert keys_of(again) == {"a": 1}  # back on next use with its whole budget
    assert finish(store, again[0].tasks[0])
    assert claim(store, 20) == []  # and its rate holds across it: one start a second
    assert store.forget_keys() == 0
    advance(1.5)
    assert keys_of(claim(store, 20)) == {"a": 1}


def test_a_hot_keys_backlog_does_not_delay_the_other_keys(store):
    # one hot key's 10 000 tasks are submitted first, then 50 keys with 2
    # each: the others start in the first claims, beside the hot key's own
    # budget, not after its backlog
    store.set_limit(LimitSpec("merchant", concurrency=2))
    submit(store, *[new(limits=(keyed_name("merchant", "hot"),)) for _ in range(10_000)])
    for k in range(50):
        keyed(store, f"k{k}", 2)
    started: list[str] = []  # the keys in the order their tasks started
    for _ in range(20):
        got = claim(store, 20)
        started += [split_key(t.limits[0])[1] for c in got for t in c.tasks]
        for c in got:
            for t in c.tasks:
                assert finish(store, t)
        if sum(k != "hot" for k in started) == 100:
            break
    others = [i for i, k in enumerate(started) if k != "hot"]
    assert len(others) == 100
    assert started[: others[-1]].count("hot") <= 2 * 7  # at most its budget per claim meanwhile


def test_keys_are_served_in_turn_a_hot_key_with_room_does_not_take_the_claims(store):
    # the hot key's 1 000 tasks come first and its budget never binds; 50
    # cold keys have one task each: a claim serves each key once before any
    # key twice, so the cold keys all start within the first claims
    store.set_limit(LimitSpec("merchant", concurrency=10_000))
    keyed(store, "hot", 1000)
    for k in range(50):
        keyed(store, f"cold{k}", 1)
    claims = [keys_of(claim(store, 10)) for _ in range(6)]
    cold = Counter()
    for got in claims:
        assert sum(got.values()) == 10
        assert got["hot"] >= 1  # served in its turn too, never starved
        cold.update({k: n for k, n in got.items() if k != "hot"})
    assert cold == {f"cold{k}": 1 for k in range(50)}


def test_a_claim_is_not_short_when_many_keys_have_room_behind_long_backlogs(store):
    # 30 keys of 40 tasks each, one key after another: each key has room for
    # one; a claim of 20 takes 20 units, one per key, not only those of the
    # keys whose tasks came first
    store.set_limit(LimitSpec("merchant", concurrency=1))
    for k in range(30):
        keyed(store, f"k{k}", 40)
    got = keys_of(claim(store, 20))
    assert got == {f"k{k}": 1 for k in range(20)}
    got = keys_of(claim(store, 20))
    assert got == {f"k{k}": 1 for k in range(20, 30)}
