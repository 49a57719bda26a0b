"""submit() and get(): ids, atomic batches, idempotency keys, round trips, run_at."""

from __future__ import annotations

import json

import pytest

from corral.core.claims import ClaimRequest
from corral.core.model import LimitSpec, TaskFilter
from corral.core.states import State
from corral.errors import StoreError, SubmitError

from .conftest import claim, claim_one, claimed_ids, finish, new, submit, submit_one


def all_ids(store) -> list[int]:
    return [t.id for t in store.list_tasks(TaskFilter(limit=10_000, newest_first=False))]


def test_ids_increase_in_submit_order(store):
    first = submit(store, new("a"), new("b"), new("c"))
    second = submit(store, new("d"))
    third = submit(store, new("e"), new("f"))
    ids = first + second + third
    assert ids == sorted(ids)
    assert len(set(ids)) == 6
    assert [store.get(i).name for i in ids] == ["a", "b", "c", "d", "e", "f"]


def test_submit_result_says_created(store):
    results = store.submit([new("a"), new("b")])
    assert [r.created for r in results] == [True, True]


def _fail_third_row(store, store_kind: str, monkeypatch: pytest.MonkeyPatch) -> list:
    """A batch whose third row fails while the batch is being inserted, after
    the store checked it (dependencies, keys) and wrote the rows before it."""
    batch = [new("x1"), new("x2", depends_on=()), new("x3"), new("x4")]
    if store_kind == "memory":
        import corral.stores.memory as memory

        made = iter(range(1_000))
        real = memory.TaskRecord

        def third_fails(*a, **kw):
            if next(made) == 2:
                raise MemoryError("third row")
            return real(*a, **kw)

        monkeypatch.setattr(memory, "TaskRecord", third_fails)
    elif store_kind == "sqlite":
        import sqlite3

        # a trigger in the file, seen by every connection: the database rejects row 3
        # after rows 1 and 2 were inserted in the same transaction
        con = sqlite3.connect(store.path)
        con.execute(
            "CREATE TRIGGER reject_x3 BEFORE INSERT ON tasks WHEN NEW.name = 'x3'"
            " BEGIN SELECT RAISE(ABORT, 'row rejected'); END"
        )
        con.commit()
        con.close()
    else:
        import psycopg

        with psycopg.connect(store.url, autocommit=True) as con:
            con.execute(
                "CREATE FUNCTION reject_x3() RETURNS trigger LANGUAGE plpgsql AS"
                " $$BEGIN IF NEW.name = 'x3' THEN RAISE EXCEPTION 'row rejected'; END IF; RETURN NEW; END$$"
            )
            con.execute(
                "CREATE TRIGGER reject_x3 BEFORE INSERT ON corral_tasks FOR EACH ROW EXECUTE FUNCTION reject_x3()"
            )
    return batch


def test_bulk_submit_is_atomic(store, store_kind, monkeypatch):
    """A batch that fails in the middle of its insert leaves nothing behind."""
    before = submit_one(store, "before")
    batch = _fail_third_row(store, store_kind, monkeypatch)
    with pytest.raises((StoreError, MemoryError)) as failed:
        store.submit(batch)
    if store_kind != "memory":
        assert "row rejected" in str(failed.value) and "\n" not in str(failed.value)
    monkeypatch.undo()
    assert all_ids(store) == [before]
    assert sum(store.counts().values()) == 1
    assert store.get(before + 1) is None and store.get(before + 2) is None
    assert claimed_ids(claim(store, 5)) == [before], "no half-written row is claimable"
    # the store is still usable and the next ids still increase
    after = submit_one(store, "after")
    assert after > before
    assert [t.name for t in store.list_tasks(TaskFilter(newest_first=False))] == ["before", "after"]


def test_bulk_submit_with_an_unknown_dependency_stores_nothing(store):
    before = submit_one(store, "before")
    with pytest.raises(SubmitError):
        store.submit([new("x1"), new("x2", depends_on=(before + 10_000,)), new("x3")])
    assert all_ids(store) == [before]


def test_unknown_dependency_alone_raises_and_stores_nothing(store):
    with pytest.raises(SubmitError):
        store.submit([new("x", depends_on=(424242,))])
    assert all_ids(store) == []


def test_idempotency_key_returns_existing_id(store):
    (r1,) = store.submit([new("a", key="k1", args='{"args":[1],"kwargs":{}}')])
    assert r1.created is True
    (r2,) = store.submit([new("a", key="k1", args='{"args":[2],"kwargs":{}}')])
    assert r2.created is False
    assert r2.id == r1.id
    assert all_ids(store) == [r1.id]
    assert json.loads(store.get(r1.id).args) == {"args": [1], "kwargs": {}}


