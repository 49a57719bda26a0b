"""A worker hands a limit's place from a unit that ended to its successor
in the transaction that writes the outcomes (durable stores): the limit is
never exceeded, group order holds, and a stopping worker takes nothing."""

from __future__ import annotations

import threading

import corral
from corral import State
from helpers import Downstream, HandOverLog, wait_for


def _run_to_the_end(app, worker) -> None:
    """Start ``worker``, let it run every task, then stop it and close ``app``."""
    worker.start()
    try:
        assert worker.drain(60)
    finally:
        worker.stop(10)
        app.close(10)


def test_places_pass_from_unit_to_unit_within_the_limit_and_group_order(url):
    app = corral.App(url)
    app.limit("downstream", concurrency=2)
    down = Downstream()

    @app.task(limits=["downstream"])
    def call(group, i):
        down(group, i)

    for i in range(15):
        for g in ("a", "b", "c", "d"):
            call.submit(g, i, group=g)
    worker = app.worker(4, chunk_size=3)
    log = HandOverLog(worker.store)
    _run_to_the_end(app, worker)
    assert down.peak <= 2
    assert down.seen == {g: list(range(15)) for g in "abcd"}
    if worker.store.hands_over:
        assert log.successors + log.relayed > 0  # the places passed over, not through the dispatcher
    else:
        assert log.successors == log.relayed == 0  # memory frees and claims as before


def test_a_stopping_worker_hands_no_place_over(url):
    app = corral.App(url)
    app.limit("downstream", concurrency=1)
    release = threading.Event()
    ran: list[int] = []

    @app.task(limits=["downstream"], retries=0)
    def call(i):
        ran.append(i)
        release.wait(30)

    handles = [call.submit(i) for i in range(3)]
    worker = app.worker(2, chunk_size=1)
    log = HandOverLog(worker.store)
    worker.start()
    try:
        wait_for(lambda: ran == [0])
        stopper = threading.Thread(target=worker.stop, kwargs={"grace": 30})
        stopper.start()
        wait_for(lambda: worker._stop_claiming.is_set())
        release.set()
        stopper.join(30)
        assert not stopper.is_alive()
        assert ran == [0]
        assert log.successors == log.relayed == 0
        assert [app.get(h.id).status for h in handles] == [State.SUCCESS, State.PENDING, State.PENDING]
        assert [app.get(h.id).attempt for h in handles[1:]] == [0, 0]
    finally:
        release.set()
        app.close(10)


def test_a_claim_under_way_at_a_stop_starts_nothing(url):
    """A claim begun before a stop that returns after it (an outcome freed a
    limit's place meanwhile) gives what it took back: nothing starts once a
    stop began."""
    app = corral.App(url)
    app.limit("downstream", concurrency=1)
    release, claiming, go_on = threading.Event(), threading.Event(), threading.Event()
    ran: list[int] = []

    @app.task(limits=["downstream"], retries=0)
    def call(i):
        ran.append(i)
        release.wait(30)

    handles = [call.submit(i) for i in range(2)]
    worker = app.worker(2, chunk_size=1)
    inner = worker.store.claim
    claims = []

    def held_claim(*args, **kwargs):
        # the claim after the first (the limit full) waits for the test here
        if claims and threading.current_thread().name == "corral-dispatcher" and not go_on.is_set():
            claiming.set()
            go_on.wait(30)
        claims.append(1)
        return inner(*args, **kwargs)

    worker.store.claim = held_claim
    worker.start()
    try:
        wait_for(lambda: ran == [0] and claiming.is_set())
        stopper = threading.Thread(target=worker.stop, kwargs={"grace": 30})
        stopper.start()
        wait_for(lambda: worker._stop_claiming.is_set())
        release.set()
        wait_for(lambda: app.get(handles[0].id).status == State.SUCCESS)
        go_on.set()  # the claim goes on and finds the place free
        stopper.join(30)
        assert not stopper.is_alive()
        assert ran == [0]
        assert app.get(handles[1].id).status == State.PENDING
        assert app.get(handles[1].id).attempt == 0
    finally:
        release.set()
        go_on.set()
        app.close(10)


