"""The places held under a limit, as the claim counts them, stay exact on
every path that starts or ends a running task: each path gives its place
back (and a place held on is still counted), under a plain limit and a key."""

from __future__ import annotations

import pytest

from corral.core.claims import ClaimRequest
from corral.core.gates import keyed_name, split_key
from corral.core.model import LimitSpec, Outcome
from corral.core.states import State
from corral.maintenance.recovery import sweep_once

from .conftest import claim, claimed_ids, expire_lease, finish, new, status_of, submit

PLAIN = "api"
KEYED = keyed_name("merchant", "m-1")


def limit_of(store, name: str) -> None:
    if name == PLAIN:
        store.set_limit(LimitSpec("api", concurrency=1))
    else:
        store.set_limit(LimitSpec("merchant", concurrency=1, per_key=True))


def held(store, name: str) -> int:
    """The places held under ``name`` (a key's are counted under its limit)."""
    return store.limit_usage().get(split_key(name)[0], 0)


@pytest.fixture(params=[PLAIN, KEYED], ids=["plain", "keyed"])
def name(request) -> str:
    return request.param


def one_held(store, name: str, **kw) -> tuple[list[int], object]:
    """Two tasks under ``name`` (concurrency 1): the first claimed, its place counted."""
    limit_of(store, name)
    ids = submit(store, *[new(limits=(name,), **kw) for _ in range(2)])
    (c,) = claim(store, 10)
    assert claimed_ids([c]) == ids[:1]
    assert held(store, name) == 1
    assert claim(store, 10) == []
    return ids, c.tasks[0]


def place_is_back(store, name: str, *waiting: int) -> None:
    """No place held; the next claim takes one of ``waiting`` (one only: the place)."""
    assert held(store, name) == 0
    got = claimed_ids(claim(store, 10))
    assert len(got) == 1 and got[0] in waiting, got
    assert held(store, name) == 1


@pytest.mark.parametrize(
    ("status", "kw"),
    [
        (State.SUCCESS, {}),
        (State.FAILED, {}),
        (State.TIMEOUT, {}),
        (State.CANCELED, {}),
        (State.RETRYING, {}),
        (State.PENDING, {"burn_attempt": False}),  # handed back
    ],
    ids=["success", "failed", "timeout", "canceled", "retrying", "handed-back"],
)
def test_each_outcome_gives_the_place_back(store, name, status, kw):
    extra = {"max_retries": 3} if status is State.RETRYING else {}
    ids, rec = one_held(store, name, **extra)
    assert finish(store, rec, status, **kw)
    place_is_back(store, name, *ids)  # a task back in line may come first again


def test_a_lease_taken_back_by_the_sweeper_gives_the_place_back(store, name, advance):
    ids, rec = one_held(store, name, max_retries=3)
    expire_lease(store, rec, advance)
    sweep_once(store)
    assert status_of(store, rec.id) is not State.RUNNING
    place_is_back(store, name, *ids)


def test_a_cancel_asked_of_a_running_task_holds_the_place_until_it_ends(store, name):
    ids, rec = one_held(store, name)
    store.cancel(rec.id)
    assert held(store, name) == 1
    assert claim(store, 10) == []
    assert finish(store, rec, State.CANCELED)
    place_is_back(store, name, ids[1])


def test_a_stale_outcome_leaves_the_count_alone(store, name):
    ids, rec = one_held(store, name)
    (ok,) = store.complete([Outcome(rec.id, "not-its-token", rec.version, State.SUCCESS)])
    assert not ok
    assert held(store, name) == 1
    assert finish(store, rec)
    place_is_back(store, name, ids[1])


def test_a_relayed_place_is_counted_once_and_given_back_at_the_end(store, name):
    limit_of(store, name)
    ids = submit(store, *[new(limits=(name,)) for _ in range(3)])
    (c,) = claim(store, 10)
    first = c.tasks[0]
    done = Outcome(first.id, first.lease_token, first.version, State.SUCCESS)
    _, got = store.complete_and_claim([done], [(name,)], "w", ClaimRequest(("default",), 10))
    if not got:  # a store that does not hand this place over: claimed anew
        assert held(store, name) == 0
        got = claim(store, 10)
    assert claimed_ids(got) == [ids[1]]
    assert held(store, name) == 1
    assert finish(store, got[0].tasks[0])
    place_is_back(store, name, ids[2])


def test_a_unit_of_several_tasks_holds_one_place_until_its_last_ends(store, name):
    limit_of(store, name)
    ids = submit(store, *[new(group="g", limits=(name,)) for _ in range(2)], new(limits=(name,)))
    (c,) = claim(store, 1, chunk_size=2)
    assert claimed_ids([c]) == ids[:2]
    assert held(store, name) == 1
    assert finish(store, c.tasks[0])
    assert held(store, name) == 1  # the unit's second task still holds it
    assert claim(store, 10) == []
    assert finish(store, store.get(ids[1]))
    place_is_back(store, name, ids[2])


def test_places_of_many_claims_are_each_counted(store):
    store.set_limit(LimitSpec("api", concurrency=3))
    submit(store, *[new(limits=("api", "db")) for _ in range(5)])
    got = claim(store, 10)
    assert len(got) == 3
    assert store.limit_usage().get("api") == 3
    assert store.limit_usage().get("db") == 3
    for c in got:
        assert finish(store, c.tasks[0])
    assert store.limit_usage().get("api", 0) == 0
    assert store.limit_usage().get("db", 0) == 0
