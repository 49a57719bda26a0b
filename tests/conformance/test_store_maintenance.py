"""The sweep (corral.maintenance.recovery over the store's find_stuck,
find_stale_pending and rescue): lost leases (crash re-runs and their budget),
unstarted chunk members, stale PENDING, exhausted attempts, guarded writes;
and try_lead()."""

from __future__ import annotations

from corral.core.model import TaskFilter
from corral.core.states import State
from corral.maintenance.recovery import (
    EXHAUSTED_ERROR,
    LOST_LEASE_ERROR,
    MAX_CRASH_RERUNS,
    STALE_PENDING_ERROR,
    STALE_PENDING_PREFIX,
    stale_pending_error,
    sweep_once,
)

from .conftest import (
    claim,
    claim_one,
    claimed_ids,
    expire_lease,
    finish,
    new,
    status_of,
    submit,
    submit_one,
)


def test_sweep_on_a_healthy_store_does_nothing(store):
    submit_one(store)
    submit_one(store, run_at=store.now() + 3600)
    claim(store, 1, lease_seconds=60)
    up = submit_one(store, "up", queue="elsewhere")
    submit_one(store, "down", depends_on=(up,))
    before = store.counts()
    report = sweep_once(store)
    assert report.total == 0
    assert store.counts() == before


def crash(store, advance, tid):
    """Claim ``tid`` and lose its lease as a killed worker would; sweep."""
    rec = claim_one(store, lease_seconds=30)
    assert rec.id == tid
    expire_lease(store, rec, advance)
    return sweep_once(store)


def test_a_lost_lease_runs_again_with_its_attempt_given_back(store, advance):
    tid = submit_one(store, max_retries=1)
    report = crash(store, advance, tid)
    assert report.lost_leases_retried == [tid]
    assert report.lost_leases_failed == []
    got = store.get(tid)
    assert (got.status, got.attempt, got.crashes, got.error) == (State.RETRYING, 0, 1, LOST_LEASE_ERROR)
    assert got.lease_token is None
    again = claim_one(store)  # run_at is now: claimable at once
    assert again.id == tid and again.attempt == 1  # the crash ate none of its retries


def test_a_lost_lease_without_retries_runs_again_until_the_crash_budget_is_spent(store, advance):
    tid = submit_one(store, max_retries=0)
    for n in range(1, MAX_CRASH_RERUNS + 1):
        assert crash(store, advance, tid).lost_leases_retried == [tid]
        got = store.get(tid)
        assert (got.status, got.attempt, got.crashes) == (State.RETRYING, 0, n)
    report = crash(store, advance, tid)  # one crash too many: it counts as the task's failure
    assert report.lost_leases_failed == [tid]
    got = store.get(tid)
    assert (got.status, got.attempt, got.crashes, got.error) == (
        State.FAILED,
        1,
        MAX_CRASH_RERUNS + 1,
        LOST_LEASE_ERROR,
    )
    assert got.finished_at is not None and got.lease_token is None
    assert claim(store, 5) == []
    assert store.retry(tid)  # an operator's retry starts afresh
    assert (store.get(tid).attempt, store.get(tid).crashes) == (0, 0)


def test_past_the_crash_budget_a_crash_burns_a_retry(store, advance):
    tid = submit_one(store, max_retries=1)
    for _ in range(MAX_CRASH_RERUNS):
        crash(store, advance, tid)
    assert crash(store, advance, tid).lost_leases_retried == [tid]
    assert (store.get(tid).status, store.get(tid).attempt) == (State.RETRYING, 1)
    assert crash(store, advance, tid).lost_leases_failed == [tid]
    assert store.get(tid).error == LOST_LEASE_ERROR


def test_lost_lease_failure_cancels_dependents(store, advance):
    tid = submit_one(store, "a")
    dep = submit_one(store, "b", depends_on=(tid,))
    for _ in range(MAX_CRASH_RERUNS + 1):
        crash(store, advance, tid)
    assert status_of(store, tid) is State.FAILED
    assert status_of(store, dep) is State.CANCELED
    assert store.get(dep).error == f"upstream {tid} ended FAILED"


