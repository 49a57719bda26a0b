"""claim(): max_units, queues and names, order, what a claim sets, exclusivity."""

from __future__ import annotations

import threading
import time

from corral.core.claims import ClaimRequest
from corral.core.states import State
from corral.stores import open_store

from .conftest import claim, claim_one, claimed_ids, finish, new, status_of, submit, submit_one


def test_never_more_than_max_units(store):
    ids = submit(store, *[new() for _ in range(10)])
    first = claim(store, 3)
    assert len(first) == 3
    assert all(len(c.tasks) == 1 for c in first)
    second = claim(store, 4)
    assert len(second) == 4
    rest = claim(store, 100)
    assert len(rest) == 3
    assert claim(store, 100) == []
    assert sorted(claimed_ids(first + second + rest)) == ids


def test_zero_units_claims_nothing(store):
    tid = submit_one(store)
    assert claim(store, 0) == []
    assert status_of(store, tid) is State.PENDING


def test_only_asked_queues(store):
    a = submit_one(store, queue="a")
    b = submit_one(store, queue="b")
    c = submit_one(store, queue="c")
    d = submit_one(store)  # "default"
    assert claim(store, 10, queues=["x"]) == []
    got = claim(store, 10, queues=["a", "c"])
    assert sorted(claimed_ids(got)) == [a, c]
    assert status_of(store, b) is State.PENDING
    assert status_of(store, d) is State.PENDING
    assert claimed_ids(claim(store, 10, queues=["b"])) == [b]
    assert claimed_ids(claim(store, 10)) == [d]


def test_only_known_names(store):
    a = submit_one(store, "alpha")
    b = submit_one(store, "beta")
    c = submit_one(store, "gamma")
    assert claim(store, 10, names=["delta"]) == []
    assert sorted(claimed_ids(claim(store, 10, names=["gamma", "alpha"]))) == [a, c]
    assert status_of(store, b) is State.PENDING
    assert claimed_ids(claim(store, 10, names=None)) == [b]


def test_priority_then_id_order(store):
    prios = [0, 5, 0, 10, 5, -3, 10, 0]
    ids = submit(store, *[new(f"t{i}", priority=p) for i, p in enumerate(prios)])
    expected = [i for _, _, i in sorted((-p, i, i) for p, i in zip(prios, ids))]
    order = []
    for _ in ids:
        rec = claim_one(store)
        order.append(rec.id)
    assert order == expected
    assert claim(store, 1) == []


def test_priority_order_within_one_claim_call(store):
    low = submit_one(store, "low", priority=0)
    high = submit_one(store, "high", priority=9)
    mid = submit_one(store, "mid", priority=4)
    got = claim(store, 2)
    assert sorted(claimed_ids(got)) == sorted([high, mid])
    assert status_of(store, low) is State.PENDING


def test_claim_sets_running_token_version_attempt_started(store):
    tid = submit_one(store)
    before = store.get(tid)
    t0 = store.now()
    (c,) = claim(store, 1, lease_seconds=30)
    (rec,) = c.tasks
    assert c.token
    assert c.group is None
    assert rec.id == tid
    assert rec.status == State.RUNNING
    assert rec.lease_token == c.token
    assert rec.version == before.version + 1
    assert rec.attempt == before.attempt + 1 == 1
    assert rec.started_at is not None and rec.started_at >= t0 - 1.0
    assert rec.lease_expires_at is not None
    assert rec.lease_expires_at >= t0 + 29
    assert rec.worker_id == "w1"
    stored = store.get(tid)
    assert stored.status == State.RUNNING
    assert stored.version == rec.version
    assert stored.lease_token == c.token
    assert stored.attempt == 1
    assert stored.started_at == rec.started_at


def test_each_claim_gets_its_own_token(store):
    submit(store, *[new() for _ in range(3)])
    tokens = [c.token for c in claim(store, 3)]
    assert len(set(tokens)) == 3


def test_running_tasks_are_not_claimed_again(store):
    tid = submit_one(store)
    assert claimed_ids(claim(store, 5)) == [tid]
    assert claim(store, 5) == []


def _claim_concurrently(stores, total, threads=8):
    seen: list[list[int]] = [[] for _ in range(threads)]
    errors: list[BaseException] = []
    lock = threading.Lock()
    count = [0]
    start = threading.Barrier(threads)
    deadline = time.monotonic() + 30

    def run(n: int) -> None:
        s = stores[n % len(stores)]
        try:
            start.wait()
            while time.monotonic() < deadline:
                with lock:
                    if count[0] >= total:
                        return
                got = claimed_ids(s.claim(f"w{n}", ClaimRequest(["default"], 7, lease_seconds=60)))
                seen[n].extend(got)
                with lock:
                    count[0] += len(got)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    workers = [threading.Thread(target=run, args=(n,)) for n in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(60)
    assert not errors, errors
    return [i for part in seen for i in part]


def test_claim_exclusivity_under_threads(store):
    ids = submit(store, *[new() for _ in range(500)])
    got = _claim_concurrently([store], len(ids))
    assert len(got) == len(set(got)), "a task was claimed twice"
    assert sorted(got) == ids
    assert store.counts().get("RUNNING", 0) == 500


def test_claim_exclusivity_across_instances(store, second_store):
    ids = submit(store, *[new() for _ in range(200)])
    third = open_store(store.url)
    try:
        got = _claim_concurrently([store, second_store, third], len(ids), threads=6)
    finally:
        third.close()
    assert len(got) == len(set(got)), "a task was claimed twice"
    assert sorted(got) == ids


def test_finished_task_is_not_claimed(store):
    tid = submit_one(store)
    rec = claim_one(store)
    assert finish(store, rec)
    assert claim(store, 5) == []
    assert status_of(store, tid) is State.SUCCESS


def test_earlier_run_at_goes_before_smaller_id(store):
    late = submit_one(store, "late")
    early = submit_one(store, "early", run_at=store.now() - 60)
    assert claim_one(store).id == early
    assert claim_one(store).id == late


def test_retry_queues_behind_work_submitted_during_its_backoff(store, advance):
    first = submit_one(store, "first", max_retries=2)
    rec = claim_one(store)
    assert finish(store, rec, State.RETRYING, run_at=store.now() + 5)
    fresh = submit_one(store, "fresh")
    advance(6)
    assert claim_one(store).id == fresh
    assert claim_one(store).id == first
