"""Periodic schedules on every store: stored definitions, exactly one task per
tick however many callers race, overlap=False skips, and catch-up after downtime."""

from __future__ import annotations

import pytest

from corral.core.clock import FakeClock
from corral.core.cron import ENQUEUED, MAX_CLOCK_AHEAD, SKIPPED, TAKEN, Schedule
from corral.core.model import TaskFilter
from corral.core.states import State
from corral.errors import ConfigError
from corral.maintenance.periodic import Scheduler
from corral.stores import open_store
from corral.stores.base import Store
from helpers import run_concurrently

from .conftest import claim_one, finish, status_of

T0 = 1_700_000_100  # a */5 tick


@pytest.fixture
def clock() -> FakeClock:
    """The stores' own clock, a day after the ticks these tests fire (as
    PostgreSQL's is): a store refuses a tick ahead of its clock."""
    return FakeClock(T0 + 86400)


def every5(name: str = "five", **kw) -> Schedule:
    kw.setdefault("task", "job")
    return Schedule(name=name, expr="*/5 * * * *", **kw)


def test_schedules_are_stored_and_listed(store: Store):
    store.save_schedules([every5(queue="low", group="g", overlap=False, max_delay=60.0)], now=T0)
    (st,) = store.schedules()
    assert (st.name, st.task, st.expr, st.timezone, st.queue, st.group) == (
        "five",
        "job",
        "*/5 * * * *",
        "UTC",
        "low",
        "g",
    )
    assert (st.overlap, st.catch_up, st.max_delay, st.created_at) == (False, "latest", 60.0, T0)
    assert st.last_tick is None and st.last_outcome is None
    assert st.next_tick(T0) == T0 + 300
    # a worker started later with a changed definition updates it, keeping the first stamp
    store.save_schedules([Schedule("five", "job", "0 * * * *", timezone="Europe/Paris")], now=T0 + 999)
    (st,) = store.schedules()
    assert (st.expr, st.timezone, st.created_at, st.overlap) == ("0 * * * *", "Europe/Paris", T0, True)


def test_a_tick_enqueues_one_task_and_a_second_try_is_taken(store: Store):
    sched = every5(queue="low", group="g", max_retries=2)
    store.save_schedules([sched], now=T0 - 1)
    first = store.fire_tick(sched, T0)
    assert first.outcome == ENQUEUED and first.task_id is not None
    assert store.fire_tick(sched, T0).outcome == TAKEN
    rec = store.get(first.task_id)
    assert rec is not None
    assert (rec.name, rec.queue, rec.group, rec.max_retries, rec.status) == ("job", "low", "g", 2, State.PENDING)
    (tick,) = store.schedule_ticks("five")
    assert (tick.tick, tick.outcome, tick.task_id) == (T0, ENQUEUED, first.task_id)
    (st,) = store.schedules()
    assert (st.last_tick, st.last_outcome, st.last_task_id, st.last_task_status) == (
        T0,
        ENQUEUED,
        first.task_id,
        "PENDING",
    )


def test_a_tick_of_a_schedule_never_saved_is_refused(store: Store):
    with pytest.raises(ConfigError, match="never saved"):
        store.fire_tick(every5(), T0)
    assert store.list_tasks(TaskFilter(limit=10)) == []


def test_racing_callers_enqueue_exactly_one_task_per_tick(store: Store, store_kind: str, clock: FakeClock):
    sched = every5()
    store.save_schedules([sched], now=T0 - 1)
    ticks = [T0 + 300 * i for i in range(10)]
    callers = 6
    stores = [store] if store_kind == "memory" else [open_store(store.url, clock=clock) for _ in range(callers)]
    try:

        def fire_all(i: int) -> list[str]:
            s = stores[i % len(stores)]
            return [s.fire_tick(sched, t).outcome for t in ticks]

        results = run_concurrently(callers, fire_all)
    finally:
        if store_kind != "memory":
            for s in stores:
                s.close()
    for k in range(len(ticks)):
        outcomes = sorted(r[k] for r in results)
        assert outcomes == [ENQUEUED] + [TAKEN] * (callers - 1), f"tick {k}: {outcomes}"
    tasks = store.list_tasks(TaskFilter(name="job", limit=100))
    assert len(tasks) == len(ticks)
    assert sorted(t.tick for t in store.schedule_ticks("five")) == ticks


