"""The sweep's decisions, without a database."""

from __future__ import annotations

from corral.core.states import State
from corral.maintenance.recovery import (
    EXHAUSTED_ERROR,
    LOST_LEASE_ERROR,
    OVERDUE_ERROR,
    STALE_PENDING_ERROR,
    decide,
    decide_stuck,
)
from corral.stores.base import Rescue, SweepRow

NOW = 1000.0


def row(*, attempt=1, max_retries=0, started_at=900.0, timeout=None, lease_expires_at=2000.0) -> SweepRow:
    return SweepRow(7, 3, attempt, max_retries, started_at, timeout, lease_expires_at)


def test_lost_lease_retries_while_retries_are_left_then_fails():
    assert decide_stuck(row(max_retries=1, lease_expires_at=999), NOW) == (
        "lost_leases_retried",
        Rescue(7, 3, State.RETRYING, LOST_LEASE_ERROR),
    )
    assert decide_stuck(row(attempt=2, max_retries=1, lease_expires_at=999), NOW) == (
        "lost_leases_failed",
        Rescue(7, 3, State.FAILED, LOST_LEASE_ERROR),
    )


def test_a_chunk_member_that_never_started_goes_back_with_its_attempt():
    assert decide_stuck(row(attempt=0, started_at=None, lease_expires_at=999), NOW) == (
        "lost_leases_retried",
        Rescue(7, 3, State.PENDING, None),
    )


def test_overdue_and_exhausted_are_failed_once_the_lease_is_lost():
    lost = 999
    assert decide_stuck(row(timeout=40, started_at=919, lease_expires_at=lost), NOW) == (
        "overdue_failed",
        Rescue(7, 3, State.FAILED, OVERDUE_ERROR),
    )
    assert decide_stuck(row(attempt=3, max_retries=1, lease_expires_at=lost), NOW) == (
        "exhausted_failed",
        Rescue(7, 3, State.FAILED, EXHAUSTED_ERROR),
    )
    # a worker that still renews the lease is left alone, however late its task
    assert decide_stuck(row(timeout=40, started_at=919), NOW) is None
    assert decide_stuck(row(attempt=3, max_retries=1), NOW) is None


def test_a_lost_lease_past_twice_its_timeout_is_failed_as_overdue_not_retried():
    got = decide_stuck(row(attempt=1, max_retries=3, timeout=1, lease_expires_at=999), NOW)
    assert got == ("overdue_failed", Rescue(7, 3, State.FAILED, OVERDUE_ERROR))
    got = decide_stuck(row(attempt=2, max_retries=1, lease_expires_at=999), NOW)
    assert got == ("lost_leases_failed", Rescue(7, 3, State.FAILED, LOST_LEASE_ERROR))


def test_stale_pending_is_canceled():
    assert decide([], [row(attempt=0, started_at=None, lease_expires_at=None)], NOW) == [
        ("stale_pending_canceled", Rescue(7, 3, State.CANCELED, STALE_PENDING_ERROR))
    ]
