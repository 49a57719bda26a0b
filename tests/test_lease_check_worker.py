"""A worker starts a task it holds only under a lease that still stands, on
every store: a chunk member or a prefetched unit whose lease ran out and was
swept (the worker was stopped, or cut off, past its lease) goes back instead
of running beside its re-run; a lease that ran out but was not swept is
renewed, and the chunk goes on."""

from __future__ import annotations

import threading

import corral
from corral import State
from corral.maintenance.recovery import sweep_once
from helpers import wait_for

LEASE = 1.0


def _app(url):
    """An app whose task 0 waits for ``release``; ``ran`` lists every run."""
    app = corral.App(url)
    release = threading.Event()
    ran: list[int] = []

    @app.task(retries=3)
    def job(i):
        ran.append(i)
        if i == 0:
            release.wait(30)

    return app, job, release, ran


def _worker(app, **options):
    """A worker whose heartbeat never renews (a renewal it would have made
    while stopped), so its leases run out while task 0 waits."""
    worker = app.worker(1, lease_seconds=LEASE, poll_interval=0.05, **options)
    worker.heartbeat_interval = 3600.0
    return worker.start()


def _sweeper(app, ids):
    """A condition: sweep once; true once every task of ``ids`` was swept back to the queue."""
    swept: set[int] = set()

    def done() -> bool:
        swept.update(sweep_once(app.store).lost_leases_retried)
        return set(ids) <= swept

    return done


def test_a_chunk_member_is_not_started_once_the_chunks_lease_was_swept(url):
    app, job, release, ran = _app(url)
    ids = [app.submit(job, args=[i], group="g").id for i in range(3)]
    worker = _worker(app, chunk_size=3, prefetch=0)
    try:
        wait_for(lambda: ran == [0], message="the chunk's head started")
        wait_for(_sweeper(app, ids), timeout=30, interval=0.1, message="the chunk's lease swept")
        release.set()  # the head ends: the next member would start under the swept lease
        wait_for(lambda: all(app.get(i).status is State.SUCCESS for i in ids), timeout=30)
        # the head's run before the sweep, then the group's re-run: no member ran twice
        assert ran == [0, 0, 1, 2]
        # the head's lost run is a crash re-run: its attempt given back, the crash counted
        assert [(app.get(i).attempt, app.get(i).crashes) for i in ids] == [(1, 1), (1, 0), (1, 0)]
    finally:
        release.set()
        worker.stop(5)
        app.close()


def test_a_prefetched_unit_is_not_started_once_its_lease_was_swept(url):
    app, job, release, ran = _app(url)
    first = app.submit(job, args=[0]).id
    held = app.submit(job, args=[1]).id
    worker = _worker(app, chunk_size=1, prefetch=1)
    try:
        wait_for(lambda: ran == [0], message="task 0 started")
        wait_for(lambda: app.get(held).status is not State.PENDING, message="task 1 prefetched")
        wait_for(_sweeper(app, [first, held]), timeout=30, interval=0.1, message="both leases swept")
        release.set()
        wait_for(lambda: all(app.get(i).status is State.SUCCESS for i in (first, held)), timeout=30)
        assert sorted(ran) == [0, 0, 1], ran
        assert app.get(held).attempt == 1
    finally:
        release.set()
        worker.stop(5)
        app.close()


def test_a_lease_that_ran_out_unswept_is_renewed_and_the_chunk_goes_on(url):
    app, job, release, ran = _app(url)
    ids = [app.submit(job, args=[i], group="g").id for i in range(3)]
    worker = _worker(app, chunk_size=3, prefetch=0)
    try:
        wait_for(lambda: ran == [0], message="the chunk's head started")
        wait_for(
            lambda: app.get(ids[1]).lease_expires_at < app.store.now(),
            timeout=30,
            interval=0.05,
            message="the chunk's lease ran out",
        )
        release.set()
        wait_for(lambda: all(app.get(i).status is State.SUCCESS for i in ids), timeout=30)
        assert ran == [0, 1, 2]
        assert [app.get(i).attempt for i in ids] == [1, 1, 1]
    finally:
        release.set()
        worker.stop(5)
        app.close()
