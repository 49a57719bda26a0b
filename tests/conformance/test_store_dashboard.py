"""The dashboard's reads: queues, group lines, batches, recent finishes, search and keyset paging."""

from __future__ import annotations

from corral.core.model import TaskFilter
from corral.core.states import State

from .conftest import claim, claim_one, finish, new, submit, submit_one


def test_queue_counts_hold_live_tasks_only(store):
    submit(store, new("a"), new("b"), new("c", queue="mail"))
    done = submit_one(store, "d", queue="old")
    rec = claim_one(store, queues=("old",))
    assert rec.id == done and finish(store, rec)
    claim_one(store)  # one of default runs
    got = store.queue_counts()
    assert got == {"default": {"PENDING": 1, "RUNNING": 1}, "mail": {"PENDING": 1}}


def test_group_lines_put_blocked_groups_first(store):
    submit(
        store, new("x", "g-free"), new("x", "g-free"), new("x", "a-stuck", max_retries=0, halt_group_on_failure=True)
    )
    submit(store, new("x", "a-stuck"), new("y"))
    claims = claim(store, 5)
    heads = {c.tasks[0].group: c.tasks[0] for c in claims}
    assert finish(store, heads["a-stuck"], State.FAILED, error="boom")
    lines = store.group_lines()
    assert [gl.group for gl in lines] == ["a-stuck", "g-free"]
    stuck, free = lines
    assert stuck.blocked and stuck.head_status == "FAILED" and stuck.head_error == "boom" and stuck.backlog == 2
    assert not free.blocked and free.head_status == "RUNNING" and free.head_worker == "w1" and free.backlog == 2
    assert [gl.group for gl in store.group_lines(limit=1, offset=1)] == ["g-free"]


def test_batch_list_pages_by_name_with_counts(store):
    submit(store, *(new("t", batch=f"b{i}") for i in range(5)), new("t", batch="b1"), new("t"))
    rec = claim_one(store)
    assert rec.batch == "b0" and finish(store, rec)
    first = store.batch_list(limit=2)
    assert first == [("b0", {"SUCCESS": 1}), ("b1", {"PENDING": 2})]
    rest = store.batch_list(after="b1", limit=10)
    assert [b for b, _ in rest] == ["b2", "b3", "b4"]
    assert store.batch_list(after="b4") == []


def test_recent_finished_reads_a_window(store, advance):
    ids = submit(store, new("a"), new("b"), new("c"))
    r = claim_one(store)
    assert finish(store, r)
    advance(100)
    since = store.now() - 1
    r = claim_one(store)
    assert finish(store, r, State.FAILED, error="x")
    r = claim_one(store)
    assert finish(store, r)
    got = store.recent_finished(since, 10)
    assert [(f.id, f.status) for f in got] == [(ids[1], "FAILED"), (ids[2], "SUCCESS")]
    assert got[0].name == "b" and got[0].queue == "default" and got[0].started_at is not None
    assert [f.id for f in store.recent_finished(since, 1, newest_first=True)] == [ids[2]]
    assert len(store.recent_finished(0, 10)) == 3


def test_search_by_trace_id_and_key_with_keyset_paging(store):
    ids = submit(store, *(new("t", trace_id="tr-1") for _ in range(5)), new("t", key="k-9", trace_id="tr-2"))
    assert [r.id for r in store.list_tasks(TaskFilter(key="k-9"))] == [ids[5]]
    page1 = store.list_tasks(TaskFilter(trace_id="tr-1", limit=2))
    assert [r.id for r in page1] == [ids[4], ids[3]]
    page2 = store.list_tasks(TaskFilter(trace_id="tr-1", limit=2, after_id=page1[-1].id))
    assert [r.id for r in page2] == [ids[2], ids[1]]
    up = store.list_tasks(TaskFilter(trace_id="tr-1", limit=2, after_id=ids[1], newest_first=False))
    assert [r.id for r in up] == [ids[2], ids[3]]


def test_queue_counts_add_grouped_and_plain_tasks(store):
    submit(store, new("a", "g1"), new("b"), new("c", "g2"), new("d", queue="mail"), new("e", "g3", queue="mail"))
    assert store.queue_counts() == {"default": {"PENDING": 3}, "mail": {"PENDING": 2}}