def test_unstarted_chunk_members_go_back_pending_reported_as_lost_leases(store, advance):
    # Pinned: a member that never started goes back to PENDING with its
    # attempt intact, and counts in lost_leases_retried like its head.
    g1, g2, g3 = submit(store, *[new(group="g", max_retries=2) for _ in range(3)])
    (c,) = claim(store, 1, chunk_size=3, lease_seconds=30)
    expire_lease(store, c.tasks[0], advance)
    report = sweep_once(store)
    assert report.lost_leases_retried == [g1, g2, g3]
    assert report.lost_leases_failed == []
    r1, r2, r3 = (store.get(i) for i in (g1, g2, g3))
    assert (r1.status, r1.attempt, r1.error) == (State.RETRYING, 0, LOST_LEASE_ERROR)
    for r in (r2, r3):
        assert (r.status, r.attempt, r.error) == (State.PENDING, 0, None)
        assert r.lease_token is None and r.started_at is None
    # the group resumes in order
    (again,) = claim(store, 1, chunk_size=3)
    assert [t.id for t in again.tasks] == [g1, g2, g3]


def test_unstarted_member_without_retries_is_not_failed(store, advance):
    g1, g2 = submit(store, new(group="g"), new(group="g"))
    (c,) = claim(store, 1, chunk_size=2, lease_seconds=30)
    expire_lease(store, c.tasks[0], advance)
    report = sweep_once(store)
    assert report.lost_leases_failed == []
    assert report.lost_leases_retried == [g1, g2]
    assert (store.get(g1).status, store.get(g1).attempt, store.get(g1).crashes) == (State.RETRYING, 0, 1)
    assert (store.get(g2).status, store.get(g2).attempt, store.get(g2).crashes) == (State.PENDING, 0, 0)
    assert claimed_ids(claim(store, 5, chunk_size=2)) == [g1, g2]


def test_a_lost_lease_is_retried_however_long_ago_its_task_started(store, advance):
    # The worker's watchdog judged the timeout while it lived; a lost lease
    # says the worker died, and how late the sweep came is not the task's fault.
    slow = submit_one(store, "slow", timeout=10, max_retries=3)
    fine = submit_one(store, "fine", timeout=3600, max_retries=0)
    got = claim(store, 2, lease_seconds=600)
    assert len(got) == 2
    advance(300)
    # past twice its timeout, but its worker still holds the lease: the task is
    # that worker's to end (a thread that cannot be killed holds its lane)
    assert sweep_once(store).total == 0
    advance(301)
    report = sweep_once(store)
    assert report.lost_leases_retried == [slow, fine]
    assert report.overdue_failed == [] and report.lost_leases_failed == []
    for tid in (slow, fine):
        assert (store.get(tid).status, store.get(tid).attempt) == (State.RETRYING, 0)
    tokens = [c.token for c in got]
    assert store.heartbeat(tokens, 60).lost_tokens == set(tokens)  # both workers learn they lost


def test_stale_pending_is_canceled(store, advance):
    old = submit_one(store, "old")
    future = submit_one(store, "future", run_at=store.now() + 3600)
    up = submit_one(store, "up", queue="elsewhere", max_retries=2)
    waiting = submit_one(store, "waiting", depends_on=(up,))
    rec = claim_one(store, queues=["elsewhere"])
    assert finish(store, rec, State.RETRYING, run_at=store.now() - 10)
    advance(3600 - 1)
    # the default age (24 h) keeps younger PENDING tasks, None disables the rule
    assert sweep_once(store).stale_pending_canceled == []
    assert sweep_once(store, stale_pending_age=None).stale_pending_canceled == []
    report = sweep_once(store, stale_pending_age=3000)
    assert report.stale_pending_canceled == [old]
    got = store.get(old)
    assert got.status == State.CANCELED
    assert got.error == stale_pending_error(3000)
    assert status_of(store, future) is State.PENDING
    assert status_of(store, up) is State.RETRYING
    assert status_of(store, waiting) is State.WAITING


