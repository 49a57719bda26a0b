"""Flow control in the claim and complete paths: token-bucket rates, pauses
from a 429's Retry-After, snoozes, and circuit breakers, on every store.
Time moves only by ``advance``."""

from __future__ import annotations

import pytest

from corral.core.breaker import BreakerConfig, BreakerState
from corral.core.claims import ClaimRequest
from corral.core.model import LimitSpec, Outcome, TaskFilter
from corral.core.states import State

from .conftest import claim, claimed_ids, finish, new, status_of, submit, submit_one


def rated(store, n: int, limit: str = "api", **kw) -> list[int]:
    return submit(store, *[new(limits=(limit,), **kw) for _ in range(n)])


# ---- rates ------------------------------------------------------------------------------
def test_rate_caps_the_claims_to_the_burst_then_refills(store, advance):
    # slow rates: PostgreSQL's clock also moves while the test runs
    store.set_limit(LimitSpec("api", rate="30/m", burst=3))
    rated(store, 10)
    assert len(claim(store, 10)) == 3  # a full bucket: the burst
    assert claim(store, 10) == []  # no token: nothing claimed, nothing burned
    advance(5)  # 2.5 tokens
    assert len(claim(store, 10)) == 2
    assert claim(store, 10) == []
    advance(600)  # refills up to the burst only
    assert len(claim(store, 10)) == 3


def test_rate_is_shared_by_store_instances(store, second_store, advance):
    store.set_limit(LimitSpec("api", rate="2/m", burst=2))
    rated(store, 6)
    assert len(store.claim("w1", ClaimRequest(["default"], 1))) == 1
    assert len(second_store.claim("w2", ClaimRequest(["default"], 10))) == 1
    assert store.claim("w1", ClaimRequest(["default"], 10)) == []
    assert second_store.claim("w2", ClaimRequest(["default"], 10)) == []


def test_rate_limited_task_keeps_its_attempts_and_others_flow(store, advance):
    store.set_limit(LimitSpec("api", rate="1/m", burst=1))
    a, b = rated(store, 2, max_retries=0)
    free = submit_one(store, "free")
    got = claim(store, 10)
    assert sorted(claimed_ids(got)) == sorted([a, free])
    for _ in range(3):
        assert claim(store, 10) == []
    rec = store.get(b)
    assert rec.status is State.PENDING and rec.attempt == 0
    advance(60)
    (c,) = claim(store, 10)
    assert c.tasks[0].id == b and c.tasks[0].attempt == 1


def test_rate_and_concurrency_combine(store, advance):
    store.set_limit(LimitSpec("api", concurrency=2, rate="100/s", burst=100))
    rated(store, 5)
    got = claim(store, 10)
    assert len(got) == 2  # concurrency binds
    store.set_limit(LimitSpec("api", concurrency=50, rate="1/m", burst=1))
    advance(5)
    assert len(claim(store, 10)) == 1  # the rate binds


def test_a_unit_under_a_rate_is_never_chunked(store, advance):
    store.set_limit(LimitSpec("api", rate="10/m", burst=2))
    ids = submit(store, *[new(group="g", limits=("api",)) for _ in range(4)])
    (c,) = claim(store, 10, chunk_size=4)
    assert [t.id for t in c.tasks] == ids[:1]  # one task, one token
    assert finish(store, c.tasks[0])
    (c2,) = claim(store, 10, chunk_size=4)
    assert [t.id for t in c2.tasks] == ids[1:2]
    assert finish(store, c2.tasks[0])
    assert claim(store, 10, chunk_size=4) == []  # group order holds while it waits for a token
    assert status_of(store, ids[2]) is State.PENDING
    advance(6.6)
    (c3,) = claim(store, 10, chunk_size=4)
    assert [t.id for t in c3.tasks] == ids[2:3]


def test_rate_blocked_claim_tells_wait_for_work_when_a_token_comes(store, advance):
    import time

    store.set_limit(LimitSpec("api", rate="1/s", burst=1))
    rated(store, 3)
    assert len(claim(store, 10)) == 1
    assert claim(store, 10) == []
    t0 = time.monotonic()
    store.wait_for_work(30.0)  # a token is at most a second away: it must not wait the whole poll
    assert time.monotonic() - t0 < 10.0


