"""Priorities with ageing: the order in which ready tasks of a queue are claimed.

A task's *effective* priority grows with the time it has been claimable::

    effective = priority + waited_seconds / AGE_STEP

so a low-priority task under a steady stream of higher-priority ones still
moves: one priority level is worth ``AGE_STEP`` seconds of waiting. Comparing
two tasks by effective priority at any instant is the same as comparing
``eligible_at - priority * AGE_STEP`` (the *claim rank*, lower first): the
``now`` cancels out. The rank never changes while a task waits, so the stores
keep it in an index (an expression on ``run_at`` and ``priority``) and a
claim reads candidates in order without scanning the backlog.

Consequence, and the bound the tests check: a task of priority ``p`` is
never passed by a task of priority ``q > p`` that became claimable more than
``(q - p) * AGE_STEP`` seconds after it. Group order still wins: only a
group's head is a candidate at all.
"""

from __future__ import annotations

#: Seconds of waiting worth one priority level. The SQL stores' index
#: expressions carry this number too (``sql/*.sql``: ``priority * 60``); a
#: test checks that they agree.
AGE_STEP = 60.0


def claim_rank(priority: int, eligible_at: float) -> float:
    """The key ready tasks are claimed by, lowest first (then by id)."""
    return eligible_at - priority * AGE_STEP


def effective_priority(priority: int, eligible_at: float, now: float) -> float:
    """``priority`` raised by one level for every ``AGE_STEP`` seconds waited."""
    return priority + max(0.0, now - eligible_at) / AGE_STEP


def overtake_window(low: int, high: int) -> float:
    """How long after a task of priority ``low`` became claimable a task of
    priority ``high`` may still become claimable and be claimed before it
    (0 when ``high <= low``: later equal or lower work never passes)."""
    return max(0, high - low) * AGE_STEP


__all__ = ["AGE_STEP", "claim_rank", "effective_priority", "overtake_window"]
