"""Through a store outage, on every store: a sweeper that saw the store away
leaves leases that ran out meanwhile to their workers for a lease's length of
good health, and a worker writes the outcomes it holds for as long as the
outage lasts. (The outage itself, a PostgreSQL server stopped past the lease
under load, is ``tests/test_pg_restart.py``.)"""

from __future__ import annotations

import time

import corral
from corral import State
from corral.core.claims import ClaimRequest
from corral.core.model import Outcome
from corral.errors import StoreUnavailable
from corral.maintenance.sweeper import Sweeper
from helpers import wait_for


def _leased(app, n: int) -> list:
    """``n`` claims of one task each, whose short leases have run out."""
    ids = [app.submit("t").id for _ in range(n)]
    claims = app.store.claim("w", ClaimRequest(["default"], n, lease_seconds=0.2))
    assert sorted(t.id for c in claims for t in c.tasks) == ids
    wait_for(lambda: all(app.get(i).lease_expires_at < app.store.now() for i in ids), message="the leases ran out")
    return claims


def test_after_an_outage_run_out_leases_are_left_to_their_workers_for_a_while(url, monkeypatch):
    app = corral.App(url)
    app.task(name="t", retries=3)(lambda: None)
    try:
        alive, dead = _leased(app, 2)
        sweeper = Sweeper(app.store, interval=60, outage_grace=1.0)
        down = time.monotonic()
        monkeypatch.setattr(app.store, "last_outage", lambda: down)
        report = sweeper.tick()
        assert report is not None and report.total == 0, report
        # the worker that lived through it renews its lease and writes its outcome
        assert app.store.heartbeat([alive.token], 30).lost_tokens == set()
        app.store.complete([Outcome(alive.tasks[0].id, alive.token, alive.tasks[0].version, State.SUCCESS)])
        assert app.get(alive.tasks[0].id).status is State.SUCCESS
        # the one that did not come back is swept once the store was healthy for the grace
        wait_for(lambda: sweeper.tick().lost_leases_retried == [dead.tasks[0].id], timeout=30, interval=0.1)
        assert time.monotonic() - down >= 1.0
        assert app.get(dead.tasks[0].id).status is State.RETRYING
    finally:
        app.close()


def test_a_sweep_that_failed_for_an_outage_holds_off_the_next(url, monkeypatch):
    app = corral.App(url)
    app.task(name="t", retries=3)(lambda: None)
    try:
        (claim,) = _leased(app, 1)
        sweeper = Sweeper(app.store, interval=60, outage_grace=3600.0)
        real = app.store.try_lead

        def away(*args, **kwargs):
            raise StoreUnavailable("cannot reach the store: connection refused")

        monkeypatch.setattr(app.store, "try_lead", away)
        try:
            sweeper.step()
        except StoreUnavailable:
            pass
        else:
            raise AssertionError("the failing step did not raise")
        monkeypatch.setattr(app.store, "try_lead", real)
        assert sweeper.step().total == 0
        assert app.get(claim.tasks[0].id).status is State.RUNNING
        # without an outage a run-out lease is swept at once
        assert Sweeper(app.store, interval=60, holder=sweeper.holder).tick().lost_leases_retried == [claim.tasks[0].id]
    finally:
        app.close()


def test_a_worker_writes_its_outcomes_for_as_long_as_the_store_is_away(url, monkeypatch):
    app = corral.App(url)
    app.task(name="t")(lambda: 7)
    worker = app.worker(1, poll_interval=0.05)
    real = app.store.complete
    refusals = [0]

    def away_for_a_while(outcomes):
        if refusals[0] < 8:  # more than the tries an error that is not an outage gets
            refusals[0] += 1
            raise StoreUnavailable("cannot reach the store: connection refused")
        return real(outcomes)

    monkeypatch.setattr(app.store, "complete", away_for_a_while)
    tid = app.submit("t").id
    worker.start()
    try:
        wait_for(
            lambda: app.get(tid).status is State.SUCCESS, timeout=60, message="the outcome written after the outage"
        )
        assert refusals[0] == 8
        assert app.get(tid).result_value == 7
    finally:
        worker.stop(5)
        app.close()
