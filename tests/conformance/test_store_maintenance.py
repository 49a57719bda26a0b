"""sweep(): lost leases, unstarted chunk members, overdue tasks, stale PENDING,
exhausted attempts, guarded writes; and try_lead()."""

from __future__ import annotations

from corral.core.states import State
from corral.stores.base import (
    EXHAUSTED_ERROR,
    LOST_LEASE_ERROR,
    OVERDUE_ERROR,
    STALE_PENDING_ERROR,
)

from .conftest import (
    claim,
    claim_one,
    claimed_ids,
    expire_lease,
    finish,
    new,
    status_of,
    submit,
    submit_one,
    wait_for,
)


def test_sweep_on_a_healthy_store_does_nothing(store):
    submit_one(store)
    submit_one(store, run_at=store.now() + 3600)
    claim(store, 1, lease_seconds=60)
    up = submit_one(store, "up", queue="elsewhere")
    submit_one(store, "down", depends_on=(up,))
    before = store.counts()
    report = store.sweep()
    assert report.total == 0
    assert store.counts() == before


def test_expired_lease_with_retries_left_goes_retrying(store):
    tid = submit_one(store, max_retries=1)
    rec = claim_one(store, lease_seconds=0.2)
    expire_lease(store, rec)
    report = store.sweep()
    assert report.lost_leases_retried == [tid]
    assert report.lost_leases_failed == []
    got = store.get(tid)
    assert got.status == State.RETRYING
    assert got.lease_token is None
    assert got.attempt == 1
    again = claim_one(store)  # run_at is now: claimable at once
    assert again.id == tid and again.attempt == 2


def test_expired_lease_without_retries_fails(store):
    tid = submit_one(store, max_retries=0)
    rec = claim_one(store, lease_seconds=0.2)
    expire_lease(store, rec)
    report = store.sweep()
    assert report.lost_leases_failed == [tid]
    assert report.lost_leases_retried == []
    got = store.get(tid)
    assert got.status == State.FAILED
    assert got.error == LOST_LEASE_ERROR
    assert got.finished_at is not None
    assert got.lease_token is None
    assert claim(store, 5) == []


def test_expired_lease_on_last_retry_fails(store):
    tid = submit_one(store, max_retries=1)
    rec = claim_one(store, lease_seconds=0.2)
    expire_lease(store, rec)
    assert store.sweep().lost_leases_retried == [tid]
    rec = claim_one(store, lease_seconds=0.2)
    assert rec.attempt == 2
    expire_lease(store, rec)
    assert store.sweep().lost_leases_failed == [tid]
    assert store.get(tid).error == LOST_LEASE_ERROR


def test_lost_lease_failure_fails_dependents(store):
    tid = submit_one(store, "a")
    dep = submit_one(store, "b", depends_on=(tid,))
    rec = claim_one(store, lease_seconds=0.2)
    expire_lease(store, rec)
    store.sweep()
    assert status_of(store, tid) is State.FAILED
    assert status_of(store, dep) is State.FAILED
    assert str(tid) in store.get(dep).error


def test_unstarted_chunk_member_goes_back_pending(store):
    g1, g2, g3 = submit(store, *[new(group="g", max_retries=2) for _ in range(3)])
    (c,) = claim(store, 1, chunk_size=3, lease_seconds=0.2)
    assert store.mark_started(g2, c.token)
    expire_lease(store, c.tasks[0])
    report = store.sweep()
    assert {g1, g2} <= set(report.lost_leases_retried)
    assert report.lost_leases_failed == []
    r1, r2, r3 = (store.get(i) for i in (g1, g2, g3))
    assert (r1.status, r1.attempt) == (State.RETRYING, 1)
    assert (r2.status, r2.attempt) == (State.RETRYING, 1)
    assert (r3.status, r3.attempt) == (State.PENDING, 0)
    assert r3.lease_token is None and r3.started_at is None
    # the group resumes in order
    (again,) = claim(store, 1, chunk_size=3)
    assert [t.id for t in again.tasks] == [g1, g2, g3]


def test_unstarted_member_without_retries_is_not_failed(store):
    g1, g2 = submit(store, new(group="g"), new(group="g"))
    (c,) = claim(store, 1, chunk_size=2, lease_seconds=0.2)
    expire_lease(store, c.tasks[0])
    report = store.sweep()
    assert report.lost_leases_failed == [g1]
    assert status_of(store, g1) is State.FAILED
    assert (store.get(g2).status, store.get(g2).attempt) == (State.PENDING, 0)
    assert claimed_ids(claim(store, 5)) == [g2]


def test_running_past_twice_its_timeout_fails(store):
    slow = submit_one(store, "slow", timeout=0.1, max_retries=3)
    fine = submit_one(store, "fine", timeout=3600)
    got = claim(store, 2, lease_seconds=600)
    assert len(got) == 2
    started = store.get(slow).started_at
    wait_for(lambda: store.now() > started + 0.25, message="2x timeout passed")
    report = store.sweep()
    assert report.overdue_failed == [slow]
    got_slow = store.get(slow)
    assert got_slow.status == State.FAILED
    assert got_slow.error == OVERDUE_ERROR
    assert got_slow.finished_at is not None
    assert status_of(store, fine) is State.RUNNING
    tokens = [c.token for c in got]
    assert store.heartbeat(tokens, 60).lost_tokens == {got_slow_token(got, slow)}