def test_overlap_false_skips_a_tick_while_the_previous_run_is_going(store: Store):
    sched = every5(overlap=False)
    store.save_schedules([sched], now=T0 - 1)
    first = store.fire_tick(sched, T0)
    assert first.outcome == ENQUEUED
    assert store.fire_tick(sched, T0 + 300).outcome == SKIPPED  # still PENDING
    rec = claim_one(store, names=["job"])
    assert rec.id == first.task_id
    assert store.fire_tick(sched, T0 + 600).outcome == SKIPPED  # RUNNING
    (st,) = store.schedules()
    assert (st.last_tick, st.last_outcome, st.last_task_id) == (T0 + 600, SKIPPED, first.task_id)
    assert [t.outcome for t in store.schedule_ticks("five")] == [SKIPPED, SKIPPED, ENQUEUED]
    assert finish(store, rec, State.SUCCESS)
    third = store.fire_tick(sched, T0 + 900)
    assert third.outcome == ENQUEUED and third.task_id != first.task_id
    assert store.fire_tick(sched, T0 + 900).outcome == TAKEN  # a skip or a run: each tick is decided once
    assert status_of(store, first.task_id) is State.SUCCESS


def test_overlap_true_enqueues_beside_a_running_one(store: Store):
    sched = every5()
    store.save_schedules([sched], now=T0 - 1)
    store.fire_tick(sched, T0)
    claim_one(store, names=["job"])
    assert store.fire_tick(sched, T0 + 300).outcome == ENQUEUED


def _jobs(store: Store) -> int:
    return len(store.list_tasks(TaskFilter(name="job", limit=1000)))


def _downtime(store: Store, catch_up: str, max_delay: float | None = None) -> int:
    """A scheduler runs two ticks, the fleet is down an hour, another one starts: how many tasks then."""
    clock = FakeClock(T0 + 1)
    sched = every5(catch_up=catch_up, max_delay=max_delay)
    first = Scheduler(store, [sched], clock=clock)
    first.check()
    clock.advance(300)
    first.check()
    clock.advance(300)
    first.check()
    assert _jobs(store) == 2
    clock.advance(3600 + 30)  # down: twelve ticks pass unseen
    Scheduler(store, [sched], clock=clock).check()
    return _jobs(store) - 2


def test_catch_up_latest_runs_the_newest_missed_tick_once(store: Store):
    assert _downtime(store, "latest") == 1
    (st,) = store.schedules()
    assert st.last_tick == T0 + 600 + 3600


def test_catch_up_all_runs_every_missed_tick(store: Store):
    assert _downtime(store, "all") == 12


def test_catch_up_none_drops_the_missed_ticks(store: Store):
    assert _downtime(store, "none") == 0


def test_max_delay_drops_a_missed_tick_too_old(store: Store):
    assert _downtime(store, "latest", max_delay=10) == 0


def test_a_skip_by_the_loop_is_an_event(store: Store):
    clock = FakeClock(T0 + 1)
    s = Scheduler(store, [every5(overlap=False)], clock=clock)
    s.check()
    for _ in range(2):
        clock.advance(300)
        s.check()
    assert s.counts == {ENQUEUED: 1, SKIPPED: 1}
    (ev,) = store.events(kind="periodic")
    assert ev.subject == "five" and '"skipped"' in ev.data


def test_a_new_schedule_does_not_run_ticks_from_before_it_existed(store: Store):
    clock = FakeClock(T0 + 150)
    sched = every5(catch_up="all")
    s = Scheduler(store, [sched], clock=clock)
    assert s.check() == []
    clock.advance(150)
    assert [(name, tick, r.outcome) for name, tick, r in s.check()] == [("five", T0 + 300, ENQUEUED)]
    assert s.check() == []  # nothing new until the next tick


def test_several_schedulers_on_one_clock_enqueue_each_tick_once(store: Store, store_kind: str):
    clock = FakeClock(T0 + 1)
    sched = every5()
    others = [] if store_kind == "memory" else [open_store(store.url, clock=clock) for _ in range(2)]
    try:
        schedulers = [Scheduler(s, [sched], clock=clock) for s in [store, *others, store]]
        for s in schedulers:
            s.check()  # they start: the schedule is stored
        for _ in range(20):
            clock.advance(300)
            for s in schedulers:
                s.check()
    finally:
        for o in others:
            o.close()
    assert _jobs(store) == 20
    assert sum(s.counts.get(ENQUEUED, 0) for s in schedulers) == 20


# ---- one worker's clock does not own the fleet's ticks -------------------------------------


class _Ahead:
    """A clock ``by`` seconds ahead of ``base`` (a worker whose clock is off)."""

    def __init__(self, base, by: float):
        self.base, self.by = base, by

    def time(self) -> float:
        return self.base.time() + self.by

    def monotonic(self) -> float:
        return self.base.monotonic()


