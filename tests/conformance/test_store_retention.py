"""Retention (Store.prune): only old finished tasks of the states asked go,
oldest first, at most ``limit`` per call; what a dependent, an unfinished
batch or a halted group still needs stays whatever its age."""

from __future__ import annotations

from corral.core.batches import Callback
from corral.core.claims import ClaimRequest
from corral.core.states import State

from .conftest import claim_one, finish, new, submit, submit_one

DAY = 86400.0


def cut(store, **ages_in_days: float) -> dict[str, float]:
    """``prune``'s cut-offs: per state name, now minus that many days."""
    now = store.now()
    return {name.upper(): now - days * DAY for name, days in ages_in_days.items()}


def run(store, status: State = State.SUCCESS, **kw) -> int:
    """Submit one task, claim it and end it with ``status``; its id."""
    tid = submit_one(store, **kw)
    rec = claim_one(store)
    assert rec.id == tid
    assert finish(store, rec, status, **({"error": "boom"} if status is not State.SUCCESS else {}))
    return tid


def ids(store) -> set[int]:
    return {t.id for t in store.list_tasks(_all())}


def _all():
    from corral.core.model import TaskFilter

    return TaskFilter(limit=10_000)


def test_prune_removes_only_old_finished_tasks_of_the_states_given(store, advance):
    ok = run(store)
    failed = run(store, State.FAILED)
    timed_out = run(store, State.TIMEOUT)
    canceled = submit_one(store)
    store.cancel(canceled)
    queued = submit_one(store, queue="elsewhere")
    advance(8 * DAY)
    recent = run(store)

    assert store.prune(cut(store, success=7), 100) == 1
    assert ids(store) == {failed, timed_out, canceled, queued, recent}
    assert store.prune(cut(store, canceled=7, failed=9), 100) == 1  # the failure is 8 days old: kept
    assert ids(store) == {failed, timed_out, queued, recent}
    assert store.prune(cut(store, failed=7, timeout=7), 100) == 2
    assert ids(store) == {queued, recent}
    assert store.get(ok) is None
    assert store.counts().get("SUCCESS") == 1 and store.counts().get("PENDING") == 1


def test_prune_goes_oldest_first_in_bounded_batches(store, advance):
    done = []
    for _ in range(5):
        done.append(run(store))
        advance(60)
    advance(8 * DAY)
    assert store.prune(cut(store, success=7), 2) == 2
    assert ids(store) == set(done[2:])
    assert store.prune(cut(store, success=7), 2) == 2
    assert store.prune(cut(store, success=7), 2) == 1
    assert store.prune(cut(store, success=7), 2) == 0
    assert ids(store) == set()


def test_prune_keeps_the_upstream_a_dependent_still_needs(store, advance):
    up_done = run(store, queue="default")
    up_open = submit_one(store, "up", queue="later")  # not claimed: the dependent waits on it
    waiting = submit_one(store, "down", queue="later", depends_on=(up_done, up_open))
    up_for_pending = run(store)
    pending = submit_one(store, "down", queue="later", depends_on=(up_for_pending,))
    advance(8 * DAY)
    assert store.get(waiting).status is State.WAITING
    assert store.get(pending).status is State.PENDING
    assert store.prune(cut(store, success=7), 100) == 0
    assert {up_done, up_for_pending} <= ids(store)
    # the dependent reads its upstream's results when it runs
    assert [u.id for u in store.upstream(pending)] == [up_for_pending]


def test_prune_keeps_the_upstream_of_a_dead_letter_and_lets_go_with_a_success(store, advance):
    up = run(store)
    down = submit_one(store, "down", depends_on=(up,))
    rec = claim_one(store)
    assert rec.id == down
    assert finish(store, rec, State.FAILED, error="boom")
    up2 = run(store)
    down2 = submit_one(store, "down", depends_on=(up2,))
    rec = claim_one(store)
    assert rec.id == down2 and finish(store, rec)
    advance(8 * DAY)
    assert store.prune(cut(store, success=7), 100) == 2  # up2 and down2; up stays for the dead letter
    assert ids(store) == {up, down}
    assert store.retry(down)  # the retry runs again with its upstream's results
    assert [u.id for u in store.upstream(down)] == [up]
    rec = claim_one(store)
    assert rec.id == down and finish(store, rec)
    advance(8 * DAY)
    assert store.prune(cut(store, success=7), 100) == 2
    assert ids(store) == set()


def test_prune_keeps_a_batch_in_progress(store, advance):
    first = run(store, batch="b")
    second = submit_one(store, batch="b", queue="later")
    advance(8 * DAY)
    assert store.prune(cut(store, success=7), 100) == 0
    assert store.batch_summary("b").total == 2
    store.cancel(second)
    advance(8 * DAY)
    assert store.prune(cut(store, success=7, canceled=7), 100) == 2
    assert store.get(first) is None


def test_prune_keeps_a_batch_whose_callback_is_not_submitted(store, advance):
    store.set_batch("b", Callback("report").to_json())
    done = run(store, batch="b")
    advance(8 * DAY)
    assert store.prune(cut(store, success=7), 100) == 0
    (callback,) = store.settle_batches(["b"])
    assert store.get(callback).args  # the summary counted the batch's task
    assert store.prune(cut(store, success=7), 100) == 1
    assert store.get(done) is None


def test_prune_keeps_a_halting_failure_while_its_group_waits_behind_it(store, advance):
    head = submit_one(store, group="g", halt_group_on_failure=True)
    behind = submit_one(store, group="g")
    rec = claim_one(store)
    assert rec.id == head and finish(store, rec, State.FAILED, error="boom")
    advance(8 * DAY)
    assert store.prune(cut(store, failed=7), 100) == 0
    assert store.claim("w1", ClaimRequest(["default"], 1)) == []  # the group is still halted
    store.cancel(behind)
    assert store.prune(cut(store, failed=7), 100) == 1  # nothing waits behind it now
    assert store.get(head) is None
    later = submit_one(store, group="g")
    assert claim_one(store).id == later


def test_a_pruned_tasks_idempotency_key_may_be_used_again(store, advance):
    (first,) = submit(store, new(key="k"))
    rec = claim_one(store)
    assert finish(store, rec)
    advance(8 * DAY)
    assert store.prune(cut(store, success=7), 100) == 1
    res = store.submit([new(key="k")])
    assert res[0].created and res[0].id != first


def test_prune_with_nothing_asked_removes_nothing(store, advance):
    run(store)
    advance(8 * DAY)
    assert store.prune({}, 100) == 0
    assert store.prune(cut(store, success=7), 0) == 0
    assert len(ids(store)) == 1
