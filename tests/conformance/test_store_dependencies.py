"""depends_on: WAITING until every upstream task succeeded; a bad end cancels
dependents down the graph, unless they run anyway (on_upstream_failure="run")."""

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


def test_failed_upstream_cancels_dependents_transitively_with_reason(store):
    a = submit_one(store, "a")
    b = submit_one(store, "b", depends_on=(a,))
    c = submit_one(store, "c", depends_on=(b,))
    other = submit_one(store, "other")
    d = submit_one(store, "d", depends_on=(other,))
    rec = claim_one(store, names=["a"])
    assert finish(store, rec, State.FAILED, error="boom")
    assert store.get(b).status is State.CANCELED
    assert store.get(b).error == f"upstream {a} ended FAILED"
    assert store.get(c).status is State.CANCELED
    assert store.get(c).error == f"upstream {b} ended CANCELED"
    assert store.get(c).finished_at is not None
    assert status_of(store, d) is State.WAITING
    assert claimed_ids(claim(store, 10)) == [other]


def test_timeout_upstream_cancels_dependent(store):
    a = submit_one(store, "a")
    b = submit_one(store, "b", depends_on=(a,))
    rec = claim_one(store)
    assert finish(store, rec, State.TIMEOUT, error="too slow")
    r = store.get(b)
    assert r.status is State.CANCELED
    assert r.error == f"upstream {a} ended TIMEOUT"


def test_canceled_upstream_cancels_dependents(store):
    a = submit_one(store, "a")
    b = submit_one(store, "b", depends_on=(a,))
    c = submit_one(store, "c", depends_on=(b,))
    assert store.cancel(a).status == State.CANCELED
    assert store.get(b).status is State.CANCELED
    assert store.get(b).error == f"upstream {a} ended CANCELED"
    assert status_of(store, c) is State.CANCELED
    assert claim(store, 10) == []


def test_canceled_running_upstream_cancels_dependent(store):
    a = submit_one(store, "a")
    b = submit_one(store, "b", depends_on=(a,))
    rec = claim_one(store)
    assert finish(store, rec, State.CANCELED)
    assert status_of(store, b) is State.CANCELED
    assert str(a) in store.get(b).error


def test_canceled_dependents_are_not_dead_letters(store):
    a = submit_one(store, "a")
    b = submit_one(store, "b", depends_on=(a,))
    submit_one(store, "c", depends_on=(b,))
    assert finish(store, claim_one(store), State.FAILED, error="boom")
    assert [t.id for t in store.dead_letters()] == [a]


def test_run_anyway_dependent_runs_after_every_upstream_ended(store):
    a = submit_one(store, "a")
    b = submit_one(store, "b")
    c = submit_one(store, "c", depends_on=(a, b), on_upstream_failure="run")
    got = {t.id: t for cl in claim(store, 10) for t in cl.tasks}
    assert finish(store, got[a], State.FAILED, error="boom")
    assert status_of(store, c) is State.WAITING  # b has not ended yet
    assert finish(store, got[b])
    assert status_of(store, c) is State.PENDING
    assert store.get(c).error is None
    assert claimed_ids(claim(store, 10)) == [c]


def test_run_anyway_dependent_of_a_canceled_chain_runs(store):
    # a fails -> b (cancel) is canceled -> c (run) runs anyway, d (cancel) under c waits for c
    a = submit_one(store, "a")
    b = submit_one(store, "b", depends_on=(a,))
    c = submit_one(store, "c", depends_on=(b,), on_upstream_failure="run")
    d = submit_one(store, "d", depends_on=(c,))
    assert finish(store, claim_one(store), State.FAILED, error="boom")
    assert status_of(store, b) is State.CANCELED
    assert status_of(store, c) is State.PENDING
    assert status_of(store, d) is State.WAITING
    rec = claim_one(store)
    assert rec.id == c
    assert finish(store, rec, result="7")
    assert status_of(store, d) is State.PENDING


def test_submit_with_run_anyway_after_failed_upstream_starts_pending(store):
    a = submit_one(store, "a")
    assert finish(store, claim_one(store), State.FAILED, error="x")
    b = submit_one(store, "b", depends_on=(a,), on_upstream_failure="run")
    assert status_of(store, b) is State.PENDING
    assert store.get(b).on_upstream_failure == "run"


def test_long_chain_cancels_without_recursion_limit(store):
    ids = [submit_one(store, "a")]
    for _ in range(300):
        ids.append(submit_one(store, "n", depends_on=(ids[-1],)))
    assert finish(store, claim_one(store), State.FAILED, error="boom")
    assert status_of(store, ids[-1]) is State.CANCELED
    assert store.get(ids[-1]).error == f"upstream {ids[-2]} ended CANCELED"


def test_submit_with_succeeded_dependencies_starts_pending(store):
    a = submit_one(store, "a")
    assert finish(store, claim_one(store))
    b = submit_one(store, "b", depends_on=(a,))
    assert status_of(store, b) is State.PENDING
    assert claimed_ids(claim(store, 10)) == [b]


def test_submit_with_failed_dependency_is_canceled_at_once(store):
    a = submit_one(store, "a")
    assert finish(store, claim_one(store), State.FAILED, error="x")
    b = submit_one(store, "b", depends_on=(a,))
    r = store.get(b)
    assert r.status == State.CANCELED
    assert r.error == f"upstream {a} ended FAILED"
    assert claim(store, 10) == []


def test_waiting_dependent_can_be_canceled(store):
    a = submit_one(store, "a")
    b = submit_one(store, "b", depends_on=(a,))
    assert store.cancel(b).status == State.CANCELED
    assert finish(store, claim_one(store))
    assert status_of(store, b) is State.CANCELED
    assert claim(store, 10) == []


def test_operator_retry_of_failed_dependency_does_not_revive_dependent(store):
    # a dependent canceled because of its upstream stays canceled; it is retried on its own
    a = submit_one(store, "a")
    b = submit_one(store, "b", depends_on=(a,))
    assert finish(store, claim_one(store), State.FAILED, error="x")
    assert store.retry(a)
    assert finish(store, claim_one(store))
    assert status_of(store, b) is State.CANCELED
    assert store.retry(b)
    assert claimed_ids(claim(store, 10)) == [b]
