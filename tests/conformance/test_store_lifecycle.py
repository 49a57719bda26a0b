"""The state machine through the public operations (claim, complete, cancel, retry)."""

from __future__ import annotations

import itertools
import json

import pytest

from corral.core.model import Outcome
from corral.core.states import TRANSITIONS, State
from corral.errors import IllegalTransition
from corral.maintenance.recovery import sweep_once

from .conftest import claim, claim_one, claimed_ids, finish, new, status_of, submit, submit_one

ALL_STATES = list(State)
_names = itertools.count()


def put_in(store, state: State) -> int:
    """Submit a task and drive it into ``state`` through the public API."""
    name = f"t{next(_names)}"
    if state is State.WAITING:
        up = submit_one(store, "upstream", queue="elsewhere")
        return submit_one(store, name, depends_on=(up,))
    tid = submit_one(store, name)
    if state is State.PENDING:
        return tid
    if state is State.CANCELED:
        assert store.cancel(tid).status == State.CANCELED
        return tid
    rec = claim_one(store, names=[name], prefetch=state is State.RESERVED)
    assert rec.id == tid
    if state in (State.RUNNING, State.RESERVED):  # held; a prefetch records no start
        return tid
    kw = {"run_at": store.now() + 3600} if state is State.RETRYING else {}
    assert finish(store, rec, state, **kw)
    return tid


def snapshot(store, tid):
    rec = store.get(tid)
    return (rec.status, rec.version, rec.attempt, rec.lease_token, rec.run_at, rec.error, rec.finished_at)


def test_cancel_and_retry_from_every_state(store):
    for src in ALL_STATES:
        tid = put_in(store, src)
        before = snapshot(store, tid)
        after = store.cancel(tid)
        if src in (State.WAITING, State.PENDING, State.RETRYING):
            assert after.status is State.CANCELED, src
        else:
            assert (after.status, after.cancel_requested) == (src, src in (State.RUNNING, State.RESERVED)), src
            assert snapshot(store, tid) == before, src
        tid = put_in(store, src)
        before = snapshot(store, tid)
        retried = store.retry(tid)
        assert retried is (src in (State.FAILED, State.TIMEOUT, State.CANCELED)), src
        if retried:
            assert (status_of(store, tid), store.get(tid).attempt) == (State.PENDING, 0)
        else:
            assert snapshot(store, tid) == before, src


def test_complete_refuses_an_outcome_running_cannot_reach(store):
    illegal = [d for d in ALL_STATES if (State.RUNNING, d) not in TRANSITIONS]
    assert illegal == [State.WAITING, State.RUNNING, State.RESERVED]
    tid = submit_one(store)
    rec = claim_one(store)
    before = snapshot(store, tid)
    for dst in illegal:
        with pytest.raises(IllegalTransition):
            store.complete([Outcome(tid, rec.lease_token, rec.version, dst)])
        assert snapshot(store, tid) == before, dst


def test_complete_with_stale_version_or_token_changes_nothing(store):
    tid = submit_one(store)
    rec = claim_one(store)
    before = snapshot(store, tid)
    assert store.complete([Outcome(tid, rec.lease_token, rec.version + 1, State.SUCCESS)]) == [False]
    assert store.complete([Outcome(tid, rec.lease_token, rec.version - 1, State.SUCCESS)]) == [False]
    assert store.complete([Outcome(tid, "not-the-token", rec.version, State.SUCCESS)]) == [False]
    assert snapshot(store, tid) == before
    assert finish(store, rec) is True


def test_complete_keeps_the_start_the_claim_recorded(store):
    # Pinned: the worker's own clock must not overwrite the store's record of
    # when the claim started the task (on PostgreSQL, the database clock).
    tid = submit_one(store)
    rec = claim_one(store)
    claimed = store.get(tid).started_at
    assert claimed is not None
    assert finish(store, rec, State.SUCCESS, started_at=claimed - 1000)
    assert store.get(tid).started_at == pytest.approx(claimed)


def test_a_requeued_task_keeps_the_start_the_claim_recorded(store):
    tid = submit_one(store, max_retries=1)
    rec = claim_one(store)
    claimed = store.get(tid).started_at
    assert finish(store, rec, State.RETRYING, run_at=store.now(), started_at=claimed - 1000)
    assert store.get(tid).started_at == pytest.approx(claimed)


def test_success_never_changes_again(store):
    tid = submit_one(store, max_retries=5)
    rec = claim_one(store)
    assert finish(store, rec, State.SUCCESS, result='{"v":1}')
    done = snapshot(store, tid)
    version = store.get(tid).version
    # complete again, with the old and with the new version
    assert finish(store, rec, State.FAILED, error="late") is False
    assert store.complete([Outcome(tid, rec.lease_token, version, State.FAILED)]) == [False]
    after_cancel = store.cancel(tid)
    assert after_cancel.status == State.SUCCESS and after_cancel.cancel_requested is False
    assert store.retry(tid) is False
    sweep_once(store, stale_pending_age=0.0)
    assert claim(store, 5) == []
    assert snapshot(store, tid) == done
    assert json.loads(store.get(tid).result) == {"v": 1}


# ---- complete() ---------------------------------------------------------------


