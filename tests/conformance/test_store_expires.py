"""Deadlines (``expires=``): a task not started by the deadline of its first
start never starts; it ends CANCELED "expired", as any cancel does (its group
moves on, its dependents are settled, its batch counts it canceled), ended by
the claim that meets it or by the sweeper's leader. A task that started once
is never expired. And the newest-wins reason of a running task."""

from __future__ import annotations

from corral.core.model import EXPIRED, SUPERSEDED, Outcome, loads
from corral.core.states import State
from corral.maintenance.recovery import expire_queued, sweep_once

from .conftest import claim, claim_one, claimed_ids, finish, new, submit

REPORT = '{"name": "report", "queue": "default", "priority": 0, "max_retries": 0, "timeout": null, "limits": []}'


def due_in(store, seconds: float, name: str = "t", **kw):
    """A new task whose first start must come within ``seconds`` of now."""
    return new(name, expires_at=store.now() + seconds, **kw)


def claim_then_sweep(store, **kw) -> list[int]:
    """What a claim takes, after the leader ended what no claim did."""
    got = claimed_ids(claim(store, 10, **kw))
    if not got:
        expire_queued(store)
        got = claimed_ids(claim(store, 10, **kw))
    return got


def assert_expired(store, tid: int) -> None:
    rec = store.get(tid)
    assert (rec.status, rec.error, rec.attempt, rec.started_at) == (State.CANCELED, EXPIRED, 0, None)


def test_a_claim_never_starts_a_task_past_its_deadline(store, store_kind, advance):
    (late, fine) = submit(store, due_in(store, 5), due_in(store, 60))
    advance(10)
    assert claimed_ids(claim(store, 10)) == [fine]
    if store_kind != "postgres":  # ended in the claim that met it (PostgreSQL: passed over)
        assert_expired(store, late)
    assert claimed_ids(claim(store, 10)) == []
    expire_queued(store)
    assert_expired(store, late)


def test_before_its_deadline_a_task_runs_and_keeps_it(store, advance):
    (tid,) = submit(store, due_in(store, 30))
    advance(29)
    rec = claim_one(store)
    assert rec.id == tid and rec.expires_at is not None
    assert expire_queued(store).expired_canceled == []
    assert finish(store, rec)
    assert store.get(tid).status is State.SUCCESS


def test_the_plain_claim_passes_an_expired_task_over(store, advance):
    # a claim that found only plain work takes the next from the plain fast path
    (first,) = submit(store, new())
    assert claim_one(store).id == first
    (late,) = submit(store, due_in(store, 1))
    advance(2)
    assert claimed_ids(claim(store, 10)) == []
    expire_queued(store)
    assert_expired(store, late)


def test_the_sweeper_ends_expired_tasks_no_claim_meets(store, advance):
    (nobody, other, later) = submit(
        store, due_in(store, 5, queue="unserved"), due_in(store, 5, queue="unserved"), due_in(store, 50)
    )
    advance(10)
    assert expire_queued(store, max_rows=1).expired_canceled == [nobody]  # bounded
    assert expire_queued(store).expired_canceled == [other]
    assert expire_queued(store).expired_canceled == []
    assert store.get(later).status is State.PENDING
    assert sweep_once(store).expired_canceled == []  # the chores leave it to expire_queued


def test_an_expired_head_lets_its_group_move_on(store, advance):
    (head, nxt) = submit(store, due_in(store, 5, group="g"), new(group="g"))
    advance(10)
    assert claim_then_sweep(store) == [nxt]
    assert_expired(store, head)


def test_an_expired_task_settles_its_dependents_as_a_cancel_does(store, advance):
    (up,) = submit(store, due_in(store, 5))
    (down, runs) = submit(store, new(depends_on=(up,)), new(depends_on=(up,), on_upstream_failure="run"))
    advance(10)
    assert claim_then_sweep(store) == [runs]
    assert_expired(store, up)
    rec = store.get(down)
    assert rec.status is State.CANCELED and str(up) in (rec.error or "")


def test_a_batch_counts_an_expired_task_canceled(store, advance):
    store.set_batch("otp", REPORT)
    submit(store, due_in(store, 5, batch="otp"))
    advance(10)
    expire_queued(store)
    (cb,) = store.settle_batches(["otp"])
    summary = loads(store.get(cb).args)["args"][0]
    assert summary["counts"] == {"CANCELED": 1} and summary["status"] == "FAILED"


def test_the_deadline_binds_the_first_start_only(store, advance):
    (retried, snoozed) = submit(store, due_in(store, 5, max_retries=1), due_in(store, 5))
    for rec in claim(store, 2):
        (t,) = rec.tasks
        outcome = dict(status=State.RETRYING, run_at=store.now(), error="boom")
        if t.id == snoozed:
            outcome.update(snooze=True, error=None)
        assert finish(store, t, **outcome)
    assert store.get(snoozed).attempt == 0 and store.get(snoozed).snoozes == 1
    advance(10)
    assert expire_queued(store).expired_canceled == []
    assert sorted(claimed_ids(claim(store, 10))) == [retried, snoozed]


def test_a_held_task_past_its_deadline_is_ended_through_its_lease(store, advance):
    """What a worker does with a prefetched task it finds past its deadline
    at its start: CANCELED "expired", fenced by the lease, no attempt counted."""
    (tid,) = submit(store, due_in(store, 5))
    (unit,) = claim(store, 1, prefetch=True)
    (held,) = unit.tasks
    assert held.attempt == 0 and held.expires_at is not None
    advance(10)
    assert expire_queued(store).expired_canceled == []  # held: its worker's to end
    stale = Outcome(tid, "another-token", held.version, State.CANCELED, error=EXPIRED, attempt=0)
    assert store.complete([stale]) == [False]
    assert finish(store, held, State.CANCELED, error=EXPIRED, attempt=0)
    assert_expired(store, tid)


def test_a_running_task_stopped_by_a_newer_submit_ends_superseded(store):
    old = store.submit([new("render", supersede_key="doc-9")])[0].id
    running = claim_one(store)
    store.submit([new("render", supersede_key="doc-9")])
    # the worker writes what any cancel writes; the store says why
    assert finish(store, running, State.CANCELED, error="canceled")
    assert (store.get(old).status, store.get(old).error) == (State.CANCELED, SUPERSEDED)


def test_an_operators_cancel_of_a_running_task_still_says_canceled(store):
    old = store.submit([new("render", supersede_key="doc-9")])[0].id
    running = claim_one(store)
    store.cancel(old)
    assert finish(store, running, State.CANCELED, error="canceled")
    assert store.get(old).error == "canceled"
    # a running task that finishes anyway keeps no reason
    store.submit([new("render", supersede_key="doc-9")])
    nxt = claim_one(store)
    store.submit([new("render", supersede_key="doc-9")])
    assert finish(store, nxt)
    assert (store.get(nxt.id).status, store.get(nxt.id).error) == (State.SUCCESS, None)
