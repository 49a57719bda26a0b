"""A list of one state reads what it shows, on every store: the ids of a bulk
action match the records of a list, and on the durable stores a sparse state
(running, retrying, dead letters) and the queue counts are read from partial
indexes, never by a walk over every finished task."""

from __future__ import annotations

import re

from corral.core.claims import ClaimRequest
from corral.core.model import NewTask, Outcome, TaskFilter
from corral.core.states import State
from corral.edges.task_lists import TaskQuery, matching_ids
from corral.stores import open_store

ARGS = '{"args":[],"kwargs":{}}'


def _fill(store) -> None:
    """Tasks in every shown state: finished ones, dead letters, retrying,
    running, reserved, queued in two queues, waiting."""
    store.submit([NewTask(name="t", args=ARGS, max_retries=1) for _ in range(12)])
    claims = store.claim("w", ClaimRequest(["default"], 8))
    done = []
    for i, c in enumerate(claims):
        t = c.tasks[0]
        if i < 6:
            status = (State.SUCCESS, State.FAILED, State.TIMEOUT)[i % 3]
            done.append(Outcome(t.id, c.token, t.version, status, error=None if i % 3 == 0 else "boom"))
    store.complete(done)
    store.submit([NewTask(name="b", args=ARGS, queue="bulk") for _ in range(5)])
    (up,) = store.submit([NewTask(name="t", args=ARGS, queue="bulk")])
    store.submit([NewTask(name="w", args=ARGS, queue="bulk", depends_on=(up.id,))])


def test_task_ids_are_the_ids_of_the_list_in_its_order(url):
    store = open_store(url)
    store.migrate()
    try:
        _fill(store)
        filters = [TaskFilter(limit=100), TaskFilter(limit=100, newest_first=False), TaskFilter(limit=3)]
        filters += [TaskFilter(status=s, limit=100) for s in State]
        filters += [TaskFilter(status=s, queue="bulk", limit=100) for s in (State.PENDING, State.WAITING)]
        filters += [TaskFilter(status=State.FAILED, after_id=10_000, limit=1)]
        seen = set()
        for flt in filters:
            ids = store.task_ids(flt)
            assert ids == [r.id for r in store.list_tasks(flt)], flt
            seen.update(ids)
        assert len(seen) == len(store.list_tasks(TaskFilter(limit=1000)))
        # a bulk action's ids: one read of the ids, as the pages of the list would find them
        for status in ("PENDING", "FAILED", "RUNNING", "RESERVED", "WAITING"):
            q = TaskQuery(status=status, queue="bulk" if status in ("PENDING", "WAITING") else None)
            want = [r.id for r in store.list_tasks(TaskFilter(status=State(status), queue=q.queue, limit=1000))]
            assert matching_ids(store, q, 1000) == want
            assert matching_ids(store, q, 2) == want[:2]
    finally:
        store.close()


def _sqlite_plan(con, sql: str, params) -> str:
    return " | ".join(r[3] for r in con.execute("EXPLAIN QUERY PLAN " + sql, params))


def test_sqlite_lists_of_a_sparse_state_read_its_partial_index(sqlite_url):
    from corral.stores.sql import load
    from corral.stores.sqlite import _list_sql

    q = load("sqlite")
    store = open_store(sqlite_url)
    store.migrate()
    try:
        con = store._con()
        for status, index in (
            (State.RUNNING, "tasks_running_expiry"),
            (State.RESERVED, "tasks_running_expiry"),
            (State.RETRYING, "tasks_queued_run_at"),
            (State.FAILED, "tasks_dead"),
            (State.TIMEOUT, "tasks_dead"),
        ):
            sql, params = _list_sql(q["select_tasks"], TaskFilter(status=status, name="t", limit=51))
            plan = _sqlite_plan(con, sql, params)
            assert f"USING INDEX {index}" in plan and not re.search(r"SCAN tasks(?! USING)", plan), (status, plan)
        # every match wanted (a bulk action's ids): the queued states too
        for status, index in ((State.PENDING, "tasks_queued_run_at"), (State.WAITING, "tasks_waiting")):
            sql, params = _list_sql(
                "SELECT id FROM tasks", TaskFilter(status=status, queue="q", limit=10_001), whole=True
            )
            plan = _sqlite_plan(con, sql, params)
            assert f"USING INDEX {index}" in plan, (status, plan)
        # a worker's tasks: the running rows only
        sql = store._held_sql("w", None)
        plan = _sqlite_plan(con, sql[0], sql[1] + [10])
        assert "USING INDEX tasks_running_expiry" in plan, plan
    finally:
        store.close()


def test_postgres_running_list_and_queue_counts_read_partial_indexes(pg_url):
    from corral.stores.postgres import _list_sql

    store = open_store(pg_url)
    store.migrate()
    try:
        _fill(store)

        def explain(sql: str, params) -> str:
            def go(conn):
                with conn.transaction():
                    conn.execute("SET LOCAL enable_seqscan = off")
                    return "\n".join(r[0] for r in conn.execute("EXPLAIN " + sql, params))

            return store._run(go)

        for status in (State.RUNNING, State.RESERVED):
            plan = explain(*_list_sql("SELECT * FROM corral_tasks", TaskFilter(status=status, limit=51)))
            assert "corral_tasks_running" in plan and "pkey" not in plan, plan
        # every queued task of a queue (a bulk action's ids): one arm per index of queued tasks
        pending = TaskFilter(status=State.PENDING, queue="bulk", limit=10_001)
        plan = explain(*_list_sql("SELECT id FROM corral_tasks", pending, whole=True))
        assert "corral_tasks_ready_fresh" in plan and "corral_tasks_ready_group" in plan, plan
        assert "pkey" not in plan, plan
        assert store.task_ids(TaskFilter(status=State.PENDING, queue="bulk")) == [
            r.id for r in store.list_tasks(TaskFilter(status=State.PENDING, queue="bulk"))
        ]
        plan = explain(store._q["queue_counts"], None)
        assert "Seq Scan" not in plan, plan
        assert store.queue_counts()["bulk"] == {"PENDING": 6, "WAITING": 1}
    finally:
        store.close()
