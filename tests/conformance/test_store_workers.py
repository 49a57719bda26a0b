"""Worker processes' rows: each report rewrites its row and stamps it with the
store's clock, a clean stop removes it, and a silent worker's row stays
until it holds no task any more, when the sweeper's forget_workers clears it."""

from __future__ import annotations

from corral.core.model import WorkerInfo

from .conftest import claim, finish, submit_one


def info(worker_id: str = "w1", **kw) -> WorkerInfo:
    fields = dict(
        id=worker_id,
        host="vm-1",
        pid=4242,
        queues=("default", "emails"),
        slots=8,
        in_use=0,
        version="1.2.3",
        beat_every=5.0,
    )
    fields.update(kw)
    return WorkerInfo(**fields)  # type: ignore[arg-type]


def test_a_report_writes_the_row_and_the_store_stamps_it(store, advance):
    assert store.workers() == []
    store.report_worker(info(started_at=1.0, heartbeat_at=2.0))  # the store's stamps win
    (row,) = store.workers()
    assert (row.id, row.host, row.pid, row.queues, row.slots, row.in_use, row.version, row.beat_every) == (
        "w1",
        "vm-1",
        4242,
        ("default", "emails"),
        8,
        0,
        "1.2.3",
        5.0,
    )
    assert abs(row.started_at - store.now()) < 5 and row.heartbeat_at == row.started_at
    advance(30)
    store.report_worker(info(in_use=3))
    (again,) = store.workers()
    assert again.in_use == 3
    # the first start is kept, each report stamps the heartbeat anew
    assert again.heartbeat_at - again.started_at >= 29


def test_workers_are_listed_oldest_first_and_a_clean_stop_removes_its_row(store, advance):
    store.report_worker(info("w-old"))
    advance(1)
    store.report_worker(info("w-new"))
    assert [w.id for w in store.workers()] == ["w-old", "w-new"]
    store.remove_worker("w-old")
    store.remove_worker("never-there")  # nothing to remove: no error
    assert [w.id for w in store.workers()] == ["w-new"]


def test_a_silent_worker_is_forgotten_only_once_it_holds_nothing(store, advance):
    tid = submit_one(store)
    (c,) = claim(store, 1, lease_seconds=30)  # held by "w1"
    store.report_worker(info("w1"))
    store.report_worker(info("idle"))
    advance(60)
    store.report_worker(info("alive"))
    before = store.now() - 30
    # w1 went silent but still holds its task: it stays, with what it holds
    assert store.forget_workers(before) == 1
    assert sorted(w.id for w in store.workers()) == ["alive", "w1"]
    assert store.get(tid).worker_id == "w1"
    finish(store, c.tasks[0])  # its lease is over (here: the task ended)
    assert store.forget_workers(before) == 1
    assert [w.id for w in store.workers()] == ["alive"]