def test_stale_rule_spares_tasks_waiting_their_turn(store, advance):
    day = 24 * 3600
    head = submit_one(store, "head", "g")
    behind = submit(store, new("b1", "g"), new("b2", "g"))
    [running] = claim(store, lease_seconds=10 * day)  # the group's head runs for days
    assert running.tasks[0].id == head
    loose = submit_one(store, "loose")
    up = submit_one(store, "up", queue="elsewhere")
    waiting = submit_one(store, "waiting", depends_on=(up,))
    assert claim(store, queues=["elsewhere"], lease_seconds=10 * day)[0].tasks[0].id == up
    advance(day + 3600)
    later = submit_one(store, "later", run_at=store.now() + 3600)
    assert sweep_once(store).stale_pending_canceled == [loose]  # nothing held it back
    for tid in behind:
        assert status_of(store, tid) is State.PENDING, "queued behind its group's head: not stale"
    assert status_of(store, waiting) is State.WAITING
    assert status_of(store, later) is State.PENDING
    assert sweep_once(store, stale_pending_age=0).stale_pending_canceled == []


def test_stale_rule_records_why_and_the_tasks_are_found_by_it(store, advance):
    tid = submit_one(store, "forgotten")
    advance(24 * 3600 + 1)
    assert sweep_once(store).stale_pending_canceled == [tid]
    got = store.get(tid)
    assert got.error == STALE_PENDING_ERROR
    assert "\n" not in got.error and "24h" in got.error and "sweeper" in got.error
    found = store.list_tasks(TaskFilter(status=State.CANCELED, error_prefix=STALE_PENDING_PREFIX))
    assert [r.id for r in found] == [tid]
    other = submit_one(store, "canceled by hand")
    store.cancel(other)
    assert [r.id for r in store.list_tasks(TaskFilter(error_prefix=STALE_PENDING_PREFIX))] == [tid]
    assert store.retry(tid) and status_of(store, tid) is State.PENDING


def test_running_with_too_many_attempts_fails_once_its_lease_is_lost(store, advance):
    tid = submit_one(store, max_retries=0)
    rec = claim_one(store, lease_seconds=600)
    # a retry beyond max_retries (the store does not judge complete()'s choice)
    assert finish(store, rec, State.RETRYING, run_at=store.now())
    rec2 = claim_one(store, lease_seconds=600)
    assert rec2.id == tid and rec2.attempt == 2
    assert sweep_once(store).total == 0  # its worker holds the lease
    advance(601)
    report = sweep_once(store)
    assert report.exhausted_failed == [tid]
    got = store.get(tid)
    assert got.status == State.FAILED
    assert got.error == EXHAUSTED_ERROR


def test_sweep_after_completion_changes_nothing(store, advance):
    tid = submit_one(store, max_retries=3)
    rec = claim_one(store, lease_seconds=30)
    expire_lease(store, rec, advance)
    # the worker completes late but before the sweeper gets to it
    assert finish(store, rec, State.SUCCESS, result="1")
    done = store.get(tid)
    report = sweep_once(store, stale_pending_age=0.0)
    assert report.total == 0
    after = store.get(tid)
    assert (after.status, after.version, after.error) == (done.status, done.version, done.error)


def test_completion_after_sweep_is_stale(store, advance):
    tid = submit_one(store, max_retries=3)
    rec = claim_one(store, lease_seconds=30)
    expire_lease(store, rec, advance)
    assert sweep_once(store).lost_leases_retried == [tid]
    swept = store.get(tid)
    assert finish(store, rec, State.SUCCESS, result="1") is False
    after = store.get(tid)
    assert (after.status, after.version, after.result) == (State.RETRYING, swept.version, None)


