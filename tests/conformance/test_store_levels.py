"""Degradation levels and dead letters in the store: the fleet level row, the
event log, the failing-kinds signal, claims of retries only, the dead-letter
view and its re-queue (group order kept)."""

from __future__ import annotations

import json

from corral.core.model import Outcome
from corral.core.states import State
from corral.stores.base import FleetLevel

from .conftest import claim, claim_one, claimed_ids, finish, new, submit, submit_one


def _retrying(store, name: str = "t", **kw) -> int:
    """A task that failed once and now waits in RETRYING, due at once."""
    tid = submit_one(store, name, max_retries=3, **kw)
    rec = claim_one(store, names=[name])
    (ok,) = store.complete([Outcome(rec.id, rec.lease_token, rec.version, State.RETRYING, error="x", run_at=0.0)])
    assert ok
    return tid


# ---- claims of retries only ------------------------------------------------------


def test_only_retries_claims_retrying_tasks_and_leaves_fresh_work(store):
    fresh = submit_one(store, "fresh")
    retry = _retrying(store, "again")
    later = submit_one(store, "fresh")
    got = claim(store, 5, only_retries=True)
    assert claimed_ids(got) == [retry]
    assert got[0].tasks[0].attempt == 2
    # fresh work was not touched: no attempt burned, still claimable
    for tid in (fresh, later):
        rec = store.get(tid)
        assert (rec.status, rec.attempt) == (State.PENDING, 0)
    assert claim(store, 5, only_retries=True) == []
    assert sorted(claimed_ids(claim(store, 5))) == [fresh, later]


def test_only_retries_keeps_group_order(store):
    # a retrying head blocks its group; the fresh task behind it waits for it
    head = _retrying(store, "g", group="A")
    behind = submit_one(store, "g", group="A")
    assert claimed_ids(claim(store, 5, only_retries=True)) == [head]
    assert claim(store, 5) == []
    assert store.get(behind).status == State.PENDING


def test_only_retries_chunks_stop_at_fresh_members(store):
    head = _retrying(store, "g", group="A")
    submit_one(store, "g", group="A")
    got = claim(store, 5, only_retries=True, chunk_size=3)
    assert [len(c.tasks) for c in got] == [1] and got[0].tasks[0].id == head


def test_only_retries_still_respects_rates(store, advance):
    from corral.core.model import LimitSpec

    store.set_limit(LimitSpec("api", rate="1/m", burst=1))
    retry = _retrying(store, "t", limits=("api",))  # its first run took the one token
    fresh = submit_one(store, "t", limits=("api",))
    assert claim(store, 5, only_retries=True) == []  # no token yet: nothing claimed, nothing burned
    assert store.get(retry).attempt == 1
    advance(60)
    assert claimed_ids(claim(store, 5, only_retries=True)) == [retry]
    assert store.get(fresh).status == State.PENDING


def test_only_retries_still_respects_a_paused_limit(store, advance):
    from corral.core.model import LimitSpec

    store.set_limit(LimitSpec("api", concurrency=5))
    tid = submit_one(store, "t", limits=("api",))
    rec = claim_one(store)
    # a 429: the task snoozes (due at once) and its limit pauses for 30 s
    assert finish(store, rec, State.RETRYING, run_at=store.now(), snooze=True, pause_limits=30.0, error="429")
    assert store.get(tid).status == State.RETRYING
    assert claim(store, 5, only_retries=True) == []
    advance(31)
    assert claimed_ids(claim(store, 5, only_retries=True)) == [tid]


def test_only_retries_still_respects_breakers(store):
    from corral.core.breaker import BreakerConfig, BreakerState

    store.set_breaker("flaky", BreakerConfig(min_calls=4, probes=1))
    retry = _retrying(store, "flaky")
    store.force_breaker("flaky", BreakerState.OPEN, "partner outage")
    assert claim(store, 5, only_retries=True) == []
    assert store.get(retry).attempt == 1
    store.force_breaker("flaky", BreakerState.CLOSED, "partner back")
    assert claimed_ids(claim(store, 5, only_retries=True)) == [retry]


# ---- fleet level and events ----------------------------------------------------


def test_fleet_level_defaults_to_normal_automatic(store):
    lv = store.fleet_level()
    assert (lv.level, lv.manual, lv.calm_since, lv.reason) == (0, False, None, "")


