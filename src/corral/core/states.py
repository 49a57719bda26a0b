"""The task state machine, written once, as data.

Every store and the engine consult :data:`TRANSITIONS`; nothing else decides
whether a task may move. Each state says who moves a task out of it:

========== ================================================================
WAITING    waits on ``depends_on``; the store moves it to PENDING when every
           upstream task succeeded (or, for a task declared
           ``on_upstream_failure="run"``, ended), or to CANCELED when one of
           them ended FAILED, TIMEOUT or CANCELED (the error names it).
PENDING    queued, runnable from ``run_at`` on (``delay=`` sets ``run_at``);
           a worker's claim moves it to RUNNING, ``cancel`` to CANCELED.
RETRYING   queued again after a retryable failure, runnable from ``run_at``
           (the backoff). Claimed like PENDING, but shown apart so operators
           see retries as their own path.
RUNNING    held by a worker under a lease, its body started. The worker
           completes it; the watchdog times it out; the sweeper recovers it
           when the lease is lost; a graceful shutdown hands it back to
           PENDING.
RESERVED   shown, never stored: a RUNNING row whose start is not recorded
           (prefetched ahead of a free slot, a chunk member waiting its turn,
           a relayed successor). It moves as RUNNING does; the worker records
           the start (``started_at``, the attempt) soon after the body starts,
           and a crash before then hands it back with its attempts intact.
SUCCESS    final. Never changes again.
FAILED     final, unless an operator retries it.
TIMEOUT    final (retries exhausted on timeouts), unless an operator retries it.
CANCELED   final, unless an operator retries it.
========== ================================================================
"""

from __future__ import annotations

import enum


class State(str, enum.Enum):
    WAITING = "WAITING"
    PENDING = "PENDING"
    RETRYING = "RETRYING"
    RUNNING = "RUNNING"
    RESERVED = "RESERVED"
    SUCCESS = "SUCCESS"
    FAILED = "FAILED"
    TIMEOUT = "TIMEOUT"
    CANCELED = "CANCELED"

    def __str__(self) -> str:  # pragma: no cover - cosmetic
        return self.value

    @property
    def final(self) -> bool:
        return self in FINAL

    @property
    def queued(self) -> bool:
        return self in QUEUED


WAITING, PENDING, RETRYING, RUNNING = State.WAITING, State.PENDING, State.RETRYING, State.RUNNING
SUCCESS, FAILED, TIMEOUT, CANCELED = State.SUCCESS, State.FAILED, State.TIMEOUT, State.CANCELED
RESERVED = State.RESERVED

#: States a worker may claim from (when ``run_at`` has come).
QUEUED: frozenset[State] = frozenset({PENDING, RETRYING})
#: States in which a task still occupies its place in its group.
ACTIVE: frozenset[State] = frozenset({WAITING, PENDING, RETRYING, RESERVED, RUNNING})
#: States a store keeps in its rows (RESERVED is derived when a task is read).
STORED: frozenset[State] = frozenset(State) - {RESERVED}
#: States a task ends in.
FINAL: frozenset[State] = frozenset({SUCCESS, FAILED, TIMEOUT, CANCELED})
#: The order states are shown in: queued, held, then how a task ended.
SHOWN_ORDER: tuple[State, ...] = (WAITING, PENDING, RETRYING, RESERVED, RUNNING, SUCCESS, FAILED, TIMEOUT, CANCELED)

#: (from, to) -> why. The only legal moves; everything else is refused.
TRANSITIONS: dict[tuple[State, State], str] = {
    (WAITING, PENDING): "every dependency succeeded",
    (WAITING, CANCELED): "canceled while waiting, or an upstream task ended FAILED, TIMEOUT or CANCELED",
    (PENDING, RUNNING): "claimed by a worker",
    (PENDING, CANCELED): "canceled before it ran",
    (RETRYING, RUNNING): "claimed by a worker for another attempt",
    (RETRYING, CANCELED): "canceled between attempts",
    (RUNNING, SUCCESS): "returned a result",
    (RUNNING, FAILED): "permanent error, or retries exhausted",
    (RUNNING, TIMEOUT): "the watchdog saw it overrun, retries exhausted",
    (RUNNING, CANCELED): "saw the cancel flag, or was killed for it",
    (RUNNING, RETRYING): "retryable error, timeout or lost lease with retries left",
    (RUNNING, PENDING): "handed back unfinished at shutdown (attempt not burned)",
    (FAILED, PENDING): "retried by an operator",
    (TIMEOUT, PENDING): "retried by an operator",
    (CANCELED, PENDING): "retried by an operator",
}


def shown(status: State, started_at: float | None) -> State:
    """The state a reader sees: a RUNNING row whose start is not recorded is RESERVED."""
    return RESERVED if status is RUNNING and started_at is None else status


def shown_counts(counts: dict[str, int]) -> dict[str, int]:
    """Counts per state with RESERVED taken out of RUNNING: ``counts`` holds
    every stored RUNNING row under RUNNING and the unstarted ones again under
    RESERVED (what a count query returns). States left at 0 are dropped."""
    reserved = counts.get(RESERVED.value, 0)
    if not reserved:
        counts.pop(RESERVED.value, None)
        return counts
    counts[RUNNING.value] = counts.get(RUNNING.value, 0) - reserved
    if counts[RUNNING.value] <= 0:
        del counts[RUNNING.value]
    return counts


def can_transition(src: State | str, dst: State | str) -> bool:
    # a State is a str equal to its value and hashed as it: the pair is looked
    # up as given (a completion checks every outcome; State() costs more)
    return (src, dst) in TRANSITIONS


def check_transition(src: State | str, dst: State | str) -> None:
    """Raise :class:`~corral.errors.IllegalTransition` unless ``src -> dst`` is legal."""
    from corral.errors import IllegalTransition

    if not can_transition(src, dst):
        raise IllegalTransition(f"illegal transition {State(src).value} -> {State(dst).value}")
