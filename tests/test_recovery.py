"""The sweep's decisions, without a database."""

from __future__ import annotations

from corral.core.states import State
from corral.maintenance.recovery import (
    EXHAUSTED_ERROR,
    LOST_LEASE_ERROR,
    MAX_CRASH_RERUNS,
    STALE_PENDING_ERROR,
    decide,
    decide_stuck,
)
from corral.stores.base import Rescue, SweepRow

NOW = 1000.0
LOST = 999.0  # a lease that expired a second ago


def row(*, attempt=1, max_retries=0, started_at=900.0, timeout=None, lease_expires_at=2000.0, crashes=0) -> SweepRow:
    return SweepRow(7, 3, attempt, max_retries, started_at, timeout, lease_expires_at, crashes)


def crash_rerun() -> tuple[str, Rescue]:
    return "lost_leases_retried", Rescue(7, 3, State.RETRYING, LOST_LEASE_ERROR, crashed=True, give_back=True)


def test_a_lost_lease_is_a_crash_rerun_with_the_attempt_given_back_even_without_retries():
    # retries=0: the worker died, the task did not fail
    assert decide_stuck(row(max_retries=0, lease_expires_at=LOST), NOW) == crash_rerun()
    # on its last retry: the crash does not eat it
    assert decide_stuck(row(attempt=2, max_retries=1, lease_expires_at=LOST), NOW) == crash_rerun()
    assert decide_stuck(row(max_retries=0, lease_expires_at=LOST, crashes=MAX_CRASH_RERUNS - 1), NOW) == crash_rerun()


def test_a_lost_lease_is_retried_however_long_ago_the_task_started():
    # timeout=4, killed 10 ms into the run, swept 9 s later: past twice its
    # timeout only because the sweep came late; the watchdog died with the worker
    got = decide_stuck(row(max_retries=2, timeout=4, started_at=NOW - 9, lease_expires_at=LOST), NOW)
    assert got == crash_rerun()
    got = decide_stuck(row(max_retries=0, timeout=1, started_at=NOW - 500, lease_expires_at=LOST), NOW)
    assert got == crash_rerun()


def test_past_the_crash_budget_each_crash_counts_as_a_failed_attempt():
    spent = MAX_CRASH_RERUNS
    assert decide_stuck(row(attempt=1, max_retries=1, lease_expires_at=LOST, crashes=spent), NOW) == (
        "lost_leases_retried",
        Rescue(7, 3, State.RETRYING, LOST_LEASE_ERROR, crashed=True),
    )
    assert decide_stuck(row(attempt=2, max_retries=1, lease_expires_at=LOST, crashes=spent), NOW) == (
        "lost_leases_failed",
        Rescue(7, 3, State.FAILED, LOST_LEASE_ERROR, crashed=True),
    )
    assert decide_stuck(row(max_retries=0, lease_expires_at=LOST, crashes=spent + 5), NOW)[1].to is State.FAILED


def test_a_chunk_member_that_never_started_goes_back_with_its_attempt():
    assert decide_stuck(row(attempt=0, started_at=None, lease_expires_at=LOST), NOW) == (
        "lost_leases_retried",
        Rescue(7, 3, State.PENDING, None),
    )


def test_exhausted_is_failed_once_the_lease_is_lost_and_a_live_lease_is_left_alone():
    assert decide_stuck(row(attempt=3, max_retries=1, lease_expires_at=LOST), NOW) == (
        "exhausted_failed",
        Rescue(7, 3, State.FAILED, EXHAUSTED_ERROR, crashed=True),
    )
    # a worker that still renews the lease is left alone, however late its task
    assert decide_stuck(row(timeout=40, started_at=NOW - 500), NOW) is None
    assert decide_stuck(row(attempt=3, max_retries=1), NOW) is None


def test_stale_pending_is_canceled():
    assert decide([], [row(attempt=0, started_at=None, lease_expires_at=None)], NOW) == [
        ("stale_pending_canceled", Rescue(7, 3, State.CANCELED, STALE_PENDING_ERROR))
    ]
