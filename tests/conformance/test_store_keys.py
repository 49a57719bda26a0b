"""Keys on the submit path: debounce (one PENDING task per task name and debounce
key, the last arguments, run_at pushed out up to a bound) and supersede (a newer
submit cancels the queued ones of its key and asks a running one to stop)."""

from __future__ import annotations

import json

from corral.core.model import SUPERSEDED
from corral.core.states import State

from .conftest import claim, claim_one, finish, new


def args_of(n: int) -> str:
    return json.dumps({"args": [n], "kwargs": {}}, separators=(",", ":"))


def debounced(n: int, key: str = "shop-7", name: str = "reindex", *, window: float = 5.0, bound: float | None = 60.0):
    return new(name, args=args_of(n), debounce_key=key, debounce=window, debounce_max=bound)


def test_debounced_submits_collapse_into_one_task_with_the_last_arguments(store, advance):
    (first,) = store.submit([debounced(1)])
    assert first.created
    advance(2)
    (second,) = store.submit([debounced(2)])
    (third,) = store.submit([debounced(3)])
    assert second.id == third.id == first.id
    assert not second.created and not third.created
    rec = store.get(first.id)
    assert rec.status is State.PENDING
    assert rec.args == args_of(3)
    assert claim(store) == []  # 5 s of quiet after the last submit have not passed
    advance(3.0)  # margins for the real time a loaded PostgreSQL run takes between steps
    assert claim(store) == []
    advance(2.5)
    got = claim_one(store)
    assert got.id == first.id and got.args == args_of(3)


def test_debounce_never_waits_past_its_bound_from_the_first_submit(store, advance):
    (first,) = store.submit([debounced(0, window=5.0, bound=12.0)])
    for n in range(1, 5):  # a submit every 4 s: never 5 s of quiet
        advance(4)
        (r,) = store.submit([debounced(n, window=5.0, bound=12.0)])
        assert r.id == first.id
    # 16 s after the first submit; the bound (12 s) has passed
    got = claim_one(store)
    assert got.id == first.id and got.args == args_of(4)


def test_a_claimed_debounced_task_starts_a_new_group(store, advance):
    (first,) = store.submit([debounced(1)])
    advance(6)
    running = claim_one(store)
    assert running.id == first.id
    (second,) = store.submit([debounced(2)])
    assert second.created and second.id != first.id
    (third,) = store.submit([debounced(3)])
    assert third.id == second.id
    assert store.get(first.id).args == args_of(1)  # the running one keeps its arguments
    finish(store, running)
    advance(6)
    assert claim_one(store).args == args_of(3)


def test_debounce_keys_are_per_task_name_and_key(store):
    a = store.submit([debounced(1, key="k1")])[0].id
    b = store.submit([debounced(2, key="k2")])[0].id
    c = store.submit([debounced(3, key="k1", name="other")])[0].id
    d = store.submit([debounced(4, key="k1")])[0].id
    assert len({a, b, c}) == 3 and d == a


def test_debounce_within_one_submit_call(store):
    results = store.submit([debounced(1), debounced(2), new("plain")])
    assert results[0].id == results[1].id
    assert results[0].created and not results[1].created
    assert store.get(results[0].id).args == args_of(2)


def test_supersede_cancels_the_queued_tasks_of_its_key(store):
    a = store.submit([new("render", supersede_key="doc-9")])[0].id
    b = store.submit([new("render", supersede_key="doc-9", run_at=store.now() + 100)])[0].id
    other_key = store.submit([new("render", supersede_key="doc-8")])[0].id
    other_name = store.submit([new("preview", supersede_key="doc-9")])[0].id
    c = store.submit([new("render", supersede_key="doc-9")])[0].id
    for old in (a, b):
        rec = store.get(old)
        assert rec.status is State.CANCELED
        assert rec.error == SUPERSEDED
        assert rec.finished_at is not None
    for kept in (c, other_key, other_name):
        assert store.get(kept).status is State.PENDING


def test_supersede_asks_a_running_task_to_stop(store):
    a = store.submit([new("render", supersede_key="doc-9")])[0].id
    running = claim_one(store)
    assert running.id == a
    assert store.cancel_requested([a]) == set()
    b = store.submit([new("render", supersede_key="doc-9")])[0].id
    assert store.cancel_requested([a]) == {a}
    assert store.get(a).status is State.RUNNING  # the worker ends it
    assert store.get(b).status is State.PENDING
    assert finish(store, running, State.CANCELED, error=SUPERSEDED)
    assert claim_one(store).id == b


def test_supersede_frees_a_group_line(store):
    a = store.submit([new("render", group="g", supersede_key="doc-9")])[0].id
    b = store.submit([new("render", group="g", supersede_key="doc-9")])[0].id
    assert store.get(a).status is State.CANCELED
    assert claim_one(store).id == b  # the line's head moved past the canceled task


def test_supersede_leaves_finished_tasks_alone(store):
    a = store.submit([new("render", supersede_key="doc-9")])[0].id
    finish(store, claim_one(store))
    store.submit([new("render", supersede_key="doc-9")])
    assert store.get(a).status is State.SUCCESS
