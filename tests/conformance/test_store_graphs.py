"""A graph in one submit: tasks name earlier tasks of the same call by position
(``after``); the store gives the ids, all or nothing. Fan-in reads upstream
results with ``Store.upstream``."""

from __future__ import annotations

import pytest

from corral.core.states import State
from corral.errors import QueueFull, SubmitError

from .conftest import claim, claim_one, claimed_ids, finish, new, status_of, submit


def test_graph_in_one_submit_waits_on_ids_it_assigns(store):
    # fetch -> (parse_a, parse_b) -> report
    ids = submit(
        store,
        new("fetch", ref="fetch"),
        new("parse", ref="parse_a", after=(0,)),
        new("parse", ref="parse_b", after=(0,)),
        new("report", ref="report", after=(1, 2)),
    )
    fetch, pa, pb, report = ids
    assert [status_of(store, i) for i in ids] == [State.PENDING, State.WAITING, State.WAITING, State.WAITING]
    rec = store.get(report)
    assert rec.depends_on == (pa, pb)
    assert rec.ref == "report"
    assert claimed_ids(claim(store, 10)) == [fetch]


def test_graph_runs_layer_by_layer_and_fans_in(store):
    fetch, pa, pb, report = submit(
        store,
        new("fetch", ref="fetch"),
        new("parse", ref="parse_a", after=(0,)),
        new("parse", ref="parse_b", after=(0,)),
        new("report", ref="report", after=(1, 2)),
    )
    rec = claim_one(store)
    assert rec.id == fetch
    assert finish(store, rec, result='{"pages":2}')
    got = {t.id: t for c in claim(store, 10) for t in c.tasks}
    assert sorted(got) == [pa, pb]
    assert finish(store, got[pa], result="1")
    assert status_of(store, report) is State.WAITING
    assert finish(store, got[pb], result='"two"')
    rec = claim_one(store)
    assert rec.id == report
    ups = store.upstream(report)
    assert [(u.id, u.ref, u.result) for u in ups] == [(pa, "parse_a", "1"), (pb, "parse_b", '"two"')]


def test_graph_can_mix_ids_of_stored_tasks_and_positions(store):
    (old,) = submit(store, new("old"))
    a, b = submit(store, new("a"), new("b", depends_on=(old,), after=(0,)))
    assert store.get(b).depends_on == (old, a)
    assert [u.id for u in store.upstream(b)] == [old, a]


def test_failure_inside_a_graph_cancels_down_it(store):
    a, b, c, d = submit(
        store,
        new("a"),
        new("b", after=(0,)),
        new("c", after=(1,)),
        new("d", after=(1,), on_upstream_failure="run"),
    )
    assert finish(store, claim_one(store), State.FAILED, error="boom")
    assert store.get(b).status is State.CANCELED and store.get(b).error == f"upstream {a} ended FAILED"
    assert store.get(c).status is State.CANCELED and store.get(c).error == f"upstream {b} ended CANCELED"
    assert status_of(store, d) is State.PENDING
    assert [t.id for t in store.dead_letters()] == [a]


def test_graph_member_with_existing_key_is_depended_on_by_its_old_id(store):
    (old,) = submit(store, new("a", key="k1"))
    results = store.submit([new("a", key="k1"), new("b", after=(0,))])
    assert (results[0].id, results[0].created) == (old, False)
    assert store.get(results[1].id).depends_on == (old,)
    rec = claim_one(store)
    assert rec.id == old and finish(store, rec)
    assert status_of(store, results[1].id) is State.PENDING


def test_graph_with_an_unknown_dependency_stores_nothing(store):
    with pytest.raises(SubmitError):
        store.submit([new("a"), new("b", after=(0,)), new("c", after=(1,), depends_on=(999_999,))])
    assert store.counts() == {}


def test_graph_respects_the_queue_bound_as_a_whole(store):
    with pytest.raises(QueueFull):
        store.submit([new("a"), new("b", after=(0,)), new("c", after=(1,))], max_queued=2)
    assert store.counts() == {}
    assert len(store.submit([new("a"), new("b", after=(0,))], max_queued=2)) == 2


def test_upstream_of_a_task_without_dependencies_is_empty(store):
    (a,) = submit(store, new("a"))
    assert store.upstream(a) == []