def test_a_worker_does_not_keep_a_shared_limit_from_a_worker_of_other_queues(durable_url):
    app = corral.App(durable_url)
    app.limit("api", concurrency=1)
    lock = threading.Lock()
    order: list[str] = []

    @app.task(limits=["api"])
    def call(queue):
        with lock:
            order.append(queue)
        threading.Event().wait(0.002)  # the call under the limit

    for _ in range(50):
        call.submit("a", queue="a")
        call.submit("b", queue="b")
    workers = [app.worker(2, queues=[q]).start() for q in ("a", "b")]
    try:
        wait_for(lambda: len(order) == 100, timeout=60)
    finally:
        for w in workers:
            w.stop(10)
        app.close(10)
    first_half = "".join(order[:50])
    # One worker handing its place on to its own queue would run all 50 of
    # its tasks first while the other's, submitted as early, waited. Where a
    # place is freed, the two race for it (a race can go one way a dozen
    # times in a row), so the bound leaves room for that.
    assert min(first_half.count("a"), first_half.count("b")) >= 5, "".join(order)


def test_a_handover_does_not_wait_for_a_count_of_the_queued_work(durable_url):
    """The count that sizes the end's chunks is read after the places have
    passed over, never between a unit's end and its successor's claim."""
    app = corral.App(durable_url)
    app.limit("downstream", concurrency=4)

    @app.task(limits=["downstream"])
    def call(i):
        threading.Event().wait(0.002)

    app.submit_many(call, [{"args": (i,), "group": f"g{i % 20}"} for i in range(600)])
    worker = app.worker(4)
    store = worker.store
    calls: list[str] = []
    for name in ("backlog", "complete", "complete_and_claim"):
        inner = getattr(store, name)

        def traced(*args, _inner=inner, _name=name, **kwargs):
            if threading.current_thread().name == "corral-completer":
                calls.append(_name)
            return _inner(*args, **kwargs)

        setattr(store, name, traced)
    _run_to_the_end(app, worker)
    assert "backlog" in calls and "complete_and_claim" in calls
    # Every count the completer read came right after a handover, never
    # between other writes and a handover (that is, while units waited).
    assert "complete" in calls
    assert all(calls[i - 1] == "complete_and_claim" for i, c in enumerate(calls) if c == "backlog")


def test_places_a_handover_cannot_fill_wake_the_other_workers(pg_url):
    """Under a level that halves the claim size, units that end together
    free more places than one claim may fill: the places left over are
    announced to every worker, not kept quiet until their next poll.
    (PostgreSQL: SQLite's waiting workers see every commit.)"""
    apps = [corral.App(pg_url) for _ in range(2)]
    release, hold = threading.Event(), threading.Event()
    started: list[str] = []
    for app in apps:
        app.limit("api", concurrency=2)

        @app.task(name="call", limits=["api"])
        def call(tag):
            started.append(tag)
            (hold if tag == "a3" else release).wait(30)

    apps[0].set_level("WARNING", reason="test")  # a claim takes half the slots: one here
    for tag in ("a1", "a2", "a3"):
        apps[0].submit("call", args=(tag,), queue="a")
    apps[0].submit("call", args=("b",), queue="b")
    a = apps[0].worker(2, queues=["a"])
    b = apps[1].worker(1, queues=["b"], poll_interval=60)  # no poll within the test
    waits = []
    # an idle dispatcher waits in wait_offering (PostgreSQL's does not go through wait_for_work)
    inner = b.store.wait_for_work
    b.store.wait_for_work = lambda *args, **kwargs: waits.append(1) or inner(*args, **kwargs)
    offering = b.store.wait_offering
    b.store.wait_offering = lambda *args, **kwargs: waits.append(1) or offering(*args, **kwargs)
    a.start()
    try:
        wait_for(lambda: sorted(started) == ["a1", "a2"], timeout=30)
        b.start()
        # b found the limit full and waits (its first wait only starts listening)
        wait_for(lambda: len(waits) >= 2, timeout=30)
        release.set()  # a1 and a2 end together; a3 takes one place and keeps it
        wait_for(lambda: "b" in started, timeout=20)
    finally:
        hold.set()
        release.set()
        for w in (a, b):
            w.stop(10)
        for app in apps:
            app.close(10)
