"""What a sweep does with the tasks crashed workers left behind: one policy, every store.

Modelled on river's job rescuer: the store answers two bounded reads
(:meth:`Store.find_stuck`, :meth:`Store.find_stale_pending`), :func:`decide`
turns what they found into decisions without touching a database, and
:meth:`Store.rescue` applies them as guarded writes (a row that moved on since
it was read is left alone). The rules therefore live here once, and a store
only knows how to read candidates and write a decision.

The rules, in order of precedence for a RUNNING task whose lease expired
(a live lease is its worker's, whose watchdog judges its timeout):

- a chunk member that never started goes back to PENDING with its attempt
  intact;
- a task that ran more attempts than ``max_retries + 1`` fails with
  :data:`EXHAUSTED_ERROR`;
- otherwise its worker died (or hung whole) under it, which is not the task's
  failure: while it has crashed fewer than :data:`MAX_CRASH_RERUNS` times it
  goes to RETRYING (runnable now) with its attempt given back, so a crash
  never eats the task's own retries, and its ``crashes`` count goes up;
- past that budget (a task that keeps killing its worker) each crash counts
  as a failed attempt: RETRYING while retries are left, else FAILED with
  :data:`LOST_LEASE_ERROR`.

And a PENDING task that a worker could have taken for longer than
``stale_pending_age`` (default 24 h) and none did is canceled, its error
saying why (:func:`stale_pending_error`, all starting with
:data:`STALE_PENDING_PREFIX`, so ``corral tasks --stale`` finds them and
``corral retry --stale`` queues them again). Only a task nothing holds back
counts: ungrouped, or its group's head with nothing of the group running or
claimed within the age. A task waiting its turn behind its group's head, on
a dependency (WAITING), or for a ``run_at`` still to come is never stale.

``max_rows`` is one budget for the whole sweep: stuck tasks first, stale
pending ones with what is left, so one sweep never changes more rows.
"""

from __future__ import annotations

from collections.abc import Sequence

from corral.core.model import EXPIRED, SweepReport
from corral.core.states import State
from corral.stores.base import Rescue, Store, SweepRow

#: PENDING for longer than this (seconds) is canceled by the sweeper.
DEFAULT_STALE_PENDING_AGE = 24 * 3600.0
#: Rows one sweep may change at most, over all its rules.
DEFAULT_MAX_ROWS = 1000
#: Crash re-runs a task gets on top of its retries: a run lost with its
#: worker (kill -9, out of memory, machine gone) runs again with its attempt
#: given back this many times; after that each crash counts as a failure.
#: A guard against a task that kills its worker, not a retry policy.
MAX_CRASH_RERUNS = 3
LOST_LEASE_ERROR = "worker crashed or task hung (lease expired)"
#: No longer recorded by a sweep (a lost lease is retried, however long ago
#: the task started); kept for rows and code that name it.
OVERDUE_ERROR = "worker crashed or task hung (running past twice its timeout)"
#: How every stale-pending cancellation's error starts.
STALE_PENDING_PREFIX = "canceled by the sweeper: pending for more than"
EXHAUSTED_ERROR = "worker crashed or task hung (retries exhausted while running)"


def stale_pending_error(age: float) -> str:
    """The one-line reason recorded on a task the stale-pending rule cancels."""
    from corral.core.planning import format_duration

    shown = f"{age / 3600:g}h" if age >= 3600 and age % 3600 == 0 else format_duration(age)
    return f"{STALE_PENDING_PREFIX} {shown} with no worker taking it"


#: The reason at the default age.
STALE_PENDING_ERROR = stale_pending_error(DEFAULT_STALE_PENDING_AGE)