class _StoreTime:
    """PostgreSQL's own clock, read as a worker's clock that is right."""

    def __init__(self, store: Store):
        self.store = store

    def time(self) -> float:
        return self.store.now()

    def monotonic(self) -> float:
        import time

        return time.monotonic()


def _cron_advance(store: Store, store_kind: str, clock: FakeClock, schedulers: list[Scheduler]):
    """Move the store's time and the workers' clocks forward together. PostgreSQL keeps the
    database's clock: every time it and the schedulers hold is shifted back instead."""
    if store_kind != "postgres":
        return clock.advance
    import psycopg

    def shift(seconds: float) -> None:
        s = int(seconds)
        with psycopg.connect(store.url) as conn, conn.transaction():
            conn.execute(
                "UPDATE corral_schedules SET created_at = created_at - %(s)s, last_tick = last_tick - %(s)s",
                {"s": s},
            )
            # through negative values, so no two rows meet on (schedule, tick) on the way
            conn.execute("UPDATE corral_schedule_ticks SET tick = -(tick - %(s)s)", {"s": s})
            conn.execute("UPDATE corral_schedule_ticks SET tick = -tick")
        for sch in schedulers:
            sch._cursor = {k: v - s for k, v in sch._cursor.items()}
            sch._next = {k: v - s for k, v in sch._next.items()}
            if sch._last_check is not None:
                sch._last_check -= s

    return shift


def test_a_worker_an_hour_ahead_does_not_silence_the_others_ticks(store: Store, store_kind: str, clock: FakeClock):
    sched = Schedule(name="minutely", task="job", expr="* * * * *")
    right = clock if store_kind != "postgres" else _StoreTime(store)
    ahead = Scheduler(store, [sched], clock=_Ahead(right, 3600))
    normal = Scheduler(store, [sched], clock=right)
    advance = _cron_advance(store, store_kind, clock, [ahead, normal])
    ahead.check()  # the worker whose clock is ahead starts first and stores the schedule
    normal.check()
    (st,) = store.schedules()
    assert st.created_at <= store.now()  # not stamped an hour ahead
    for k in range(10):
        advance(60)
        due = sched.latest(store.now())
        ahead.check()
        normal.check()
        (st,) = store.schedules()
        assert st.last_tick is not None and st.last_tick >= due, f"tick {k + 1} of 10 not taken"
        assert st.last_tick <= store.now() + 5, "a tick was taken ahead of the store's time"
    assert _jobs(store) >= 10
    assert ahead.counts.get("early", 0) >= 1  # refused once, then on the store's time
    assert -3610 <= ahead.offset <= -3590


@pytest.mark.parametrize("ahead_by", [MAX_CLOCK_AHEAD - 1, 3600])
def test_a_schedule_stored_ahead_of_the_stores_clock_counts_from_the_stores_time(
    store: Store, store_kind: str, clock: FakeClock, ahead_by: float
):
    """The stamp of a new schedule is never past the store's clock: no tick is due at or
    before it, so a stamp ahead of the store's time would drop the ticks in between."""
    sched = Schedule(name="minutely", task="job", expr="* * * * *")
    right = clock if store_kind != "postgres" else _StoreTime(store)
    before = store.now()
    Scheduler(store, [sched], clock=_Ahead(right, ahead_by)).check()
    (st,) = store.schedules()
    assert before <= st.created_at <= store.now()


@pytest.mark.parametrize("ahead_by", [MAX_CLOCK_AHEAD - 1, 3600])
def test_a_schedule_stored_in_a_minutes_last_seconds_runs_the_next_minutes_tick(
    store: Store, store_kind: str, clock: FakeClock, ahead_by: float
):
    """Stored 2 s before a tick (by the store's time) by a worker whose clock is ahead, the
    schedule still runs that tick, whichever worker takes it."""
    if store_kind == "postgres":
        pytest.skip("the moment is set on the stores' fake clock; PostgreSQL's stamp is checked above")
    sched = Schedule(name="minutely", task="job", expr="* * * * *")
    clock.advance(58)  # a minute's last seconds (the clock starts on a minute)
    ahead = Scheduler(store, [sched], clock=_Ahead(clock, ahead_by))
    normal = Scheduler(store, [sched], clock=clock)
    ahead.check()
    normal.check()
    clock.advance(10)
    ahead.check()
    normal.check()
    (st,) = store.schedules()
    assert st.last_tick == T0 + 86400 + 60, "the tick after the schedule was stored was skipped"
    assert _jobs(store) == 1
