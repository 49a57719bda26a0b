"""Operator calls: retry, counts, list_tasks filters, batch summaries."""

from __future__ import annotations

import pytest

from corral.core.claims import ClaimRequest
from corral.core.model import TaskFilter
from corral.core.states import State

from .conftest import claim, claim_one, claimed_ids, finish, new, submit, submit_one


def test_retry_brings_a_final_task_back(store):
    for final in (State.FAILED, State.TIMEOUT, State.CANCELED):
        tid = submit_one(store, max_retries=1)
        rec = claim_one(store)
        assert finish(store, rec, final, error="bad")
        assert store.retry(tid) is True, final
        got = store.get(tid)
        assert got.status == State.PENDING
        assert got.attempt == 0
        assert got.cancel_requested is False
        assert got.lease_token is None
        assert abs(got.run_at - store.now()) < 5
        again = claim_one(store)
        assert again.id == tid and again.attempt == 1
        assert finish(store, again)


def test_retry_of_canceled_pending_task(store):
    tid = submit_one(store)
    store.cancel(tid)
    assert store.retry(tid) is True
    assert claimed_ids(claim(store, 5)) == [tid]


def test_retry_refuses_other_states(store):
    done = submit_one(store, "done")
    running = submit_one(store, "running")
    pending = submit_one(store, "pending", queue="elsewhere")
    assert finish(store, claim_one(store, names=["done"]))
    claim_one(store, names=["running"])
    for tid in (done, running, pending):
        before = store.get(tid)
        assert store.retry(tid) is False
        after = store.get(tid)
        assert (after.status, after.version, after.attempt) == (before.status, before.version, before.attempt)
    assert store.retry(10_000) is False


def test_retry_clears_cancel_flag(store):
    tid = submit_one(store)
    rec = claim_one(store)
    store.cancel(tid)
    assert finish(store, rec, State.CANCELED)
    assert store.retry(tid)
    assert store.get(tid).cancel_requested is False
    assert store.heartbeat([claim_one(store).lease_token], 30).cancel_requested == set()


def _make_mix(store):
    """2 PENDING, 1 RUNNING, 1 SUCCESS, 1 FAILED, 1 CANCELED, 1 WAITING, 1 RETRYING."""
    for name in ("s", "f", "r"):
        submit_one(store, name)
    submit_one(store, "rt", max_retries=1)
    assert finish(store, claim_one(store, names=["s"]))
    assert finish(store, claim_one(store, names=["f"]), State.FAILED, error="x")
    claim_one(store, names=["r"])
    assert finish(store, claim_one(store, names=["rt"]), State.RETRYING, run_at=store.now() + 3600)
    c = submit_one(store, "c")
    store.cancel(c)
    submit_one(store, "p", queue="q2")
    p2 = submit_one(store, "p")
    submit_one(store, "w", depends_on=(p2,))


def test_counts_per_state(store):
    assert sum(store.counts().values()) == 0
    _make_mix(store)
    counts = store.counts()
    expected = {"PENDING": 2, "RUNNING": 1, "SUCCESS": 1, "FAILED": 1, "CANCELED": 1, "WAITING": 1, "RETRYING": 1}
    assert {k: v for k, v in counts.items() if v} == expected
    assert {k: v for k, v in store.counts(queue="q2").items() if v} == {"PENDING": 1}
    assert sum(store.counts(queue="nope").values()) == 0


def test_active_counts_are_the_unfinished_states(store):
    assert store.active_counts() == {}
    _make_mix(store)
    assert store.active_counts() == {"PENDING": 2, "RUNNING": 1, "WAITING": 1, "RETRYING": 1}
    assert store.active_counts() == {
        k: v for k, v in store.counts().items() if k in ("PENDING", "RUNNING", "WAITING", "RETRYING") and v
    }


def test_list_tasks_filters(store):
    a1 = submit_one(store, "alpha", batch="b1", group="g1", queue="q1")
    a2 = submit_one(store, "alpha", batch="b1", group="g2")
    b1 = submit_one(store, "beta", batch="b2", group="g1", queue="q1")
    b2 = submit_one(store, "beta")
    assert finish(store, claim_one(store, queues=["q1"], names=["alpha"]))

    def ids(**kw):
        return [t.id for t in store.list_tasks(TaskFilter(newest_first=False, **kw))]

    assert ids() == [a1, a2, b1, b2]
    assert ids(status=State.SUCCESS) == [a1]
    assert ids(status=State.PENDING) == [a2, b1, b2]
    assert ids(batch="b1") == [a1, a2]
    assert ids(group="g1") == [a1, b1]
    assert ids(name="beta") == [b1, b2]
    assert ids(queue="q1") == [a1, b1]
    assert ids(name="alpha", group="g2") == [a2]
    assert ids(batch="nope") == []


