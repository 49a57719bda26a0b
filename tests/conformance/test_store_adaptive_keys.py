"""A keyed adaptive limit's keys in the store: each key's decided values and
controller state in its row, written fenced by leadership, read back by the
keeper and by every claim (gating that key only), with the keeper's events in
the same write, and kept through a forget while the key had a call lately."""

from __future__ import annotations

import json
from collections import Counter

from corral.core.adaptive import AdaptiveSpec, Bounds, ControllerState, KeyState, key_state_json, key_state_of
from corral.core.events import LIMIT_ADAPTED, LIMIT_KEY_ADAPTED
from corral.core.gates import keyed_name, split_key
from corral.core.model import LimitSpec

from .conftest import claim, finish, new, submit

#: the limit starts at a twentieth of its bounds: 2 places, 10/s
SPEC = AdaptiveSpec(True, True, Bounds(1, 40, 1.0, 200.0))


def keyed(store, key: str, n: int) -> list[int]:
    return submit(store, *[new(limits=(keyed_name("merchant", key),)) for _ in range(n)])


def keys_of(claims) -> Counter:
    return Counter(split_key(n)[1] for c in claims for t in c.tasks for n in t.limits if split_key(n)[1])


def cut(store) -> tuple[str, KeyState]:
    """A key's state as the keeper writes it after a throttle: one place, 1/s, seen now."""
    key = KeyState(ControllerState(1.0, 1.0, w_max=1.1), seen=store.now())
    return key_state_json(key), key


def test_a_keys_decided_values_are_written_fenced_and_read_back(store, advance):
    store.declare_adaptive(LimitSpec("merchant", per_key=True), SPEC)
    assert store.limits()["merchant"].per_key
    assert store.try_lead("sweeper", "leader-1", 10.0)
    text, state = cut(store)
    # a process that does not lead writes nothing
    assert not store.save_adaptive_keys("merchant", "leader-2", "sweeper", {"m-1": (text, 1, "1/s")})
    assert store.adaptive_keys("merchant") == {}
    assert store.save_adaptive_keys("merchant", "leader-1", "sweeper", {"m-1": (text, 1, "1/s")})
    assert {k: key_state_of(v) for k, v in store.adaptive_keys("merchant").items()} == {"m-1": state}
    # a leader whose leadership ran out writes nothing either
    advance(11.0)
    assert store.try_lead("sweeper", "leader-2", 10.0)
    assert not store.save_adaptive_keys("merchant", "leader-1", "sweeper", {"m-1": (None, None, None)})
    assert set(store.adaptive_keys("merchant")) == {"m-1"}
    # a limit that is not adaptive has no keys to learn
    store.set_limit(LimitSpec("plain", concurrency=2, per_key=True))
    assert not store.save_adaptive_keys("plain", "leader-2", "sweeper", {"m-1": (text, 1, "1/s")})


def test_a_keys_own_values_gate_that_key_only_in_a_claim(store):
    store.declare_adaptive(LimitSpec("merchant", per_key=True), SPEC)
    assert store.try_lead("sweeper", "me", 10.0)
    text, _ = cut(store)
    assert store.save_adaptive_keys("merchant", "me", "sweeper", {"m-1": (text, 1, "1/s")})
    keyed(store, "m-1", 5)
    keyed(store, "m-2", 5)
    # m-1 runs under its own one place and 1/s; m-2 under the limit's 2 places and 10/s
    assert keys_of(claim(store, 20)) == {"m-1": 1, "m-2": 2}
    assert claim(store, 20) == []
    # the key cleared: it runs under the limit's values again
    assert store.save_adaptive_keys("merchant", "me", "sweeper", {"m-1": (None, None, None)})
    assert store.adaptive_keys("merchant") == {}


def test_fixed_values_end_the_keys_learning_too(store):
    store.declare_adaptive(LimitSpec("merchant", per_key=True), SPEC)
    assert store.try_lead("sweeper", "me", 10.0)
    text, _ = cut(store)
    assert store.save_adaptive_keys("merchant", "me", "sweeper", {"m-1": (text, 1, "1/s")})
    store.set_limit(LimitSpec("merchant", concurrency=3, per_key=True))
    assert store.adaptive_keys("merchant") == {}
    keyed(store, "m-1", 5)
    assert keys_of(claim(store, 20)) == {"m-1": 3}  # the limit's 3 places, not the key's learned one


def test_a_recently_used_key_survives_a_forget_then_goes_when_idle(store, advance):
    store.declare_adaptive(LimitSpec("merchant", per_key=True), SPEC)
    assert store.try_lead("sweeper", "me", 1000.0)
    text, _ = cut(store)
    assert store.save_adaptive_keys("merchant", "me", "sweeper", {"m-1": (text, 1, "1/s")})
    keyed(store, "m-1", 3)
    keyed(store, "m-2", 4)
    got = claim(store, 20)
    assert keys_of(got) == {"m-1": 1, "m-2": 2}
    for c in got:
        assert finish(store, c.tasks[0])
    advance(30.0)  # every bucket full again: a row without a learned state is at rest
    store.forget_keys()
    assert set(store.adaptive_keys("merchant")) == {"m-1"}
    # the kept row still gates the key with what it learned
    assert keys_of(claim(store, 20)) == {"m-1": 1, "m-2": 2}
    advance(400.0)  # 300 s past the key's last call: forgotten, as a row at rest is
    store.forget_keys()
    assert store.adaptive_keys("merchant") == {}


def test_the_keys_work_waits_under_are_found_in_one_look(store):
    keyed(store, "m-1", 2)
    submit(store, new(limits=("plain",)))
    asked = [keyed_name("merchant", k) for k in ("m-1", "m-2")] + ["plain", "other"]
    assert store.limits_waiting(asked) == {keyed_name("merchant", "m-1"), "plain"}


def test_keys_events_go_in_their_fenced_write(store, advance):
    store.declare_adaptive(LimitSpec("merchant", per_key=True), SPEC)
    assert store.try_lead("sweeper", "leader-1", 10.0)
    text, _ = cut(store)
    said = {"m-1": json.dumps({"limit": "merchant", "key": "m-1", "rate": 1.0})}
    # fenced out: neither the key's values nor its event
    assert not store.save_adaptive_keys("merchant", "leader-2", "sweeper", {"m-1": (text, 1, "1/s")}, said)
    assert store.events(LIMIT_KEY_ADAPTED) == []
    assert store.save_adaptive_keys(
        "merchant", "leader-1", "sweeper", {"m-1": (text, 1, "1/s"), "m-2": (text, 1, "1/s")}, said
    )
    (event,) = store.events(LIMIT_KEY_ADAPTED)
    assert event.subject == "limit:merchant:key:m-1" and event.details == {
        "limit": "merchant",
        "key": "m-1",
        "rate": 1.0,
    }
    assert store.events(LIMIT_ADAPTED) == []
    # without events, none is written
    assert store.save_adaptive_keys("merchant", "leader-1", "sweeper", {"m-1": (text, 1, "1/s")})
    assert len(store.events(LIMIT_KEY_ADAPTED)) == 1