def test_idempotency_key_in_a_mixed_batch(store):
    (existing,) = submit(store, new("a", key="k1"))
    results = store.submit([new("b"), new("a", key="k1"), new("c", key="k2")])
    assert [r.created for r in results] == [True, False, True]
    assert results[1].id == existing
    assert results[0].id > existing and results[2].id > results[0].id
    assert sorted(all_ids(store)) == sorted({existing, results[0].id, results[2].id})
    # keys stay taken after the task ends
    rec = claim_one(store)
    assert rec.id == existing
    assert finish(store, rec)
    (again,) = store.submit([new("a", key="k1")])
    assert again.created is False and again.id == existing


def test_get_round_trips_every_field(store):
    store.set_limit(LimitSpec("api", concurrency=3))
    store.set_limit(LimitSpec("db", concurrency=5))
    dep = submit_one(store, "dep")
    args = '{"args":[1,"two",[3.5,null]],"kwargs":{"x":{"y":true},"u":"é"}}'
    before = store.now()
    (tid,) = submit(
        store,
        new(
            "full.task",
            group="g-1",
            args=args,
            queue="q1",
            priority=7,
            max_retries=4,
            timeout=12.5,
            batch="batch-1",
            key="key-1",
            trace_id="trace-abc",
            limits=("api", "db"),
            depends_on=(dep,),
            halt_group_on_failure=True,
        ),
    )
    rec = store.get(tid)
    assert rec is not None
    assert rec.id == tid
    assert rec.name == "full.task"
    assert json.loads(rec.args) == json.loads(args)
    assert rec.arguments == ([1, "two", [3.5, None]], {"x": {"y": True}, "u": "é"})
    assert rec.queue == "q1"
    assert rec.priority == 7
    assert rec.max_retries == 4
    assert rec.timeout == pytest.approx(12.5)
    assert rec.group == "g-1"
    assert rec.batch == "batch-1"
    assert rec.key == "key-1"
    assert rec.trace_id == "trace-abc"
    assert sorted(rec.limits) == ["api", "db"]
    assert tuple(rec.depends_on) == (dep,)
    assert rec.halt_group_on_failure is True
    assert State(rec.status) is State.WAITING
    assert rec.attempt == 0
    assert rec.created_at >= before - 1.0
    assert rec.started_at is None and rec.finished_at is None
    assert rec.result is None and rec.error is None
    assert rec.lease_token is None and rec.worker_id is None
    assert rec.cancel_requested is False


def test_defaults_round_trip(store):
    tid = submit_one(store, "plain")
    rec = store.get(tid)
    assert State(rec.status) is State.PENDING
    assert rec.queue == "default"
    assert rec.priority == 0
    assert rec.max_retries == 0
    assert rec.timeout is None
    assert rec.group is None and rec.batch is None and rec.key is None and rec.trace_id is None
    assert tuple(rec.limits) == () and tuple(rec.depends_on) == ()
    assert rec.halt_group_on_failure is False
    assert abs(rec.run_at - store.now()) < 5.0


def test_get_unknown_is_none(store):
    assert store.get(987654) is None


def test_future_run_at_not_claimable_until_it_comes(store, advance):
    soon = submit_one(store, "later", run_at=store.now() + 5)
    assert store.get(soon).status == State.PENDING
    assert claim(store, 5) == []
    advance(4)
    assert claim(store, 5) == []
    advance(2)
    claims = claim(store, 5)
    assert claimed_ids(claims) == [soon]


def test_past_run_at_is_claimable(store):
    tid = submit_one(store, "overdue", run_at=store.now() - 60)
    assert claimed_ids(claim(store, 5)) == [tid]


def test_migrate_again_keeps_tasks(store):
    tid = submit_one(store, "kept", key="k")
    store.migrate()
    assert store.get(tid).name == "kept"
    (again,) = store.submit([new("kept", key="k")])
    assert again.id == tid and again.created is False


def test_tasks_are_shared_between_instances(store, second_store):
    tid = submit_one(store, "shared", args='{"args":[7],"kwargs":{}}')
    rec = second_store.get(tid)
    assert rec is not None and rec.arguments == ([7], {})
    (c,) = second_store.claim("w2", ClaimRequest(["default"], 5))
    assert [t.id for t in c.tasks] == [tid]
    assert store.get(tid).status == State.RUNNING
    assert store.claim("w1", ClaimRequest(["default"], 5)) == []


def test_a_bounded_submit_counts_inside_its_write_so_racing_submitters_never_overshoot(store):
    from corral.errors import QueueFull
    from helpers import run_concurrently

    submit(store, *[new() for _ in range(3)])

    def one(i: int) -> bool:
        try:
            store.submit([new(), new()], max_queued=7)
            return True
        except QueueFull:
            return False

    stored = run_concurrently(6, one)
    assert stored.count(True) == 2  # 3 + 2 + 2 = 7: a third pair would overshoot
    assert sum(store.active_counts().values()) == 7
    with pytest.raises(QueueFull, match="bound 7"):
        store.submit([new()], max_queued=7)
    assert store.submit([new()], max_queued=None)  # no bound asked: stored