def test_a_rate_holds_n_starts_in_any_sliding_second_by_default(store, store_kind, clock, advance):
    """``rate="20/s"`` with no burst: never 21 starts within a second, however
    the claims fall; and the rate is used. Claims ask for far more than the
    rate at uneven steps of store time."""
    import random

    from corral.edges.partner import max_in_window

    store.set_limit(LimitSpec("api", rate="20/s"))
    rated(store, 200)
    rng = random.Random(28)
    shifted = 0.0  # PostgreSQL: the time moved by shifting stored times
    starts: list[float] = []
    while shifted < 5.0:
        got = claimed_ids(claim(store, 50))
        at = clock.time() if store_kind != "postgres" else store.now() + shifted
        starts += [at] * len(got)
        step = rng.choice((0.003, 0.011, 0.02, 0.05, 0.2, 0.37))
        advance(step)
        shifted += step
    # PostgreSQL's time of a start is read here, a round trip from the claim's own
    slack = 0.0 if store_kind != "postgres" else 0.01
    assert max_in_window(sorted(starts), 1.0 - slack) <= 20
    # and by the start times the store wrote
    written = sorted(r.started_at for r in store.list_tasks(TaskFilter(limit=500)) if r.started_at is not None)
    assert max_in_window(written, 1.0) <= 20
    assert len(starts) > 20  # and it lets tasks through, second after second


def test_a_rate_says_when_it_lets_the_next_task_start(store, advance):
    """``limit_frees_at()``: the store time a fake clock moves to for the next start."""
    store.set_limit(LimitSpec("api", rate="2/m"))  # slow: PostgreSQL's clock moves meanwhile
    rated(store, 5)
    assert store.limit_frees_at() == {}
    assert len(claim(store, 10)) == 2
    assert claim(store, 10) == []
    wait = store.limit_frees_at()["api"] - store.now()
    assert 59.0 < wait <= 60.0 + 60.0 / 50 + 0.1  # the window: a minute from the starts' slice
    advance(wait - 1.0)
    assert claim(store, 10) == []
    advance(1.1)
    assert len(claim(store, 10)) == 2
    assert set(store.limit_frees_at()) == {"api"}


# ---- pauses and snoozes ------------------------------------------------------------------
def test_a_429_pauses_the_whole_limit_and_snoozes_the_task(store, advance):
    store.set_limit(LimitSpec("api", concurrency=5))
    a, b = rated(store, 2)
    free = submit_one(store, "free")
    rec = claim(store, 1)[0].tasks[0]
    assert rec.id == a
    assert finish(store, rec, State.RETRYING, run_at=store.now() + 30, snooze=True, pause_limits=30.0, error="429")
    after = store.get(a)
    assert after.attempt == 0 and after.snoozes == 1
    assert store.limits()["api"].paused_until is not None
    assert claimed_ids(claim(store, 10)) == [free]  # b waits: its limit is paused
    assert status_of(store, b) is State.PENDING
    advance(31)
    assert sorted(claimed_ids(claim(store, 10))) == sorted([a, b])


def test_snooze_gives_the_attempt_back(store, advance):
    tid = submit_one(store, max_retries=0)
    for n in range(1, 4):
        rec = claim(store)[0].tasks[0]
        assert rec.attempt == 1
        assert finish(store, rec, State.RETRYING, run_at=store.now(), snooze=True)
        got = store.get(tid)
        assert (got.attempt, got.snoozes, got.status) == (0, n, State.RETRYING)


# ---- breakers ----------------------------------------------------------------------------
CFG = BreakerConfig(failure_ratio=0.5, min_calls=4, window=60.0, cooldown=30.0, probes=2)


def run_calls(store, n: int, failed: bool) -> None:
    for c in claim(store, n):
        for t in c.tasks:
            status = State.FAILED if failed else State.SUCCESS
            assert finish(store, t, status, breaker_failure=failed)


