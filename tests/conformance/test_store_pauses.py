"""Pauses by hand (``Store.pause``/``resume``): a paused queue, group or limit
is never claimed, a group keeps its order, attempts are untouched, a resume
frees the work; across store instances, on every store."""

from __future__ import annotations

import json

from corral.core.claims import ClaimRequest
from corral.core.gates import keyed_name
from corral.core.model import LimitSpec
from corral.core.states import State

from .conftest import claim, claimed_ids, finish, new, submit, submit_one


def test_a_paused_queue_is_never_claimed_and_a_resume_frees_it(store):
    a, b = submit(store, new(queue="emails"), new(queue="emails"))
    other = submit_one(store, queue="default")
    assert store.pause("queue", "emails", "ops")
    assert claimed_ids(claim(store, 10, queues=("emails", "default"))) == [other]
    for _ in range(2):  # whichever path a claim takes (the plain one included)
        assert claim(store, 10, queues=("emails",)) == []
        assert claim(store, 10, queues=("emails",), prefetch=True) == []
    assert [store.get(t).attempt for t in (a, b)] == [0, 0]
    assert [(p.kind, p.name, p.by) for p in store.pauses()] == [("queue", "emails", "ops")]
    assert store.resume("queue", "emails")
    assert store.pauses() == []
    got = claim(store, 10, queues=("emails",))
    assert claimed_ids(got) == [a, b] and [c.tasks[0].attempt for c in got] == [1, 1]


def test_pausing_twice_and_resuming_what_is_not_paused_say_so(store):
    assert store.pause("queue", "nothing-here-yet")  # no tasks needed
    assert not store.pause("queue", "nothing-here-yet")
    assert store.resume("queue", "nothing-here-yet")
    assert not store.resume("queue", "nothing-here-yet")
    assert not store.resume("group", "never")


def test_a_paused_group_keeps_its_order_and_other_groups_flow(store):
    g = submit(store, *[new(group="g", queue="q") for _ in range(3)])
    h = submit(store, new(group="h", queue="q"))
    store.pause("group", "g")
    assert claimed_ids(claim(store, 10, queues=("q",))) == h
    assert claim(store, 10, queues=("q",), chunk_size=5) == []
    assert [store.get(t).attempt for t in g] == [0, 0, 0]
    store.resume("group", "g")
    order = []
    for _ in range(3):
        (c,) = claim(store, 10, queues=("q",))
        order += [t.id for t in c.tasks]
        for t in c.tasks:
            assert finish(store, t)
    assert order == g


def test_a_paused_group_holds_its_place_behind_a_running_head(store):
    g = submit(store, *[new(group="g") for _ in range(2)])
    (c,) = claim(store, 1)
    store.pause("group", "g")
    assert finish(store, c.tasks[0])  # a running task finishes normally
    assert claim(store, 10) == []  # and nothing after it starts
    store.resume("group", "g")
    assert claimed_ids(claim(store, 10)) == [g[1]]


def test_a_chunk_stops_at_a_member_under_a_paused_limit(store):
    a, b, c = submit(store, new(group="g"), new(group="g", limits=("api",)), new(group="g"))
    store.pause("limit", "api")
    (unit,) = claim(store, 10, chunk_size=5)
    assert [t.id for t in unit.tasks] == [a]  # b waits at the head of its line, c behind it
    assert finish(store, unit.tasks[0])
    assert claim(store, 10, chunk_size=5) == []
    store.resume("limit", "api")
    assert claimed_ids(claim(store, 10, chunk_size=5)) == [b, c]


def test_a_paused_limit_holds_its_tasks_and_every_key_of_a_keyed_one(store):
    store.set_limit(LimitSpec("api", concurrency=5))
    store.set_limit(LimitSpec("merchant", concurrency=5))
    limited = submit(store, new(limits=("api",)), new(limits=("api", "other")))
    keyed = submit(store, new(limits=(keyed_name("merchant", "m1"),)), new(limits=(keyed_name("merchant", "m2"),)))
    free = submit_one(store)
    store.pause("limit", "api")
    store.pause("limit", "merchant")
    assert claimed_ids(claim(store, 10)) == [free]
    assert claim(store, 10) == []
    store.resume("limit", "merchant")
    assert sorted(claimed_ids(claim(store, 10))) == keyed
    store.resume("limit", "api")
    assert sorted(claimed_ids(claim(store, 10))) == limited


def test_a_pause_by_hand_and_a_429_pause_are_apart(store, advance):
    store.set_limit(LimitSpec("api", concurrency=5))
    a, b = submit(store, new(limits=("api",)), new(limits=("api",)))
    (c,) = claim(store, 1)
    store.pause("limit", "api")
    # a 429 pauses the limit for 30 s, and the pause by hand is still there after it
    assert finish(
        store, c.tasks[0], State.RETRYING, run_at=store.now() + 1, snooze=True, pause_limits=30.0, error="429"
    )
    advance(31)
    assert claim(store, 10) == []
    assert [p.name for p in store.pauses()] == ["api"]
    # resumed by hand, the limit's own pause (another 429) still holds
    assert store.resume("limit", "api")
    (c,) = claim(store, 1)
    assert finish(
        store, c.tasks[0], State.RETRYING, run_at=store.now() + 1, snooze=True, pause_limits=30.0, error="429"
    )
    assert claim(store, 10) == []
    advance(31)
    assert sorted(claimed_ids(claim(store, 10))) == [a, b]


def test_a_pause_holds_across_store_instances(store, second_store):
    a = submit_one(store, queue="emails")
    store.pause("queue", "emails")
    assert second_store.claim("w2", ClaimRequest(("emails",), 5)) == []
    assert [p.name for p in second_store.pauses()] == ["emails"]
    assert second_store.resume("queue", "emails")
    assert claimed_ids(claim(store, 5, queues=("emails",))) == [a]


def test_pause_and_resume_are_events(store):
    store.pause("group", "g", "ops@host")
    store.resume("group", "g", "ops@host")
    store.resume("group", "g")  # not paused: no event
    evs = list(reversed(store.events(kind="pause")))
    assert [e.subject for e in evs] == ["group:g", "group:g"]
    assert [json.loads(e.data) for e in evs] == [
        {"kind": "group", "name": "g", "paused": True, "by": "ops@host"},
        {"kind": "group", "name": "g", "paused": False, "by": "ops@host"},
    ]