def test_list_tasks_order_and_paging(store):
    tids = submit(store, *[new(f"t{i}") for i in range(7)])
    newest = [t.id for t in store.list_tasks(TaskFilter())]
    assert newest == list(reversed(tids))
    oldest = [t.id for t in store.list_tasks(TaskFilter(newest_first=False))]
    assert oldest == tids
    assert [t.id for t in store.list_tasks(TaskFilter(newest_first=False, limit=3))] == tids[:3]
    assert [t.id for t in store.list_tasks(TaskFilter(newest_first=False, limit=3, offset=3))] == tids[3:6]
    assert [t.id for t in store.list_tasks(TaskFilter(newest_first=False, limit=3, offset=6))] == tids[6:]
    assert [t.id for t in store.list_tasks(TaskFilter(limit=2, offset=1))] == [tids[5], tids[4]]
    assert store.list_tasks(TaskFilter(offset=50)) == []


def test_list_tasks_returns_full_records(store):
    tid = submit_one(store, "x", priority=3, batch="b", args='{"args":[1],"kwargs":{}}')
    (rec,) = store.list_tasks(TaskFilter(batch="b"))
    full = store.get(tid)
    assert rec.id == tid and rec.name == "x" and rec.priority == 3
    assert rec.status == full.status and rec.arguments == ([1], {})


# ---- batch summaries -----------------------------------------------------------


def _run_batch(store, batch, outcomes):
    ids = submit(store, *[new(f"{batch}-{i}", batch=batch) for i in range(len(outcomes))])
    for tid, status in zip(ids, outcomes):
        rec = claim_one(store, names=[store.get(tid).name])
        if status is not None:
            assert finish(store, rec, status, error=None if status is State.SUCCESS else "x")
    return ids


def test_batch_summary_running(store):
    _run_batch(store, "b", [State.SUCCESS, None])
    submit_one(store, "b-pending", batch="b")
    s = store.batch_summary("b")
    assert s.batch == "b"
    assert s.total == 3
    assert {k: v for k, v in s.counts.items() if v} == {"SUCCESS": 1, "RUNNING": 1, "PENDING": 1}
    assert s.status == "RUNNING"
    assert s.first_created_at is not None


def test_batch_summary_all_success(store):
    _run_batch(store, "b", [State.SUCCESS] * 3)
    _run_batch(store, "other", [State.FAILED])
    s = store.batch_summary("b")
    assert s.total == 3
    assert {k: v for k, v in s.counts.items() if v} == {"SUCCESS": 3}
    assert s.status == "ALL_SUCCESS"
    assert s.avg_duration is not None and s.avg_duration >= 0
    assert s.p99_duration is not None and s.p99_duration >= s.avg_duration - 1e-9
    assert s.first_created_at is not None and s.last_finished_at is not None
    assert s.last_finished_at >= s.first_created_at
    recs = store.list_tasks(TaskFilter(batch="b"))
    durations = sorted(t.finished_at - t.started_at for t in recs)
    assert s.avg_duration == pytest.approx(sum(durations) / 3, abs=1e-3)
    assert s.p99_duration == pytest.approx(durations[-1], abs=1e-3)
    assert s.last_finished_at == pytest.approx(max(t.finished_at for t in recs), abs=1e-3)
    assert s.first_created_at == pytest.approx(min(t.created_at for t in recs), abs=1e-3)


def test_batch_summary_partial_success(store):
    _run_batch(store, "b", [State.SUCCESS, State.FAILED, State.CANCELED])
    s = store.batch_summary("b")
    assert s.status == "PARTIAL_SUCCESS"
    assert {k: v for k, v in s.counts.items() if v} == {"SUCCESS": 1, "FAILED": 1, "CANCELED": 1}


def test_batch_summary_failed(store):
    _run_batch(store, "b", [State.FAILED, State.TIMEOUT])
    s = store.batch_summary("b")
    assert s.status == "FAILED"
    assert s.total == 2


def test_batch_summary_empty(store):
    s = store.batch_summary("nothing")
    assert s.total == 0
    assert s.status == "EMPTY"
    assert s.avg_duration is None and s.last_finished_at is None


def test_a_search_by_group_finds_its_tasks_in_every_state_in_id_order(store):
    ids = submit(
        store,
        *[new("t", group="g") for _ in range(4)],
        new("t", group="g", halt_group_on_failure=True),
        *[new("t", group="g") for _ in range(3)],
    )
    outcomes = [State.SUCCESS, State.FAILED, State.CANCELED, State.TIMEOUT, State.FAILED]  # the fifth halts the line
    for status in outcomes:
        (c,) = store.claim("w", ClaimRequest(["default"], 1, names=["t"]))
        assert finish(store, c.tasks[0], status)
    (other,) = submit(store, new("t", group="other"))
    running = claim(store, 5)  # the halted line holds the rest back; the other group runs
    assert claimed_ids(running) == [other]
    states = [store.get(i).status for i in ids[:8]]
    assert states[:5] == outcomes and states[5:] == [State.PENDING] * 3

    def found(**kw):
        return [t.id for t in store.list_tasks(TaskFilter(group="g", **kw))]

    assert found() == list(reversed(ids[:8]))  # in the line and out of it, newest first
    assert found(newest_first=False, limit=3, offset=3) == ids[3:6]  # pages across both
    assert found(limit=2, offset=2) == [ids[5], ids[4]]
    assert found(status=State.FAILED) == [ids[4], ids[1]]  # halted (in the line) and not
    assert found(newest_first=False, after_id=ids[2], limit=3) == ids[3:6]
