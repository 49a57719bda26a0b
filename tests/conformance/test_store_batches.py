"""Batches on every store: a per-batch limit is a named limit every claimer
respects, and a batch's callback is submitted exactly once, with the batch
summary, when the batch reaches a final status."""

from __future__ import annotations

import threading

from corral.core.batches import Callback, callback_key, limit_name
from corral.core.model import LimitSpec, TaskFilter, loads
from corral.core.states import State
from corral.stores import open_store

from .conftest import claim, claim_one, claimed_ids, finish, new, submit

REPORT = Callback("report", queue="reports", max_retries=2).to_json()


def run_all(store, n: int, statuses=None) -> None:
    """Claim and end ``n`` tasks one by one (SUCCESS unless ``statuses`` says)."""
    for i in range(n):
        rec = claim_one(store)
        finish(store, rec, (statuses or {}).get(i, State.SUCCESS))


def test_callback_is_submitted_once_with_the_summary_when_the_batch_ends(store):
    store.set_batch("b1", REPORT)
    submit(store, *[new(batch="b1") for _ in range(3)])
    assert store.settle_batches(["b1"]) == []  # nothing ran yet
    rec = claim_one(store)
    finish(store, rec)
    assert store.settle_batches(["b1"]) == []  # two still queued
    run_all(store, 2, {1: State.FAILED})
    (cb_id,) = store.settle_batches(["b1"])
    assert store.settle_batches(["b1"]) == [] and store.settle_batches(None) == []
    cb = store.get(cb_id)
    assert cb is not None
    assert (cb.name, cb.queue, cb.max_retries, cb.batch, cb.key) == ("report", "reports", 2, None, callback_key("b1"))
    (summary,) = loads(cb.args)["args"]
    assert summary["batch"] == "b1" and summary["status"] == "PARTIAL_SUCCESS" and summary["total"] == 3
    assert summary["counts"] == {"SUCCESS": 2, "FAILED": 1}


def test_all_batches_settled_by_a_sweep_call(store):
    store.set_batch("a", REPORT)
    store.set_batch("b", REPORT)
    store.set_batch("quiet", None)  # no callback: never settled
    submit(store, new(batch="a"), new(batch="b"), new(batch="quiet"))
    run_all(store, 3)
    ids = store.settle_batches(None)
    assert len(ids) == 2
    assert sorted(loads(store.get(i).args)["args"][0]["batch"] for i in ids) == ["a", "b"]
    assert store.settle_batches(None) == []


def test_canceled_tasks_end_a_batch_too(store):
    store.set_batch("c", REPORT)
    (tid,) = submit(store, new(batch="c"))
    store.cancel(tid)
    (cb_id,) = store.settle_batches(["c"])
    assert loads(store.get(cb_id).args)["args"][0]["status"] == "FAILED"


def test_unknown_and_empty_batches_settle_nothing(store):
    store.set_batch("empty", REPORT)
    assert store.settle_batches(["empty", "never-declared"]) == []
    assert store.settle_batches([]) == []


def test_racing_settlers_submit_exactly_one_callback(store, store_kind):
    store.set_batch("race", REPORT)
    submit(store, *[new(batch="race") for _ in range(2)])
    run_all(store, 2)
    others = [store] * 6 if store_kind == "memory" else [open_store(store.url) for _ in range(6)]
    got: list[int] = []
    lock = threading.Lock()
    gate = threading.Barrier(len(others))

    def settle(s):
        gate.wait()
        ids = s.settle_batches(["race"])
        with lock:
            got.extend(ids)

    threads = [threading.Thread(target=settle, args=(s,)) for s in others]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    if store_kind != "memory":
        for s in others:
            s.close()
    assert len(got) == 1
    callbacks = store.list_tasks(TaskFilter(name="report"))
    assert [r.id for r in callbacks] == got


def test_batch_limit_caps_claims_across_claimers(store, second_store):
    store.set_limit(LimitSpec(limit_name("lim"), 2, None, None))
    submit(store, *[new(batch="lim", limits=(limit_name("lim"),)) for _ in range(5)], new())
    first = claim(store, 10)
    assert len(first) == 3  # two of the batch, and the task outside it
    assert claim(second_store, 10) == []
    (one,) = [c.tasks[0] for c in first if c.tasks[0].batch == "lim"][:1]
    finish(store, one)
    assert len(claimed_ids(claim(second_store, 10))) == 1
