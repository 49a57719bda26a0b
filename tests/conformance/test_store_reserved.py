"""RESERVED: a task a worker holds but has not started (prefetched, a chunk
member waiting its turn, a relayed successor) reads RESERVED in every read,
counted apart from RUNNING, until its start is recorded
(:meth:`Store.record_starts`, or its outcome)."""

from __future__ import annotations

from corral.core.model import Outcome, Start, TaskFilter
from corral.core.states import State

from .conftest import claim, claimed_ids, new, submit


def _shown(store, status: State, **kw) -> list[int]:
    return [r.id for r in store.list_tasks(TaskFilter(status=status, newest_first=False, **kw))]


def test_held_tasks_read_reserved_until_their_start_is_recorded(store):
    head, member, other = submit(
        store, new(group="g", batch="b"), new(group="g", batch="b"), new(batch="b", queue="q2")
    )
    (chunk,) = claim(store, 1, chunk_size=2)
    (pre,) = claim(store, 1, queues=("q2",), prefetch=True)
    assert claimed_ids([chunk]) == [head, member] and claimed_ids([pre]) == [other]

    assert [store.get(t).status for t in (head, member, other)] == [State.RUNNING, State.RESERVED, State.RESERVED]
    assert store.get(member).attempt == 0 and store.get(member).started_at is None
    assert _shown(store, State.RUNNING) == [head]
    assert _shown(store, State.RESERVED) == [member, other]
    assert _shown(store, State.RESERVED, queue="q2") == [other]
    assert store.counts() == {"RUNNING": 1, "RESERVED": 2}
    assert store.counts("q2") == {"RESERVED": 1}
    assert store.active_counts() == {"RUNNING": 1, "RESERVED": 2}
    assert store.queue_counts() == {"default": {"RUNNING": 1, "RESERVED": 1}, "q2": {"RESERVED": 1}}
    assert store.batch_summary("b").counts == {"RUNNING": 1, "RESERVED": 2}
    assert dict(store.batch_list())["b"] == {"RUNNING": 1, "RESERVED": 2}

    # the head ends; the member's body starts: its start and attempt are recorded, version kept
    h, m = chunk.tasks
    assert store.complete([Outcome(head, chunk.token, h.version, State.SUCCESS, attempt=1)]) == [True]
    (line,) = store.group_lines()
    assert (line.head_id, line.head_status) == (member, "RESERVED")
    now = store.now()
    assert store.record_starts([Start(member, chunk.token, 1, now), Start(other, "not its token", 1, now)]) == 1
    rec = store.get(member)
    assert (rec.status, rec.attempt, rec.started_at) == (State.RUNNING, 1, now)
    assert store.get(other).status is State.RESERVED
    (line,) = store.group_lines()
    assert line.head_status == "RUNNING"
    assert store.counts() == {"SUCCESS": 1, "RUNNING": 1, "RESERVED": 1}
    # recorded once: a second start changes nothing
    assert store.record_starts([Start(member, chunk.token, 2, now + 5)]) == 0
    # the outcome still applies (the start kept the version), and keeps the recorded start
    assert store.complete([Outcome(member, chunk.token, m.version, State.SUCCESS, started_at=now + 1, attempt=1)])
    done = store.get(member)
    assert (done.status, done.attempt, done.started_at) == (State.SUCCESS, 1, now)


def test_a_start_is_not_recorded_for_a_task_no_longer_held(store):
    (tid,) = submit(store, new())
    (c,) = claim(store, 1, prefetch=True)
    rec = c.tasks[0]
    assert store.complete([Outcome(tid, c.token, rec.version, State.PENDING, attempt=0)]) == [True]
    assert store.record_starts([Start(tid, c.token, 1, store.now())]) == 0
    back = store.get(tid)
    assert (back.status, back.attempt, back.started_at) == (State.PENDING, 0, None)