def test_set_fleet_level_writes_row_and_event_together(store):
    data = json.dumps({"from": "NORMAL", "to": "WARNING", "reason": "r"})
    assert store.set_fleet_level(FleetLevel(1, False, None, "r"), auto=True, event=data)
    lv = store.fleet_level()
    assert (lv.level, lv.manual, lv.reason) == (1, False, "r")
    assert lv.changed_at is not None and abs(lv.changed_at - store.now()) < 5
    (ev,) = store.events(kind="level")
    assert (ev.kind, ev.subject, json.loads(ev.data)) == ("level", "fleet", json.loads(data))


def test_changed_at_moves_only_when_the_level_changes(store, advance):
    assert store.set_fleet_level(FleetLevel(2, False, None, "a"), auto=True)
    first = store.fleet_level().changed_at
    advance(60)
    assert store.set_fleet_level(FleetLevel(2, False, store.now(), "a"), auto=True)
    now_row = store.fleet_level()
    assert now_row.changed_at is not None and first is not None
    # PostgreSQL moves time by shifting stored times back: compare to now
    assert store.now() - now_row.changed_at >= 59
    assert now_row.calm_since is not None
    assert store.set_fleet_level(FleetLevel(1, False, None, "b"), auto=True)
    assert abs(store.fleet_level().changed_at - store.now()) < 5


def test_a_manual_level_wins_over_automatic_steps(store):
    assert store.set_fleet_level(FleetLevel(3, True, None, "partner outage"), auto=False, event="{}")
    assert not store.set_fleet_level(FleetLevel(1, False, None, "signals"), auto=True, event="{}")
    lv = store.fleet_level()
    assert (lv.level, lv.manual, lv.reason) == (3, True, "partner outage")
    assert len(store.events()) == 1  # the refused step wrote no event
    # handing back (manual False, by hand) lets automatic steps write again
    assert store.set_fleet_level(FleetLevel(3, False, None, "handed back"), auto=False)
    assert store.set_fleet_level(FleetLevel(1, False, None, "signals"), auto=True)
    assert store.fleet_level().level == 1


def test_events_newest_first_filtered_and_trimmed(store, advance):
    first = store.add_event("level", "fleet", '{"n": 1}')
    advance(100)
    for i in range(2, 6):
        store.add_event("other" if i % 2 else "level", "x", json.dumps({"n": i}))
    assert [json.loads(e.data)["n"] for e in store.events()] == [5, 4, 3, 2, 1]
    assert [json.loads(e.data)["n"] for e in store.events(kind="level")] == [4, 2, 1]
    assert len(store.events(limit=2)) == 2
    # older than 50 s ago: the first goes; beyond the newest 3: one more
    assert store.trim_events(keep=3, before=store.now() - 50) == 2
    assert [json.loads(e.data)["n"] for e in store.events()] == [5, 4, 3]
    assert first not in [e.id for e in store.events()]
    assert store.trim_events(keep=10, before=store.now() - 1000) == 0


# ---- failing kinds ---------------------------------------------------------------


def _run(store, name: str, status: State) -> int:
    tid = submit_one(store, name)
    rec = claim_one(store, names=[name])
    assert finish(store, rec, status, error=None if status is State.SUCCESS else "boom")
    return tid


def test_failing_kinds_counts_failures_in_a_row_per_name(store, advance):
    since = store.now() - 1
    for _ in range(3):
        _run(store, "a", State.FAILED)
    _run(store, "b", State.FAILED)
    _run(store, "b", State.TIMEOUT)
    _run(store, "b", State.FAILED)
    for _ in range(3):
        _run(store, "c", State.FAILED)
    _run(store, "c", State.SUCCESS)  # c recovered: not failing
    _run(store, "d", State.FAILED)
    _run(store, "d", State.FAILED)  # only two
    assert store.failing_kinds(since, 3) == ["a", "b"]
    assert store.failing_kinds(since, 2) == ["a", "b", "d"]
    # failures before the window do not count
    advance(600)
    assert store.failing_kinds(store.now() - 60, 3) == []


def test_failing_kinds_reads_a_bounded_number_of_failures(store):
    since = store.now() - 1
    for _ in range(3):
        _run(store, "old", State.FAILED)
    for _ in range(3):
        _run(store, "new", State.FAILED)
    assert store.failing_kinds(since, 3, scan=3) == ["new"]


# ---- dead letters ----------------------------------------------------------------