@pytest.mark.parametrize("on", ["limit", "task"])
def test_breaker_opens_on_failures_then_probes_then_closes(store, advance, on):
    store.set_limit(LimitSpec("api", concurrency=100))
    name = "api" if on == "limit" else "call_partner"
    store.set_breaker(name, CFG)
    rated(store, 20, name="call_partner")
    run_calls(store, 4, failed=True)
    assert store.breakers()[name][1].state is BreakerState.OPEN
    assert claim(store, 10) == []  # OPEN: nothing claimed, nothing failed
    queued = store.counts().get("PENDING", 0)
    assert queued == 16
    advance(31)
    probes = claim(store, 10)
    assert len(probes) == 2  # exactly `probes` pass in HALF_OPEN
    assert claim(store, 10) == []
    for c in probes:
        assert finish(store, c.tasks[0], State.SUCCESS, breaker_failure=False)
    assert store.breakers()[name][1].state is BreakerState.CLOSED
    assert len(claim(store, 10)) == 10
    kinds = [(e.before, e.after) for e in store.breaker_events(name)]
    assert kinds[:3] == [("HALF_OPEN", "CLOSED"), ("OPEN", "HALF_OPEN"), ("CLOSED", "OPEN")]
    opened = store.breaker_events(name)[2]
    assert (opened.calls, opened.failures) == (4, 4)


def test_probes_are_shared_by_store_instances(store, second_store, advance):
    store.set_breaker("call_partner", CFG)
    submit(store, *[new("call_partner") for _ in range(10)])
    run_calls(store, 4, failed=True)
    advance(31)
    assert len(store.claim("w1", ClaimRequest(["default"], 1))) == 1
    assert len(second_store.claim("w2", ClaimRequest(["default"], 10))) == 1
    assert store.claim("w1", ClaimRequest(["default"], 10)) == []
    assert second_store.claim("w2", ClaimRequest(["default"], 10)) == []


def test_a_failed_probe_reopens_with_a_longer_cooldown(store, advance):
    store.set_breaker("call_partner", CFG)
    submit(store, *[new("call_partner") for _ in range(10)])
    run_calls(store, 4, failed=True)
    advance(31)
    probe = claim(store, 1)[0].tasks[0]
    assert finish(store, probe, State.FAILED, breaker_failure=True)
    cfg, state = store.breakers()["call_partner"]
    assert state.state is BreakerState.OPEN and state.cooldown == 60.0
    advance(31)
    assert claim(store, 10) == []
    advance(30)
    assert len(claim(store, 10)) == 2


def test_a_probe_without_a_verdict_gives_its_place_back(store, advance):
    store.set_breaker("call_partner", CFG)
    submit(store, *[new("call_partner") for _ in range(10)])
    run_calls(store, 4, failed=True)
    advance(31)
    a, b = [c.tasks[0] for c in claim(store, 10)]
    assert finish(store, a, State.RETRYING, run_at=store.now() + 100, snooze=True)
    (again,) = claim(store, 10)
    assert again.tasks[0].id not in (a.id, b.id)


def test_forced_open_holds_until_closed_by_hand(store, advance):
    store.set_breaker("call_partner", CFG)
    submit(store, *[new("call_partner") for _ in range(3)])
    ev = store.force_breaker("call_partner", BreakerState.OPEN, "partner outage")
    assert (ev.before, ev.after, ev.reason) == ("CLOSED", "OPEN", "partner outage")
    advance(3600)
    assert claim(store, 10) == []
    store.force_breaker("call_partner", BreakerState.CLOSED, "partner back")
    assert len(claim(store, 10)) == 3
    assert [e.reason for e in store.breaker_events()][:2] == ["partner back", "partner outage"]


def test_force_of_an_unknown_breaker_is_refused(store):
    from corral.errors import ConfigError

    with pytest.raises(ConfigError, match="no breaker named 'nope'"):
        store.force_breaker("nope", BreakerState.OPEN, "x")


def test_outcome_without_breaker_changes_nothing(store):
    tid = submit_one(store)
    rec = claim(store)[0].tasks[0]
    (ok,) = store.complete([Outcome(rec.id, rec.lease_token, rec.version, State.SUCCESS, breaker_failure=False)])
    assert ok and status_of(store, tid) is State.SUCCESS
    assert store.breakers() == {}
