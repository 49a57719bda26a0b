"""Adaptive limits in the store: the spec, the effective values and the
controller's state in the limit's row; the controller's writes fenced by
leadership; the workers' reports taken once; the waiting work that says a
limit was the bottleneck."""

from __future__ import annotations

import json

from corral.core.adaptive import AdaptiveSpec, Bounds, ControllerState, initial_state
from corral.core.claims import ClaimRequest
from corral.core.events import LIMIT_ADAPTED
from corral.core.model import LimitSpec

from .conftest import new, submit

SPEC = AdaptiveSpec(True, True, Bounds(1, 40, 1.0, 200.0))


def state(rate: float, concurrency: float) -> str:
    return json.dumps(ControllerState(rate, concurrency, w_max=rate, baseline_ms=12.5).to_dict())


def test_declared_adaptive_limit_starts_low_and_is_read_back(store):
    store.declare_adaptive(LimitSpec("api"), SPEC)
    (row,) = store.adaptive_limits().values()
    assert (row.name, row.spec, row.concurrency, row.rate, row.state) == ("api", SPEC, 2, "10/s", None)
    # the claims obey the effective values, in the limit's own columns
    got = store.limits()["api"]
    assert (got.concurrency, got.rate) == (2, "10/s")


def test_decision_is_stored_fenced_by_leadership(store, advance):
    store.declare_adaptive(LimitSpec("api"), SPEC)
    assert store.try_lead("sweeper", "leader-1", 10.0)
    assert not store.save_adaptive("api", "leader-2", "sweeper", state(50, 7), 7, "50/s", "{}")
    assert store.adaptive_limits()["api"].state is None
    assert store.save_adaptive("api", "leader-1", "sweeper", state(50, 7), 7, "50/s", '{"rate": 50}')
    row = store.adaptive_limits()["api"]
    assert (row.concurrency, row.rate) == (7, "50/s")
    assert row.state == ControllerState(50, 7, w_max=50, baseline_ms=12.5)
    assert (store.limits()["api"].concurrency, store.limits()["api"].rate) == (7, "50/s")
    (event,) = store.events(LIMIT_ADAPTED)
    assert (event.subject, json.loads(event.data)) == ("limit:api", {"rate": 50})
    # a leader whose leadership ran out writes nothing
    advance(11.0)
    assert store.try_lead("sweeper", "leader-2", 10.0)
    assert not store.save_adaptive("api", "leader-1", "sweeper", state(9, 1), 1, "9/s", None)
    assert store.adaptive_limits()["api"].concurrency == 7


def test_a_knob_not_adaptive_is_left_alone(store):
    spec = AdaptiveSpec(False, True, Bounds(1, 1, 1.0, 100.0))
    store.declare_adaptive(LimitSpec("api", concurrency=3), spec)
    assert store.try_lead("sweeper", "me", 10.0)
    assert store.save_adaptive("api", "me", "sweeper", state(20, 9), None, "20/s", None)
    got = store.limits()["api"]
    assert (got.concurrency, got.rate) == (3, "20/s")


def test_declared_again_keeps_what_was_learned_within_new_bounds(store, second_store):
    store.declare_adaptive(LimitSpec("api"), SPEC)
    assert store.try_lead("sweeper", "me", 10.0)
    learned = state(150, 30)
    assert store.save_adaptive("api", "me", "sweeper", learned, 30, "150/s", None)
    second_store.declare_adaptive(LimitSpec("api"), SPEC)  # another worker starting up
    row = store.adaptive_limits()["api"]
    assert (row.concurrency, row.rate, row.state) == (30, "150/s", ControllerState.from_dict(json.loads(learned)))
    smaller = AdaptiveSpec(True, True, Bounds(1, 20, 1.0, 100.0))
    second_store.declare_adaptive(LimitSpec("api"), smaller)
    row = store.adaptive_limits()["api"]
    assert (row.spec, row.concurrency, row.rate) == (smaller, 20, "100/s")


def test_fixed_values_end_the_adaptation(store):
    store.declare_adaptive(LimitSpec("api"), SPEC)
    store.set_limit(LimitSpec("api", concurrency=5))
    assert store.adaptive_limits() == {}
    assert store.try_lead("sweeper", "me", 10.0)
    assert not store.save_adaptive("api", "me", "sweeper", state(50, 7), 7, "50/s", None)
    assert store.limits()["api"].concurrency == 5


def test_reports_are_taken_once_in_order(store, advance):
    store.report_limits("w1", '{"api": {"seconds": 1.0, "calls": 3}}')
    store.report_limits("w2", '{"api": {"seconds": 1.0, "calls": 4}}')
    assert store.take_limit_reports() == [
        ("w1", '{"api": {"seconds": 1.0, "calls": 3}}'),
        ("w2", '{"api": {"seconds": 1.0, "calls": 4}}'),
    ]
    assert store.take_limit_reports() == []
    # with no leader taking them, a worker's old rows go as it writes new ones
    store.report_limits("w1", "{}")
    advance(120.0)
    store.report_limits("w1", '{"api": {}}')
    assert store.take_limit_reports() == [("w1", '{"api": {}}')]


def test_waiting_work_is_seen_per_limit(store):
    submit(store, new(limits=("api",)), new(limits=("db", "api")), new(limits=("later",), run_at=store.now() + 60))
    assert store.limits_waiting(["api", "db", "later", "none"]) == {"api", "db"}
    store.claim("w1", ClaimRequest(("default",), 5))
    assert store.limits_waiting(["api", "db"]) == set()


def test_initial_state_round_trips_through_the_row(store):
    store.declare_adaptive(LimitSpec("api"), SPEC)
    assert store.try_lead("sweeper", "me", 10.0)
    first = initial_state(SPEC.bounds, store.now(), rate=10.0, concurrency=2.0)
    assert store.save_adaptive("api", "me", "sweeper", json.dumps(first.to_dict()), 2, "10/s", None)
    assert store.adaptive_limits()["api"].state == first