def decide_stuck(row: SweepRow, now: float) -> tuple[str, Rescue] | None:
    """The decision for one RUNNING task at ``now``, with the report field it
    counts in; None when the task is healthy.

    Only a lost lease is recovered. While its worker renews the lease the
    task is that worker's to end, even past twice its timeout: a timed-out
    thread cannot be killed, so its worker holds its lane until the thread
    has really ended, and a sweeper that failed it meanwhile would let the
    task's retry or the next task of its group run beside it. A lost lease
    means the worker died: how long ago the task started says nothing about
    the task (the delay is the sweep's), so it runs again on its crash
    budget, then on its retries (see the module's rules)."""
    if row.lease_expires_at is None or row.lease_expires_at >= now:
        return None
    if row.started_at is None:  # a chunk member that never started: no attempt to burn
        return "lost_leases_retried", Rescue(row.id, row.version, State.PENDING, None)
    if row.attempt > row.max_retries + 1:
        return "exhausted_failed", Rescue(row.id, row.version, State.FAILED, EXHAUSTED_ERROR, crashed=True)
    if row.crashes < MAX_CRASH_RERUNS:
        return "lost_leases_retried", Rescue(
            row.id, row.version, State.RETRYING, LOST_LEASE_ERROR, crashed=True, give_back=True
        )
    if row.attempt <= row.max_retries:
        return "lost_leases_retried", Rescue(row.id, row.version, State.RETRYING, LOST_LEASE_ERROR, crashed=True)
    return "lost_leases_failed", Rescue(row.id, row.version, State.FAILED, LOST_LEASE_ERROR, crashed=True)


def decide(
    stuck: Sequence[SweepRow],
    stale_pending: Sequence[SweepRow],
    now: float,
    stale_pending_age: float = DEFAULT_STALE_PENDING_AGE,
) -> list[tuple[str, Rescue]]:
    """Every decision for what a sweep found, each with its report field."""
    out = [d for row in stuck if (d := decide_stuck(row, now)) is not None]
    reason = stale_pending_error(stale_pending_age)
    out += [("stale_pending_canceled", Rescue(row.id, row.version, State.CANCELED, reason)) for row in stale_pending]
    return out


def sweep_once(
    store: Store,
    *,
    stale_pending_age: float | None = DEFAULT_STALE_PENDING_AGE,
    max_rows: int = DEFAULT_MAX_ROWS,
    rescue_leases: bool = True,
) -> SweepReport:
    """One bounded sweep of ``store`` by the module's rules, on the store's clock.

    With ``rescue_leases`` false, RUNNING tasks are left alone this time
    (their leases may have run out during an outage their workers could not
    renew through). Reports only the writes that applied; ids ascending in
    each field."""
    now = store.now()
    stuck = store.find_stuck(now, max_rows) if rescue_leases else []
    left = max_rows - len(stuck)
    stale: list[SweepRow] = []
    if stale_pending_age is not None and left > 0:
        stale = store.find_stale_pending(now - stale_pending_age, left)
    report = _apply(store, decide(stuck, stale, now, stale_pending_age or 0.0))
    store.repair(max_rows)
    return report


def expire_queued(store: Store, *, max_rows: int = DEFAULT_MAX_ROWS) -> SweepReport:
    """End queued tasks past the deadline of their first start that no claim
    met (their queue has no worker, or none claims now): CANCELED "expired",
    one bounded read and guarded writes (a claim since the read wins). A claim
    never starts such a task whoever ends it."""
    rows = store.find_expired(store.now(), max_rows)
    return _apply(store, [("expired_canceled", Rescue(r.id, r.version, State.CANCELED, EXPIRED)) for r in rows])


def recover_lost_leases(store: Store, *, expired_for: float = 0.0, max_rows: int = DEFAULT_MAX_ROWS) -> SweepReport:
    """Only the lost-lease rules, for leases that expired at least
    ``expired_for`` seconds ago: one bounded read of RUNNING rows and guarded
    writes. What a sweeper that does not lead runs, as a backstop for a
    leader that stopped sweeping (see :class:`corral.maintenance.Sweeper`)."""
    cutoff = store.now() - max(0.0, expired_for)
    stuck = store.find_stuck(cutoff, max_rows)
    return _apply(store, [d for row in stuck if (d := decide_stuck(row, cutoff)) is not None])


def _apply(store: Store, decisions: list[tuple[str, Rescue]]) -> SweepReport:
    """Write ``decisions``; the report names those that applied, ids ascending."""
    report = SweepReport()
    applied = store.rescue([r for _, r in decisions]) if decisions else []
    for (field, rescue), ok in zip(decisions, applied):
        if ok:
            getattr(report, field).append(rescue.task_id)
    for f in report.__dataclass_fields__:
        getattr(report, f).sort()
    return report
