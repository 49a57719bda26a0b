"""depends_on: WAITING until every upstream task succeeded; bad ends spread."""

from __future__ import annotations

from corral.core.states import State

from .conftest import claim, claim_one, claimed_ids, finish, status_of, submit_one


def test_waits_until_all_dependencies_succeed(store):
    a = submit_one(store, "a")
    b = submit_one(store, "b")
    c = submit_one(store, "c", depends_on=(a, b))
    assert status_of(store, c) is State.WAITING
    got = claim(store, 10)
    assert sorted(claimed_ids(got)) == [a, b]
    recs = {t.id: t for cl in got for t in cl.tasks}
    assert finish(store, recs[a])
    assert status_of(store, c) is State.WAITING
    assert claim(store, 10) == []
    assert finish(store, recs[b])
    assert status_of(store, c) is State.PENDING
    assert claimed_ids(claim(store, 10)) == [c]


def test_dependency_retrying_keeps_dependent_waiting(store):
    a = submit_one(store, "a", max_retries=2)
    c = submit_one(store, "c", depends_on=(a,))
    rec = claim_one(store)
    assert finish(store, rec, State.RETRYING, run_at=store.now())
    assert status_of(store, c) is State.WAITING
    rec = claim_one(store)
    assert rec.id == a
    assert finish(store, rec)
    assert status_of(store, c) is State.PENDING


def test_failed_dependency_fails_dependents_transitively(store):
    a = submit_one(store, "a")
    b = submit_one(store, "b", depends_on=(a,))
    c = submit_one(store, "c", depends_on=(b,))
    other = submit_one(store, "other")
    d = submit_one(store, "d", depends_on=(other,))
    rec = claim_one(store, names=["a"])
    assert finish(store, rec, State.FAILED, error="boom")
    for tid, upstream in ((b, a), (c, b)):
        r = store.get(tid)
        assert r.status == State.FAILED
        assert r.error and str(upstream) in r.error, r.error
    assert status_of(store, d) is State.WAITING
    assert claimed_ids(claim(store, 10)) == [other]


def test_timeout_dependency_fails_dependent(store):
    a = submit_one(store, "a")
    b = submit_one(store, "b", depends_on=(a,))
    rec = claim_one(store)
    assert finish(store, rec, State.TIMEOUT, error="too slow")
    r = store.get(b)
    assert r.status == State.FAILED
    assert str(a) in r.error


def test_canceled_dependency_fails_dependents(store):
    a = submit_one(store, "a")
    b = submit_one(store, "b", depends_on=(a,))
    c = submit_one(store, "c", depends_on=(b,))
    assert store.cancel(a).status == State.CANCELED
    assert status_of(store, b) is State.FAILED
    assert str(a) in store.get(b).error
    assert status_of(store, c) is State.FAILED
    assert claim(store, 10) == []


def test_canceled_running_dependency_fails_dependent(store):
    a = submit_one(store, "a")
    b = submit_one(store, "b", depends_on=(a,))
    rec = claim_one(store)
    assert finish(store, rec, State.CANCELED)
    assert status_of(store, b) is State.FAILED
    assert str(a) in store.get(b).error


def test_submit_with_succeeded_dependencies_starts_pending(store):
    a = submit_one(store, "a")
    assert finish(store, claim_one(store))
    b = submit_one(store, "b", depends_on=(a,))
    assert status_of(store, b) is State.PENDING
    assert claimed_ids(claim(store, 10)) == [b]


def test_submit_with_failed_dependency_fails_at_once(store):
    a = submit_one(store, "a")
    assert finish(store, claim_one(store), State.FAILED, error="x")
    b = submit_one(store, "b", depends_on=(a,))
    r = store.get(b)
    assert r.status == State.FAILED
    assert str(a) in r.error
    assert claim(store, 10) == []


def test_waiting_dependent_can_be_canceled(store):
    a = submit_one(store, "a")
    b = submit_one(store, "b", depends_on=(a,))
    assert store.cancel(b).status == State.CANCELED
    assert finish(store, claim_one(store))
    assert status_of(store, b) is State.CANCELED
    assert claim(store, 10) == []


def test_operator_retry_of_failed_dependency_does_not_revive_dependent(store):
    # a dependent failed because of its upstream stays failed; it is retried on its own
    a = submit_one(store, "a")
    b = submit_one(store, "b", depends_on=(a,))
    assert finish(store, claim_one(store), State.FAILED, error="x")
    assert store.retry(a)
    assert finish(store, claim_one(store))
    assert status_of(store, b) is State.FAILED
    assert store.retry(b)
    assert claimed_ids(claim(store, 10)) == [b]
