"""Every way of running workers gets the same maintenance by default: an
in-process worker (``App.start``) sweeps like ``corral worker`` does."""

from __future__ import annotations

import sqlite3

import corral
from corral.cli import render
from corral.core.claims import ClaimRequest
from corral.core.states import State
from helpers import ARGS, wait_for

TWO_DAYS = 2 * 86400.0


def _age_event(app: corral.App, kind: str, url: str) -> int:
    """Add an event and move it two days into the past (older than the log keeps)."""
    event_id = app.store.add_event(kind, "old", "{}")
    if url.startswith("memory"):
        store = app.store
        with store._lock:
            store._events = [e._replace(at=e.at - TWO_DAYS) if e.id == event_id else e for e in store._events]
    elif url.startswith("sqlite"):
        with sqlite3.connect(url.removeprefix("sqlite:///")) as con:
            con.execute("UPDATE events SET at = at - ? WHERE id = ?", (TWO_DAYS, event_id))
    else:
        import psycopg

        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("UPDATE corral_events SET at = at - %s WHERE id = %s", (TWO_DAYS, event_id))
    return event_id


def test_an_in_process_worker_recovers_a_dead_workers_task_and_trims_the_event_log(url, capsys):
    app = corral.App(url)
    ran: list[int] = []

    @app.task(name="job")  # retries=0: a crash is not the task's failure, it runs again
    def job(n):
        ran.append(n)

    old = _age_event(app, "note", url)  # first: the log is trimmed in id order, ids follow time
    h = job.submit(1)
    # a worker elsewhere claimed it and was killed: its lease runs out
    (claim,) = app.store.claim("dead-worker", ClaimRequest(["default"], 1, lease_seconds=1))
    assert claim.tasks[0].id == h.id
    expires = app.store.get(h.id).lease_expires_at
    wait_for(lambda: app.store.now() > expires, timeout=10, message="the dead worker's lease expired")
    app.start(workers=1)  # no maintenance option given
    try:
        wait_for(
            lambda: app.store.get(h.id).status is State.SUCCESS,
            timeout=60,
            interval=0.05,
            message="the dead worker's task ran again here",
        )
        rec = app.store.get(h.id)
        assert ran == [1] and (rec.attempt, rec.crashes) == (1, 1)
        render.print_task(rec)  # `corral show` says where the other run went
        assert "1 of 1 (1 lost with a crashed worker)" in capsys.readouterr().out
        wait_for(
            lambda: all(e.id != old for e in app.store.events(kind="note")),
            timeout=60,
            interval=0.05,
            message="the event log was trimmed",
        )
    finally:
        app.close()


def test_the_leader_recovers_lost_leases_every_tick_and_does_its_chores_at_their_own_pace():
    from corral.core.clock import FakeClock
    from corral.core.model import NewTask
    from corral.maintenance.level_keeper import LevelKeeper
    from corral.maintenance.sweeper import Sweeper
    from corral.stores.memory import MemoryStore

    clock = FakeClock()
    store = MemoryStore(clock=clock)
    keeper = LevelKeeper(store)
    seen: list = []
    keeper.tick = seen.append  # what the level would be stepped with
    sweeper = Sweeper(store, interval=1, chores_every=3600, levels=keeper)
    assert sweeper.tick() is not None and len(seen) == 1  # the first tick does the chores
    (stale,) = store.submit([NewTask(name="t", args=ARGS, run_at=clock.time() - 2 * 86400)])
    (lost,) = store.submit([NewTask(name="u", args=ARGS)])
    store.claim("dead", ClaimRequest(["default"], 1, names=["u"], lease_seconds=30))
    clock.advance(31)
    assert sweeper.tick().lost_leases_retried == [lost.id]  # every tick: groups must not wait
    assert store.get(stale.id).status is State.PENDING and len(seen) == 1  # the chores wait their turn
    sweeper.chores_every = 0
    assert sweeper.tick().stale_pending_canceled == [stale.id]
    assert seen[1].lost_leases_retried == [lost.id]  # the level's signal saw the loss all the same