def test_complete_success_stores_result_and_finished_at(store):
    tid = submit_one(store)
    rec = claim_one(store)
    assert finish(store, rec, State.SUCCESS, result='{"answer":[4,2]}')
    done = store.get(tid)
    assert done.status == State.SUCCESS
    assert json.loads(done.result) == {"answer": [4, 2]}
    assert done.result_value == {"answer": [4, 2]}
    assert done.finished_at is not None and done.finished_at >= done.started_at - 1e-6
    assert done.lease_token is None
    assert done.attempt == 1
    assert done.version > rec.version


def test_complete_failed_stores_error_and_finished_at(store):
    tid = submit_one(store)
    rec = claim_one(store)
    assert finish(store, rec, State.FAILED, error="ValueError: bad input")
    done = store.get(tid)
    assert done.status == State.FAILED
    assert done.error == "ValueError: bad input"
    assert done.finished_at is not None
    assert done.lease_token is None


def test_complete_other_final_states(store):
    for status in (State.TIMEOUT, State.CANCELED):
        tid = submit_one(store)
        rec = claim_one(store)
        assert finish(store, rec, status, error="why")
        done = store.get(tid)
        assert done.status == status
        assert done.finished_at is not None
        assert done.error == "why"


def test_complete_with_stale_version_or_token_returns_false(store):
    tid = submit_one(store)
    rec = claim_one(store)
    before = snapshot(store, tid)
    outcomes = [
        Outcome(tid, rec.lease_token, rec.version - 1, State.SUCCESS),
        Outcome(tid, rec.lease_token, rec.version + 1, State.SUCCESS),
        Outcome(tid, "not-the-token", rec.version, State.SUCCESS),
    ]
    for o in outcomes:
        assert store.complete([o]) == [False]
    assert snapshot(store, tid) == before
    assert store.get(tid).status == State.RUNNING


def test_complete_batch_reports_each(store):
    submit(store, new(), new(), new())
    recs = [c.tasks[0] for c in claim(store, 3)]
    a, b, c = sorted(recs, key=lambda r: r.id)
    res = store.complete(
        [
            Outcome(a.id, a.lease_token, a.version, State.SUCCESS),
            Outcome(b.id, "wrong", b.version, State.SUCCESS),
            Outcome(c.id, c.lease_token, c.version, State.FAILED, error="x"),
        ]
    )
    assert res == [True, False, True]
    assert [status_of(store, r.id) for r in (a, b, c)] == [State.SUCCESS, State.RUNNING, State.FAILED]


def test_complete_batch_frees_group_heads_and_settles_dependents(store):
    g1, g2 = submit(store, new("g", group="line"), new("g", group="line"))
    up = submit_one(store, "up")
    failing = submit_one(store, "bad")
    after_up = submit_one(store, "after", depends_on=(up,), queue="later")
    after_bad = submit_one(store, "after", depends_on=(failing,), queue="later")
    recs = {t.id: t for c in claim(store, 10) for t in c.tasks}
    assert set(recs) == {g1, up, failing}  # g2 waits behind g1
    res = store.complete(
        [
            Outcome(g1, recs[g1].lease_token, recs[g1].version, State.SUCCESS, result="1"),
            Outcome(up, recs[up].lease_token, recs[up].version, State.SUCCESS, result="2"),
            Outcome(failing, recs[failing].lease_token, recs[failing].version, State.FAILED, error="boom"),
        ]
    )
    assert res == [True, True, True]
    assert (store.get(g1).result, store.get(up).result, store.get(failing).error) == ("1", "2", "boom")
    assert claimed_ids(claim(store, 10)) == [g2]
    assert status_of(store, after_up) == State.PENDING
    assert status_of(store, after_bad) == State.CANCELED


def test_second_complete_of_same_claim_is_stale(store):
    submit_one(store)
    rec = claim_one(store)
    assert finish(store, rec, State.SUCCESS)
    assert finish(store, rec, State.SUCCESS) is False


def test_retrying_sets_run_at_and_waits_for_it(store, advance):
    tid = submit_one(store, max_retries=3)
    rec = claim_one(store)
    run_at = store.now() + 5
    assert finish(store, rec, State.RETRYING, error="try again", run_at=run_at)
    mid = store.get(tid)
    assert mid.status == State.RETRYING
    assert mid.run_at == pytest.approx(run_at, abs=1e-3)
    assert mid.lease_token is None
    assert mid.finished_at is None
    assert mid.attempt == 1
    assert claim(store, 5) == []
    advance(6)
    again = claim(store, 5)
    (rec2,) = again[0].tasks
    assert rec2.id == tid
    assert rec2.attempt == 2
    assert rec2.lease_token != rec.lease_token


def test_hand_back_gives_the_attempt_back(store):
    tid = submit_one(store)
    rec = claim_one(store)
    assert rec.attempt == 1
    assert finish(store, rec, State.PENDING, burn_attempt=False)
    back = store.get(tid)
    assert back.status == State.PENDING
    assert back.attempt == 0
    assert back.lease_token is None
    assert back.finished_at is None
    rec2 = claim_one(store)
    assert rec2.id == tid
    assert rec2.attempt == 1


def test_complete_unknown_task_is_false(store):
    assert store.complete([Outcome(99999, "tok", 1, State.SUCCESS)]) == [False]
