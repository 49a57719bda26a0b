"""A unit under a capped limit that nears its end asks for its successor:
claimed under the unit's own lease token, it waits in the place the unit
holds and starts there once the unit ended (durable stores). The limit never
counts more than its cap, group order and exclusivity hold, no attempt is
burned, and a stopping worker gives a waiting successor back (a dead
worker's: tests/conformance/test_store_handover.py)."""

from __future__ import annotations

import threading

import corral
from corral import State
from helpers import Downstream, HandOverLog, wait_for


def _knows_quick_tasks(worker) -> None:
    """As if the worker had timed a few 1 ms tasks: a unit asks for its relay
    from its start (the default lead is longer than the whole unit)."""
    for _ in range(5):
        worker.pace.tasks.observe(0.001)


def test_relayed_places_stay_within_the_limit_and_keep_group_order(durable_url):
    app = corral.App(durable_url)
    app.limit("downstream", concurrency=2)
    down = Downstream()

    @app.task(limits=["downstream"])
    def call(group, i):
        down(group, i)

    handles = [call.submit(g, i, group=g) for i in range(12) for g in "abcde"]
    worker = app.worker(4, chunk_size=2)
    log = HandOverLog(worker.store)
    _knows_quick_tasks(worker)
    worker.start()
    try:
        assert worker.drain(60)
    finally:
        worker.stop(10)
    try:
        assert log.relayed > 0  # successors came while their predecessors ran
        assert down.peak <= 2
        assert down.seen == {g: list(range(12)) for g in "abcde"}
        records = [app.get(h.id) for h in handles]
        assert all(r.status is State.SUCCESS for r in records)
        assert all(r.attempt == 1 for r in records)  # a relayed head's attempt counted once, at its start
        assert all(r.started_at is not None and r.started_at <= r.finished_at for r in records)
    finally:
        app.close(10)


def _b_waits_in_as_place(url, release: threading.Event, ran: list[str], **options):
    """Under a limit of one, task "a" (group a) runs until ``release`` is set
    and task "b" (group b) was relayed into its place. Returns the app, the
    started worker and both handles."""
    app = corral.App(url)
    app.limit("downstream", concurrency=1)

    @app.task(limits=["downstream"], retries=0, **options)
    def call(tag):
        ran.append(tag)
        if tag == "a":
            release.wait(30)

    first = call.submit("a", group="a")
    second = call.submit("b", group="b")
    worker = app.worker(2, chunk_size=1)
    log = HandOverLog(worker.store)
    _knows_quick_tasks(worker)
    worker.start()
    wait_for(lambda: log.relayed == 1)
    return app, worker, first, second


def test_a_stopping_worker_gives_a_waiting_successor_back(durable_url):
    release = threading.Event()
    ran: list[str] = []
    app, worker, first, second = _b_waits_in_as_place(durable_url, release, ran)
    try:
        wait_for(lambda: ran == ["a"])
        rec = app.get(second.id)
        assert rec.status is State.RESERVED and rec.started_at is None  # held, not started
        stopper = threading.Thread(target=worker.stop, kwargs={"grace": 30})
        stopper.start()
        wait_for(lambda: app.get(second.id).status is State.PENDING)  # given back before a ends
        release.set()
        stopper.join(30)
        assert not stopper.is_alive()
        assert ran == ["a"]
        assert app.get(first.id).status is State.SUCCESS
        rec = app.get(second.id)
        assert rec.status is State.PENDING and rec.attempt == 0  # no attempt burned
    finally:
        release.set()
        app.close(10)


def test_a_successor_is_not_held_behind_a_timed_out_thread(durable_url):
    """A thread that timed out keeps its lease, and so its place, until it
    really ends: a successor relayed to it goes back to the queue meanwhile
    rather than wait beside it, and runs once the place is free."""
    release = threading.Event()
    ran: list[str] = []
    app, worker, _, second = _b_waits_in_as_place(durable_url, release, ran, timeout=0.5)
    try:
        wait_for(lambda: app.get(second.id).status is State.PENDING, timeout=20)  # a timed out: b given back
        rec = app.get(second.id)
        assert rec.attempt == 0 and ran == ["a"]
        release.set()  # a's thread ends, its timeout is written, the place is free
        wait_for(lambda: app.get(second.id).status is State.SUCCESS, timeout=20)
        assert app.get(second.id).attempt == 1
    finally:
        release.set()
        worker.stop(10)
        app.close(10)
