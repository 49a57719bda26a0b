"""Lists that find things, on every store: the tasks each worker holds
(``held_tasks``), an id range on ``list_tasks``, and the Tasks page's query
(corral.edges.task_lists) built on them: a worker filter, age bounds, sorts
and keyset pages that neither skip nor repeat a task."""

from __future__ import annotations

from corral.core.claims import ClaimRequest
from corral.core.model import TaskFilter
from corral.core.states import State
from corral.edges.task_lists import TaskQuery, find_tasks, first_id_after, matching_ids

from .conftest import claim, finish, new, submit, submit_one


def _all_pages(store, query: TaskQuery) -> list[list[int]]:
    pages = []
    while True:
        page = find_tasks(store, query)
        pages.append([r.id for r in page.rows])
        if page.next is None:
            return pages
        query.after = page.next


def test_held_tasks_are_each_workers_by_worker_then_id_and_page_by_position(store):
    ids = submit(store, *[new(f"t{i}") for i in range(5)])
    store.claim("w-b", ClaimRequest(["default"], 2))  # ids[0], ids[1]: claimed into a slot, held by w-b
    store.claim("w-a", ClaimRequest(["default"], 2, prefetch=True))  # ids[2], ids[3]: held, not started
    (w_b1, w_b2) = ids[:2]
    held = store.held_tasks()
    assert [(r.worker_id, r.id) for r in held] == [("w-a", ids[2]), ("w-a", ids[3]), ("w-b", w_b1), ("w-b", w_b2)]
    assert {r.status for r in held} <= {State.RUNNING, State.RESERVED}
    assert {r.status for r in held[:2]} == {State.RESERVED}
    assert [r.id for r in store.held_tasks(worker="w-b")] == [w_b1, w_b2]
    assert store.held_tasks(worker="nobody") == []
    # the next page starts after a (worker, id) position, at most limit rows
    assert [r.id for r in store.held_tasks(limit=1, after=("w-a", ids[3]))] == [w_b1]
    assert [r.id for r in store.held_tasks(worker="w-b", after=("w-b", w_b1))] == [w_b2]
    # a task that ended, and one never claimed, are held by no one
    (rec,) = [r for r in held if r.id == w_b1]
    finish(store, store.get(w_b1))
    assert ids[4] not in {r.id for r in store.held_tasks()}
    assert w_b1 not in {r.id for r in store.held_tasks()}
    assert rec.worker_id == "w-b"


def test_list_tasks_keeps_to_an_id_range_both_ways(store):
    ids = submit(store, *[new("t") for _ in range(6)])
    flt = TaskFilter(min_id=ids[1], max_id=ids[4])
    assert [r.id for r in store.list_tasks(flt)] == ids[4:0:-1]
    flt = TaskFilter(min_id=ids[1], max_id=ids[4], newest_first=False, after_id=ids[2])
    assert [r.id for r in store.list_tasks(flt)] == ids[3:5]


def test_pages_by_submit_age_and_state_cover_every_task_once(store):
    ids = submit(store, *[new("a" if i % 2 else "b") for i in range(11)])
    claim(store, 2)  # ids[0] and ids[1] held
    for tid in ids[2:4]:
        store.cancel(tid)
    newest = _all_pages(store, TaskQuery(limit=4))
    assert [len(p) for p in newest] == [4, 4, 3]
    assert sum(newest, []) == ids[::-1]
    oldest = _all_pages(store, TaskQuery(limit=4, sort="age"))
    assert sum(oldest, []) == ids
    by_state = sum(_all_pages(store, TaskQuery(limit=3, sort="status")), [])
    assert sorted(by_state) == ids  # each once
    states = [store.get(i).status.value for i in by_state]
    assert states == ["PENDING"] * 7 + ["RUNNING"] * 2 + ["CANCELED"] * 2
    assert by_state[:7] == sorted(ids[4:], reverse=True)  # newest first within a state
    # a filter and a sort together
    only_a = sum(_all_pages(store, TaskQuery(name="a", sort="age", limit=2)), [])
    assert only_a == [i for n, i in enumerate(ids) if n % 2]


def test_a_worker_filter_reads_what_that_worker_holds(store):
    ids = submit(store, *[new("t", queue="q1") for _ in range(3)], new("u", queue="q1"))
    store.claim("w-x", ClaimRequest(["q1"], 4))
    submit_one(store, "t", queue="q1")  # not held
    page = find_tasks(store, TaskQuery(worker="w-x", limit=2))
    assert [r.id for r in page.rows] == [ids[3], ids[2]] and page.next is not None
    rest = find_tasks(store, TaskQuery(worker="w-x", limit=2, after=page.next))
    assert [r.id for r in rest.rows] == [ids[1], ids[0]] and rest.next is None
    assert [r.id for r in find_tasks(store, TaskQuery(worker="w-x", name="u")).rows] == [ids[3]]
    assert find_tasks(store, TaskQuery(worker="w-other")).rows == []


def test_ages_bound_the_list_by_submit_time(store, advance):
    old = submit(store, *[new("t") for _ in range(3)])
    advance(600)
    mid = submit(store, *[new("t") for _ in range(2)])
    advance(600)
    fresh = submit(store, new("t"))
    now = store.now()
    assert first_id_after(store, now - 900, strictly=False) == mid[0]
    assert first_id_after(store, now + 1, strictly=False) is None
    older = [r.id for r in find_tasks(store, TaskQuery(min_age=300)).rows]
    assert older == (old + mid)[::-1]
    newer = [r.id for r in find_tasks(store, TaskQuery(max_age=900, sort="age")).rows]
    assert newer == mid + fresh
    between = [r.id for r in find_tasks(store, TaskQuery(min_age=300, max_age=900)).rows]
    assert between == mid[::-1]
    assert find_tasks(store, TaskQuery(min_age=5000)).rows == []
    # paged, the bounds hold on every page
    pages = _all_pages(store, TaskQuery(min_age=300, limit=2, sort="status"))
    assert sorted(sum(pages, [])) == sorted(old + mid)


def test_matching_ids_reads_a_filtered_set_page_by_page(store):
    ids = submit(store, *[new("t", batch="b1") for _ in range(7)], new("t", batch="b2"))
    assert matching_ids(store, TaskQuery(batch="b1"), 100) == ids[6::-1]
    assert matching_ids(store, TaskQuery(batch="b1"), 3) == ids[6:3:-1]
    assert matching_ids(store, TaskQuery(batch="b1", max_id=ids[2]), 100) == ids[2::-1]


def test_an_age_bound_holds_across_gaps_in_the_ids(store, advance):
    """Ids have gaps (deleted tasks, sequences): the search must still end, at the right task."""
    ids = submit(store, *[new("t") for _ in range(12)])
    for tid in ids[1:5] + ids[6:11]:
        store.cancel(tid)
    assert store.prune({"CANCELED": store.now() + 1}, 100) == 9
    kept = [ids[0], ids[5], ids[11]]
    advance(600)
    later = submit(store, new("t"))
    now = store.now()
    assert first_id_after(store, now - 300, strictly=False) == later[0]
    assert first_id_after(store, now - 900, strictly=False) == kept[0]
    assert [r.id for r in find_tasks(store, TaskQuery(min_age=300)).rows] == kept[::-1]
    assert [r.id for r in find_tasks(store, TaskQuery(max_age=300)).rows] == later
