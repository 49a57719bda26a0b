"""transition() as compare-and-set over the state machine, and complete()."""

from __future__ import annotations

import itertools
import json

import pytest

from corral.core.model import Outcome
from corral.core.states import TRANSITIONS, State
from corral.errors import IllegalTransition

from .conftest import claim, claim_one, claimed_ids, finish, new, status_of, submit, submit_one, wait_for

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
    rec = claim_one(store, names=[name])
    assert rec.id == tid
    if state is State.RUNNING:
        return tid
    kw = {"run_at": store.now() + 3600} if state is State.RETRYING else {}
    assert finish(store, rec, state, **kw)
    return tid


def snapshot(store, tid):
    rec = store.get(tid)
    return (rec.status, rec.version, rec.attempt, rec.lease_token, rec.run_at, rec.error, rec.finished_at)


def test_every_legal_transition_is_accepted(store):
    # RUNNING is entered through claim(), which also sets the lease; stores
    # may refuse transition() into it, so those two moves are left to claim().
    pairs = [(s, d) for (s, d) in TRANSITIONS if d is not State.RUNNING]
    assert len(pairs) == 14
    for src, dst in pairs:
        tid = put_in(store, src)
        before = store.get(tid)
        assert before.status == src
        assert store.transition(tid, before.version, dst) is True, f"{src.value} -> {dst.value}"
        after = store.get(tid)
        assert after.status == dst, f"{src.value} -> {dst.value}"
        assert after.version > before.version


def test_every_illegal_transition_is_refused(store):
    checked = 0
    for src in ALL_STATES:
        tid = put_in(store, src)
        before = snapshot(store, tid)
        for dst in ALL_STATES:
            if (src, dst) in TRANSITIONS:
                continue
            with pytest.raises(IllegalTransition):
                store.transition(tid, store.get(tid).version, dst)
                pytest.fail(f"{src.value} -> {dst.value} was accepted")
            assert snapshot(store, tid) == before, f"{src.value} -> {dst.value} changed the task"
            checked += 1
    assert checked == len(ALL_STATES) ** 2 - len(TRANSITIONS)


def test_transition_with_stale_version_changes_nothing(store):
    tid = submit_one(store)
    rec = store.get(tid)
    assert store.transition(tid, rec.version + 1, State.CANCELED) is False
    assert store.transition(tid, rec.version - 1, State.CANCELED) is False
    assert status_of(store, tid) is State.PENDING
    assert store.get(tid).version == rec.version
    # the right version still works, once
    assert store.transition(tid, rec.version, State.CANCELED) is True
    assert store.transition(tid, rec.version, State.PENDING) is False
    assert status_of(store, tid) is State.CANCELED


def test_stale_version_wins_over_illegal_move(store):
    # a caller whose view is stale is told so (False), even when the move it
    # asks for is no longer legal from the state the task has moved on to
    tid = submit_one(store)
    seen = store.get(tid).version
    assert store.transition(tid, seen, State.CANCELED) is True
    assert store.transition(tid, seen, State.CANCELED) is False
    assert store.transition(tid, seen, State.SUCCESS) is False
    assert status_of(store, tid) is State.CANCELED


def test_transition_of_unknown_task_is_false(store):
    assert store.transition(424242, 0, State.CANCELED) is False


def test_transition_sets_given_fields(store):
    tid = put_in(store, State.RUNNING)
    rec = store.get(tid)
    assert store.transition(tid, rec.version, State.FAILED, error="operator says no")
    assert store.get(tid).error == "operator says no"


def test_success_never_changes_again(store):
    tid = submit_one(store, max_retries=5)
    rec = claim_one(store)
    assert finish(store, rec, State.SUCCESS, result='{"v":1}')
    done = snapshot(store, tid)
    version = store.get(tid).version
    # complete again, with the old and with the new version
    assert finish(store, rec, State.FAILED, error="late") is False
    assert store.complete([Outcome(tid, rec.lease_token, version, State.FAILED)]) == [False]
    for dst in ALL_STATES:
        if dst is State.SUCCESS:
            continue
        with pytest.raises(IllegalTransition):
            store.transition(tid, version, dst)
    after_cancel = store.cancel(tid)
    assert after_cancel.status == State.SUCCESS and after_cancel.cancel_requested is False
    assert store.retry(tid) is False
    store.sweep(stale_pending_age=0.0)
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
    res = store.complete([
        Outcome(g1, recs[g1].lease_token, recs[g1].version, State.SUCCESS, result="1"),
        Outcome(up, recs[up].lease_token, recs[up].version, State.SUCCESS, result="2"),
        Outcome(failing, recs[failing].lease_token, recs[failing].version, State.FAILED, error="boom"),
    ])
    assert res == [True, True, True]
    assert (store.get(g1).result, store.get(up).result, store.get(failing).error) == ("1", "2", "boom")
    assert claimed_ids(claim(store, 10)) == [g2]
    assert status_of(store, after_up) == State.PENDING
    assert status_of(store, after_bad) == State.FAILED


def test_second_complete_of_same_claim_is_stale(store):
    submit_one(store)
    rec = claim_one(store)
    assert finish(store, rec, State.SUCCESS)
    assert finish(store, rec, State.SUCCESS) is False


def test_retrying_sets_run_at_and_waits_for_it(store):
    tid = submit_one(store, max_retries=3)
    rec = claim_one(store)
    run_at = store.now() + 0.5
    assert finish(store, rec, State.RETRYING, error="try again", run_at=run_at)
    mid = store.get(tid)
    assert mid.status == State.RETRYING
    assert mid.run_at == pytest.approx(run_at, abs=1e-3)
    assert mid.lease_token is None
    assert mid.finished_at is None
    assert mid.attempt == 1
    assert claim(store, 5) == []
    again = wait_for(lambda: claim(store, 5), timeout=10, message="retry claimable after run_at")
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

