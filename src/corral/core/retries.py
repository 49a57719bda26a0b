"""Retry policy: which errors retry, and after how long. Pure functions.

Exponential backoff with random jitter so that thousands of
failed tasks do not wake in the same millisecond, and a split between errors
worth retrying (timeouts, dropped connections, 429/503) and errors that will
fail again the same way (validation, bad arguments, 401).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from corral.core.validation import MAX_DURATION, seconds
from corral.errors import PermanentError, Retry

#: How many times a task may ask to run later (``Retry``, a 429 with
#: Retry-After under a limit) before it fails: a snooze burns no attempt, so
#: without a cap a task that always snoozes would never end.
MAX_SNOOZES = 100

#: HTTP statuses that say "try again later".
RETRYABLE_STATUS = frozenset({408, 425, 429, 500, 502, 503, 504})
#: Exceptions that are bugs or bad input: retrying cannot help.
DEFAULT_PERMANENT: tuple[type[BaseException], ...] = (
    PermanentError,
    ValueError,
    TypeError,
    KeyError,
    AttributeError,
    NotImplementedError,
)


@dataclass(frozen=True, slots=True)
class Backoff:
    """``base * factor**(attempt-1)``, capped, plus up to ``jitter`` of itself at random."""

    base: float = 1.0
    factor: float = 2.0
    cap: float = 300.0
    jitter: float = 0.5

    def __post_init__(self) -> None:
        for name in ("base", "factor", "cap", "jitter"):
            seconds(getattr(self, name), f"Backoff {name}", zero_ok=True)

    def delay(self, attempt: int, rng: random.Random | None = None) -> float:
        try:
            raw = min(self.cap, self.base * self.factor ** max(0, attempt - 1))
        except OverflowError:  # thousands of retries: the power leaves float range, the cap holds
            raw = self.cap
        return raw + (rng or random).uniform(0.0, raw * self.jitter)


def http_status(exc: BaseException) -> int | None:
    for attr in ("status_code", "status"):
        value = getattr(exc, attr, None)
        if isinstance(value, int):
            return value
    response = getattr(exc, "response", None)
    value = getattr(response, "status_code", None)
    return value if isinstance(value, int) else None


def is_retryable(
    exc: BaseException,
    retry_on: tuple[type[BaseException], ...] | None = None,
    permanent_on: tuple[type[BaseException], ...] = DEFAULT_PERMANENT,
) -> bool:
    """Decide whether ``exc`` deserves another attempt.

    Order: explicit ``Retry`` and ``PermanentError`` win; then an HTTP-like
    status on the exception; then ``retry_on`` if the task names it (only
    those retry); then ``permanent_on``; anything else retries.
    """
    if isinstance(exc, Retry):
        return True
    if isinstance(exc, PermanentError):
        return False
    status = http_status(exc)
    if status is not None:
        return status in RETRYABLE_STATUS
    if retry_on is not None:
        return isinstance(exc, retry_on)
    return not isinstance(exc, permanent_on)


def retry_delay(exc: BaseException, attempt: int, backoff: Backoff, rng: random.Random | None = None) -> float:
    """Seconds to wait before the next attempt; ``Retry(after=...)`` overrides."""
    if isinstance(exc, Retry) and exc.after is not None:
        after = float(exc.after)
        return min(MAX_DURATION, after) if after > 0 else 0.0  # NaN waits not at all
    return backoff.delay(attempt, rng)