def got_slow_token(claims, tid):
    return next(c.token for c in claims if c.tasks[0].id == tid)


def test_stale_pending_is_canceled(store):
    old = submit_one(store, "old")
    future = submit_one(store, "future", run_at=store.now() + 3600)
    up = submit_one(store, "up", queue="elsewhere", max_retries=2)
    waiting = submit_one(store, "waiting", depends_on=(up,))
    rec = claim_one(store, queues=["elsewhere"])
    assert finish(store, rec, State.RETRYING, run_at=store.now() - 10)
    created = store.get(old).run_at
    wait_for(lambda: store.now() > created + 0.05, message="clock moved past run_at")
    # the default age keeps fresh PENDING tasks, None disables the rule
    assert store.sweep().stale_pending_canceled == []
    assert store.sweep(stale_pending_age=None).stale_pending_canceled == []
    report = store.sweep(stale_pending_age=0.01)
    assert report.stale_pending_canceled == [old]
    got = store.get(old)
    assert got.status == State.CANCELED
    assert got.error == STALE_PENDING_ERROR
    assert status_of(store, future) is State.PENDING
    assert status_of(store, up) is State.RETRYING
    assert status_of(store, waiting) is State.WAITING


def test_running_with_too_many_attempts_fails(store):
    tid = submit_one(store, max_retries=0)
    rec = claim_one(store, lease_seconds=600)
    # a retry beyond max_retries (the store does not judge complete()'s choice)
    assert finish(store, rec, State.RETRYING, run_at=store.now())
    rec2 = claim_one(store, lease_seconds=600)
    assert rec2.id == tid and rec2.attempt == 2
    report = store.sweep()
    assert report.exhausted_failed == [tid]
    got = store.get(tid)
    assert got.status == State.FAILED
    assert got.error == EXHAUSTED_ERROR


def test_sweep_after_completion_changes_nothing(store):
    tid = submit_one(store, max_retries=3)
    rec = claim_one(store, lease_seconds=0.2)
    expire_lease(store, rec)
    # the worker completes late but before the sweeper gets to it
    assert finish(store, rec, State.SUCCESS, result="1")
    done = store.get(tid)
    report = store.sweep(stale_pending_age=0.0)
    assert report.total == 0
    after = store.get(tid)
    assert (after.status, after.version, after.error) == (done.status, done.version, done.error)


def test_completion_after_sweep_is_stale(store):
    tid = submit_one(store, max_retries=3)
    rec = claim_one(store, lease_seconds=0.2)
    expire_lease(store, rec)
    assert store.sweep().lost_leases_retried == [tid]
    swept = store.get(tid)
    assert finish(store, rec, State.SUCCESS, result="1") is False
    after = store.get(tid)
    assert (after.status, after.version, after.result) == (State.RETRYING, swept.version, None)


def test_sweep_respects_max_rows(store):
    ids = submit(store, *[new(max_retries=1) for _ in range(5)])
    got = claim(store, 5, lease_seconds=0.2)
    for c in got:
        expire_lease(store, c.tasks[0])
    first = store.sweep(max_rows=2)
    assert 1 <= len(first.lost_leases_retried) <= 2

    def sweep_again():
        store.sweep(max_rows=2)
        return store.counts().get("RUNNING", 0) == 0

    wait_for(sweep_again, message="sweeps drain all expired leases")
    assert all(status_of(store, i) is State.RETRYING for i in ids)


# ---- leadership --------------------------------------------------------------


def test_try_lead_one_holder_at_a_time(store):
    assert store.try_lead("sweeper", "a", ttl=30) is True
    assert store.try_lead("sweeper", "b", ttl=30) is False
    assert store.try_lead("sweeper", "a", ttl=30) is True  # renew
    assert store.try_lead("other-role", "b", ttl=30) is True
    assert store.try_lead("sweeper", "b", ttl=30) is False


def test_try_lead_taken_over_after_ttl(store):
    assert store.try_lead("sweeper", "a", ttl=0.5) is True
    assert store.try_lead("sweeper", "b", ttl=0.5) is False
    wait_for(lambda: store.try_lead("sweeper", "b", ttl=30), message="b takes over after ttl")
    assert store.try_lead("sweeper", "a", ttl=30) is False
    assert store.try_lead("sweeper", "b", ttl=30) is True


def test_try_lead_renewal_extends(store):
    assert store.try_lead("sweeper", "a", ttl=0.2)
    assert store.try_lead("sweeper", "a", ttl=60)
    t0 = store.now()
    # well past the first ttl, the renewed lead still holds
    wait_for(lambda: store.now() > t0 + 0.3, message="first ttl passed")
    assert store.try_lead("sweeper", "b", ttl=30) is False


def test_try_lead_shared_between_instances(store, second_store):
    assert store.try_lead("sweeper", "a", ttl=30) is True
    assert second_store.try_lead("sweeper", "b", ttl=30) is False
    assert second_store.try_lead("sweeper", "a", ttl=30) is True
