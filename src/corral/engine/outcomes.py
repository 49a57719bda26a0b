"""What an attempt's end means for its task: the outcome, and its log line.

Functions, not a thread: the slot that ran the body classifies what it
raised (:func:`failure`), the watchdog an attempt that ran out of time
(:func:`timed_out`). An error with retries left is RETRYING after its
backoff; a :class:`~corral.errors.Retry` or a 429 with Retry-After under a
limit is a *snooze* (run again later, no failure counted); anything else,
or no retries left, is FAILED (TIMEOUT for a timeout).
"""

from __future__ import annotations

import logging
import traceback
from collections.abc import Callable

from corral.core import texts
from corral.core.breaker import counts_as_failure
from corral.core.model import Outcome, TaskRecord
from corral.core.retries import MAX_SNOOZES, Backoff, http_status, is_retryable, retry_delay
from corral.core.retry_after import retry_after
from corral.core.states import State
from corral.engine.logs import task_fields
from corral.engine.registry import TaskSpec
from corral.errors import ChildFailed, Retry

log = logging.getLogger("corral.worker")

#: The level of the line a finished attempt writes.
LEVELS = {
    State.SUCCESS: logging.DEBUG,
    State.RETRYING: logging.INFO,
    State.PENDING: logging.INFO,
    State.CANCELED: logging.INFO,
    State.FAILED: logging.WARNING,
    State.TIMEOUT: logging.WARNING,
}

#: The store's time, read only when an outcome needs it (a retry's due time).
Now = Callable[[], float]


def error_line(text: str | None) -> str:
    """The last line of an error's text (its message, below any context)."""
    lines = [ln for ln in (text or "").strip().splitlines() if ln.strip()]
    return lines[-1].strip() if lines else "-"


def log_outcome(rec: TaskRecord, outcome: Outcome) -> None:
    """One line per finished attempt at the level it deserves (a success
    only at DEBUG: a busy worker writes nothing per task by default)."""
    status = outcome.status
    level = LEVELS.get(status, logging.INFO)
    if not log.isEnabledFor(level):
        return
    # a failed attempt's traceback (bounded) below its line
    tb = f"\n{outcome.traceback}" if outcome.traceback else ""
    if status is State.SUCCESS:
        log.log(level, "task %s (%s) succeeded", rec.id, rec.name, extra=task_fields(rec))
    elif status is State.RETRYING:
        log.log(
            level,
            "task %s (%s) will run again: %s%s",
            rec.id,
            rec.name,
            error_line(outcome.error),
            tb,
            extra=task_fields(rec),
        )
    else:
        log.log(
            level,
            "task %s (%s) ended %s: %s%s",
            rec.id,
            rec.name,
            status.value,
            error_line(outcome.error),
            tb,
            extra=task_fields(rec),
        )


def failure(
    rec: TaskRecord, token: str, exc: BaseException, tdef: TaskSpec | None, started_at: float, now: Now
) -> Outcome:
    """The outcome of an attempt that raised ``exc``: a snooze, a retry
    after its backoff, or FAILED."""
    snoozed = snooze(rec, token, exc, started_at, now)
    if snoozed is not None:
        return snoozed
    if isinstance(exc, ChildFailed):
        retryable, text = exc.retryable, exc.error
    else:
        retryable = tdef is not None and is_retryable(exc, tdef.retry_on, tdef.permanent_on)
        text = "".join(traceback.format_exception_only(type(exc), exc)).strip()
    verdict = counts_as_failure(exc, permanent=not retryable)
    if tdef is not None and retryable and rec.attempt <= rec.max_retries:
        delay = retry_delay(exc, rec.attempt, tdef.backoff)
        outcome = retry_later(rec, token, text, now() + delay, started_at, verdict)
    else:
        if retryable and rec.max_retries:
            text = f"{text} (gave up after {rec.attempt} attempts)"
        outcome = Outcome(
            rec.id, token, rec.version, State.FAILED, error=text, started_at=started_at, breaker_failure=verdict
        )
    outcome.traceback = texts.traceback_of(exc)
    return outcome


def retry_later(
    rec: TaskRecord, token: str, error: str, run_at: float, started_at: float, breaker_failure: bool
) -> Outcome:
    """A failed attempt with retries left: RETRYING, due at ``run_at``."""
    return Outcome(
        rec.id,
        token,
        rec.version,
        State.RETRYING,
        error=error,
        run_at=run_at,
        started_at=started_at,
        breaker_failure=breaker_failure,
    )


def snooze(rec: TaskRecord, token: str, exc: BaseException, started_at: float, now: Now) -> Outcome | None:
    """``Retry`` (and a 429 with Retry-After under a limit) runs the task
    again later without counting a failure: the attempt is given back and a
    snooze counted, up to MAX_SNOOZES. A 429 also pauses the task's limits
    fleet-wide for as long as the downstream asked."""
    pause = None
    if isinstance(exc, Retry):
        at = now()
        after = retry_delay(exc, rec.snoozes + 1, Backoff())  # no ``after``: a growing pause
        reason = str(exc)
    elif rec.limits and http_status(exc) == 429:
        at = now()
        ra = retry_after(exc, at)
        if ra is None:
            return None
        after = pause = ra
        reason = f"429 from downstream: retry after {ra:g}s"
    else:
        return None
    if rec.snoozes >= MAX_SNOOZES:
        text = f"asked to run later {rec.snoozes} times, the most a task may (last: {reason})"
        return Outcome(rec.id, token, rec.version, State.FAILED, error=text, started_at=started_at)
    return Outcome(
        rec.id,
        token,
        rec.version,
        State.RETRYING,
        error=reason,
        run_at=at + after,
        started_at=started_at,
        snooze=True,
        pause_limits=pause,
    )


def timed_out(rec: TaskRecord, token: str, tdef: TaskSpec | None, started_at: float, now: Now) -> Outcome:
    """An attempt that ran out of time: a retry after its backoff, or TIMEOUT."""
    text = f"timed out after {rec.timeout:g}s (attempt {rec.attempt})"
    if rec.attempt <= rec.max_retries:
        delay = tdef.backoff.delay(rec.attempt) if tdef else 1.0
        return retry_later(rec, token, text, now() + delay, started_at, True)
    return Outcome(rec.id, token, rec.version, State.TIMEOUT, error=text, started_at=started_at, breaker_failure=True)