def test_dead_letters_are_final_failures_and_timeouts_not_yet_retried(store):
    failed = _run(store, "a", State.FAILED)
    _run(store, "a", State.SUCCESS)
    timed = _run(store, "a", State.TIMEOUT)
    canceled = submit_one(store, "a", queue="q")
    store.cancel(canceled)
    retrying = _retrying(store, "r")
    dead = store.dead_letters()
    assert [t.id for t in dead] == [failed, timed]
    assert dead[0].error == "boom" and dead[0].attempt == 1 and dead[0].status == State.FAILED
    assert retrying not in [t.id for t in dead]
    assert store.retry(failed)
    assert [t.id for t in store.dead_letters()] == [timed]
    assert [t.id for t in store.dead_letters(limit=1, offset=1)] == []


def test_dead_letters_by_batch_and_failed_dependents(store):
    (a,) = submit(store, new("a", batch="b1"))
    (other,) = submit(store, new("a", batch="b2"))
    (dep,) = submit(store, new("a", batch="b1", depends_on=(a,)))
    for _ in range(2):
        rec = claim_one(store, names=["a"])
        assert finish(store, rec, State.FAILED, error="boom")
    # the dependent is canceled, not failed: it is no dead letter
    assert [t.id for t in store.dead_letters(batch="b1")] == [a]
    assert store.get(dep).error == f"upstream {a} ended FAILED"
    assert [t.id for t in store.dead_letters(batch="b2")] == [other]


def test_retry_dead_requeues_in_one_go_by_batch(store):
    a = _run(store, "a", State.FAILED)
    (b,) = submit(store, new("a", batch="b1"))
    assert finish(store, claim_one(store), State.TIMEOUT, error="slow")
    assert store.retry_dead(batch="b1") == [b]
    rec = store.get(b)
    assert (rec.status, rec.attempt) == (State.PENDING, 0)
    assert store.retry_dead() == [a]
    assert store.dead_letters() == []
    assert store.retry_dead() == []
    assert sorted(claimed_ids(claim(store, 5))) == [a, b]


def test_retry_dead_keeps_group_order(store):
    """A failed head that did not halt its group let later tasks run; queued
    again, failed tasks go back into the line in submit order, ahead of the
    group's tasks still queued."""
    ids = submit(store, *(new("g", group="G") for _ in range(4)))
    t1, t2, t3, t4 = ids
    assert finish(store, claim_one(store), State.FAILED, error="x")  # t1
    assert finish(store, claim_one(store), State.FAILED, error="x")  # t2
    assert finish(store, claim_one(store))  # t3
    assert store.get(t4).status == State.PENDING  # t4 queued, not yet claimed
    assert store.retry_dead() == [t1, t2]
    order = []
    while True:
        got = claim(store, 5)
        if not got:
            break
        assert len(got) == 1  # one of the group in flight at a time
        order.append(got[0].tasks[0].id)
        assert finish(store, got[0].tasks[0])
    assert order == [t1, t2, t4]


# ---- the leader's step over each store ---------------------------------------------


def test_level_keeper_steps_up_at_once_and_down_after_calm(store, advance):
    from corral.core.levels import Level, Thresholds
    from corral.maintenance.level_keeper import LevelKeeper

    for name in ("a", "b"):
        for _ in range(3):
            _run(store, name, State.FAILED)
    keeper = LevelKeeper(store, thresholds=Thresholds(calm_period=100.0), window=50.0)
    assert Level(keeper.tick().level) is Level.WARNING  # two kinds failing in a row
    (ev,) = store.events(kind="level")
    data = json.loads(ev.data)
    assert (data["from"], data["to"], data["signals"]["failing_kinds"]) == ("NORMAL", "WARNING", 2)
    advance(60)  # the failures left the window: calm from now
    assert Level(keeper.tick().level) is Level.WARNING
    advance(99)
    assert Level(keeper.tick().level) is Level.WARNING
    advance(2)
    assert Level(keeper.tick().level) is Level.NORMAL
    assert [json.loads(e.data)["to"] for e in store.events(kind="level")] == ["NORMAL", "WARNING"]
    # by hand: the keeper leaves it alone, EMERGENCY included, until handed back
    assert store.set_fleet_level(FleetLevel(int(Level.EMERGENCY), True, None, "ops"), auto=False)
    advance(500)
    assert Level(keeper.tick().level) is Level.EMERGENCY
    # handed back: the next evaluation sets what the signals say, at once
    from corral.core.levels import HANDED_BACK
    from corral.engine.level_follower import set_level

    assert set_level(store, "auto") is Level.EMERGENCY
    assert store.fleet_level().calm_since == HANDED_BACK
    assert Level(keeper.tick().level) is Level.NORMAL
    assert store.fleet_level().calm_since is None


