"""Each minute's figures, on every store: the finished tasks of a time range
(``finished_runs``), a minute's rows written, replaced and trimmed in one
write (``save_minute_stats``), read back (``minute_stats``), and the leader's
recorder writing each ended minute once."""

from __future__ import annotations

from corral.core.minutes import QUEUE_ROW, MinuteStat
from corral.core.states import State
from corral.maintenance.minute_recorder import MinuteRecorder

from .conftest import claim, finish, new, submit


def _stat(minute: int, name: str = QUEUE_ROW, done: int = 1, **kw) -> MinuteStat:
    fields = dict(failed=0, depth=0, dur_p50=0.5, dur_p99=0.9, wait_p50=0.1, wait_p99=0.2)
    fields.update(kw)
    return MinuteStat(minute, "default", name, done, **fields)  # type: ignore[arg-type]


def test_minute_rows_are_replaced_by_key_and_trimmed_by_age(store):
    store.save_minute_stats([_stat(60), _stat(120), _stat(120, "t", done=3)], before=0)
    store.save_minute_stats([_stat(120, done=7, depth=4)], before=0)  # the same minute again: replaced
    rows = store.minute_stats(0)
    assert [(r.minute, r.name, r.done) for r in rows] == [(60, "", 1), (120, "", 7), (120, "t", 3)]
    assert rows[1] == _stat(120, done=7, depth=4)
    assert [r.minute for r in store.minute_stats(100)] == [120, 120]
    store.save_minute_stats([_stat(180)], before=120)  # minutes before 120 go
    assert [r.minute for r in store.minute_stats(0)] == [120, 120, 180]


def test_finished_runs_are_a_time_range_in_finish_order(store, advance):
    ids = submit(store, new("a"), new("b"), new("c"))
    for _ in range(3):
        (c,) = claim(store, 1)
        advance(10)
        finish(store, c.tasks[0], State.FAILED if c.tasks[0].id == ids[1] else State.SUCCESS)
    runs = store.finished_runs(0, store.now() + 1, 10)
    assert [(r.id, r.name, r.status) for r in runs] == [
        (ids[0], "a", "SUCCESS"),
        (ids[1], "b", "FAILED"),
        (ids[2], "c", "SUCCESS"),
    ]
    assert all(r.started_at is not None and r.finished_at - r.started_at >= 9.9 for r in runs)
    assert [r.id for r in store.finished_runs(runs[1].finished_at, store.now() + 1, 10)] == ids[1:]
    assert [r.id for r in store.finished_runs(0, runs[1].finished_at, 10)] == ids[:1]
    assert len(store.finished_runs(0, store.now() + 1, 2)) == 2


def test_the_recorder_writes_each_ended_minute_once(store, advance):
    ids = submit(store, new("a"), new("a"), new("b"))
    for _ in range(2):
        (c,) = claim(store, 1)
        advance(2)
        finish(store, c.tasks[0])
    advance(61)
    recorder = MinuteRecorder(store)
    assert recorder.tick() >= 1
    rows = store.minute_stats(0)
    totals = [r for r in rows if r.name == QUEUE_ROW and r.done]
    assert sum(r.done for r in totals) == 2 and sum(r.failed for r in totals) == 0
    assert max(r.dur_p99 or 0 for r in totals) >= 1.9
    assert sum(r.done for r in rows if r.name == "a") == 2 and not [r for r in rows if r.name == "b"]
    # the depth is the last minute's (ids[2] still queued)
    assert max(rows, key=lambda r: r.minute).depth == 1
    assert recorder.tick() == 0  # nothing ended since
    assert MinuteRecorder(store).tick() == 0  # a new leader reads where the last one stopped
    assert ids