def test_max_rows_is_one_budget_for_the_whole_sweep(store, advance):
    # Pinned: max_rows bounds the rows one sweep changes over all its rules
    # (stuck tasks first), not each rule on its own.
    running = submit(store, *[new("run", max_retries=1) for _ in range(3)])
    got = claim(store, 3, names=["run"], lease_seconds=30)
    stale = submit(store, *[new("stale") for _ in range(2)])
    for c in got:
        expire_lease(store, c.tasks[0], advance)
    first = sweep_once(store, max_rows=2, stale_pending_age=0)
    assert first.total == 2
    assert first.lost_leases_retried == running[:2]
    second = sweep_once(store, max_rows=2, stale_pending_age=0)
    assert (second.lost_leases_retried, second.stale_pending_canceled) == (running[2:], stale[:1])
    third = sweep_once(store, max_rows=2, stale_pending_age=0)
    assert third.stale_pending_canceled == stale[1:]
    assert all(status_of(store, i) is State.RETRYING for i in running)


# ---- leadership --------------------------------------------------------------


def test_try_lead_one_holder_at_a_time(store):
    assert store.try_lead("sweeper", "a", ttl=30) is True
    assert store.try_lead("sweeper", "b", ttl=30) is False
    assert store.try_lead("sweeper", "a", ttl=30) is True  # renew
    assert store.try_lead("other-role", "b", ttl=30) is True
    assert store.try_lead("sweeper", "b", ttl=30) is False


def test_try_lead_taken_over_after_ttl(store, advance):
    assert store.try_lead("sweeper", "a", ttl=10) is True
    assert store.try_lead("sweeper", "b", ttl=10) is False
    advance(9)
    assert store.try_lead("sweeper", "b", ttl=30) is False
    advance(2)
    assert store.try_lead("sweeper", "b", ttl=30) is True
    assert store.try_lead("sweeper", "a", ttl=30) is False
    assert store.try_lead("sweeper", "b", ttl=30) is True


def test_try_lead_renewal_extends(store, advance):
    assert store.try_lead("sweeper", "a", ttl=10)
    assert store.try_lead("sweeper", "a", ttl=60)
    # well past the first ttl, the renewed lead still holds
    advance(30)
    assert store.try_lead("sweeper", "b", ttl=30) is False


def test_try_lead_shared_between_instances(store, second_store):
    assert store.try_lead("sweeper", "a", ttl=30) is True
    assert second_store.try_lead("sweeper", "b", ttl=30) is False
    assert second_store.try_lead("sweeper", "a", ttl=30) is True


# ---- who sweeps --------------------------------------------------------------


def test_a_dead_leaders_lead_ends_before_the_lease_it_held_so_another_sweeper_recovers_its_tasks(store, advance):
    # Default settings: the leading worker dies just after its sweep; its
    # task's 30 s lease runs out. The next sweeper must not wait out a longer lead.
    from corral.maintenance.sweeper import Sweeper

    tid = submit_one(store, max_retries=0)
    rec = claim_one(store, lease_seconds=30)
    leader, other = Sweeper(store, holder="leader"), Sweeper(store, holder="other")
    assert leader.tick() is not None  # it leads, then is killed
    expire_lease(store, rec, advance)
    assert other.tick() is not None and other.is_leader
    assert (store.get(tid).status, store.get(tid).attempt) == (State.RETRYING, 0)


def test_a_sweeper_that_does_not_lead_recovers_leases_the_leader_left_expired(store, advance):
    # A leader that keeps its lead but sweeps seldom (`corral sweep --loop
    # --interval 5m`) must not hold a dead worker's groups for its interval.
    from corral.maintenance.sweeper import Sweeper

    slow = Sweeper(store, interval=300, holder="slow")
    other = Sweeper(store, interval=10, holder="other")
    tid = submit_one(store, max_retries=0)
    rec = claim_one(store, lease_seconds=30)
    assert slow.tick() is not None
    expire_lease(store, rec, advance)
    assert other.tick() is None  # not the leader, and the lease expired just now: the leader's to sweep
    assert status_of(store, tid) is State.RUNNING
    advance(other.backstop)
    assert other.tick() is None and not other.is_leader
    assert (store.get(tid).status, store.get(tid).attempt, store.get(tid).crashes) == (State.RETRYING, 0, 1)
    assert other.backstop_recovered == 1
    assert slow.tick().total == 0  # nothing left for the leader, and no row changed twice