def test_level_keeper_counts_queue_depth_and_lost_leases(store):
    from corral.core.levels import Level
    from corral.core.model import SweepReport
    from corral.maintenance.level_keeper import LevelKeeper

    submit(store, *(new() for _ in range(4)))
    assert Level(LevelKeeper(store, queue_bound=5).tick().level) is Level.WARNING
    keeper = LevelKeeper(store, window=60.0)
    report = SweepReport(lost_leases_retried=list(range(5)))
    assert keeper.signals(store.now(), report).lease_losses_per_min == 5.0


def test_level_keeper_counts_open_breakers_from_the_store(store):
    from corral.core.breaker import BreakerConfig, BreakerState
    from corral.core.levels import Level
    from corral.maintenance.level_keeper import LevelKeeper

    for name in ("a", "b", "c"):
        store.set_breaker(name, BreakerConfig())
    keeper = LevelKeeper(store)
    assert keeper.signals(store.now()).open_breakers == 0
    store.force_breaker("a", BreakerState.OPEN, "outage")
    assert keeper.signals(store.now()).open_breakers == 1
    assert Level(keeper.tick().level) is Level.WARNING
    store.force_breaker("b", BreakerState.OPEN, "outage")
    assert Level(keeper.tick().level) is Level.DEGRADED
    (ev, _) = store.events(kind="level")
    assert json.loads(ev.data)["signals"]["open_breakers"] == 2


def _many_dead(store, n: int = 300) -> list[int]:
    """``n`` tasks, five in six ending FAILED or TIMEOUT (the rest SUCCESS, so
    the dead letters' ids have gaps), even ones of batch ``b``; the dead ids."""
    submit(store, *[new("d", batch="b" if i % 2 == 0 else None) for i in range(n)])
    done = 0
    while done < n:
        claims = claim(store, 100, names=["d"])
        assert claims, f"only {done} of {n} claimed"
        outcomes = []
        for c in claims:
            for t in c.tasks:
                k = (t.id - 1) % 6
                status = State.SUCCESS if k == 5 else State.TIMEOUT if k == 4 else State.FAILED
                outcomes.append(Outcome(t.id, c.token, t.version, status, error=None if k == 5 else "boom"))
        assert all(store.complete(outcomes))
        done += len(outcomes)
    return [t.id for t in store.dead_letters(limit=n + 1)]


def _walk(store, page: int, batch: str | None = None) -> list[list[int]]:
    pages: list[list[int]] = []
    after = None
    for _ in range(100):  # a walk that does not move on stops here, and fails
        rows = store.dead_letters(batch=batch, limit=page, after_id=after)
        if not rows:
            break
        pages.append([t.id for t in rows])
        after = rows[-1].id
    return pages


def test_dead_letters_page_by_keyset_each_once_in_order(store):
    dead = _many_dead(store)
    assert len(dead) == 250 and dead == sorted(dead)
    pages = _walk(store, 50)
    assert [len(p) for p in pages] == [50] * 5
    assert [i for p in pages for i in p] == dead
    in_batch = [t.id for t in store.dead_letters(batch="b", limit=300)]
    assert len(in_batch) == 150  # its tasks are the odd ids, none a success
    assert [i for p in _walk(store, 50, batch="b") for i in p] == in_batch
    # a page past the last id is empty; one past any id starts right after it
    assert store.dead_letters(after_id=dead[-1]) == []
    assert [t.id for t in store.dead_letters(limit=2, after_id=dead[7])] == dead[8:10]


def test_a_dead_letter_retried_between_page_reads_moves_no_other_across_the_edge(store):
    dead = _many_dead(store)
    first = [t.id for t in store.dead_letters(limit=50)]
    assert first == dead[:50]
    # one the first page showed is retried: the second page neither skips nor repeats
    assert store.retry(first[10])
    second = [t.id for t in store.dead_letters(limit=50, after_id=first[-1])]
    assert second == dead[50:100]
    # one further on is retried: the next page is the rest, in order
    assert store.retry(dead[120])
    third = [t.id for t in store.dead_letters(limit=50, after_id=second[-1])]
    assert third == dead[100:120] + dead[121:151]
    # the same in one batch
    in_batch = [t.id for t in store.dead_letters(batch="b", limit=300)]
    page = [t.id for t in store.dead_letters(batch="b", limit=20)]
    assert page == in_batch[:20]
    assert store.retry(page[0])
    assert [t.id for t in store.dead_letters(batch="b", limit=20, after_id=page[-1])] == in_batch[20:40]
