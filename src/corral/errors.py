"""Every error corral raises, in one tree.

::

    CorralError
    ├── ConfigError             bad option, bad store URL, unknown limit
    ├── SubmitError             nothing was stored
    │   ├── UnknownTask         no task registered under that name
    │   ├── BadArguments        arguments not JSON or too big, a submit option out of bounds
    │   ├── QueueFull           backpressure: the queue bound was hit
    │   └── AppClosed           submit after close()
    ├── StoreError              the store failed; driver errors are wrapped here
    │   ├── StoreUnavailable    cannot connect / parse the URL (may pass: retried)
    │   └── StoreCorrupt        not a corral store, damaged, too new, or not ours to
    │                           use: retrying cannot help, a worker stops on it
    ├── IllegalTransition       the state machine refuses the move
    ├── TaskNotFound            no task with that id
    ├── ResultTimeout           handle.result(timeout) ran out
    ├── TaskFailed              handle.result() on a task that ended badly
    ├── GroupDeadlock           a task waits on a task queued behind it in its own group
    ├── ChildFailed             a process-isolated task raised; its error travels as text
    └── TaskSignal              raised inside tasks, to steer what happens next
        ├── Retry               retry after ``after`` seconds (``ctx.retry``)
        ├── PermanentError      never retried
        └── Canceled            the task saw its cancel flag (``Cancelled`` is the same class)

Exceptions from a task's own code are retryable unless they are
``PermanentError`` or listed in the task's ``permanent_on`` (defaults include
``ValueError``/``TypeError``: bad input fails the same way every time), or the
task names ``retry_on`` and the exception is not among them.
"""

from __future__ import annotations

import math


class CorralError(Exception):
    """Base class of every corral error."""


class ConfigError(CorralError, ValueError):
    pass


class SubmitError(CorralError):
    pass


class UnknownTask(SubmitError, KeyError):
    def __str__(self) -> str:  # KeyError quotes its message; we don't want that
        return str(self.args[0]) if self.args else "unknown task"


class BadArguments(SubmitError, TypeError):
    pass


class QueueFull(SubmitError):
    pass


class AppClosed(SubmitError):
    pass


class StoreError(CorralError):
    pass


class StoreUnavailable(StoreError):
    pass


class StoreCorrupt(StoreError):
    """A permanent store failure: the file is not a database or is damaged,
    the schema is missing or newer than this corral, or access is denied.

    Transient failures (locked, busy, connection lost, pool timeout) stay
    plain :class:`StoreError`/:class:`StoreUnavailable` and are retried;
    this one is not, since every retry would fail the same way."""


class WorkerFailed(CorralError):
    """One of a worker's own threads (dispatcher, completer, heartbeat,
    watchdog) ended on an unexpected error. The worker stops claiming and
    ``corral worker`` exits 1, so that its supervisor starts a fresh process
    rather than keeping one that takes no work."""


class IllegalTransition(CorralError):
    pass


class TaskNotFound(CorralError, LookupError):
    pass


class ResultTimeout(CorralError, TimeoutError):
    pass


class TaskFailed(CorralError):
    """The task ended FAILED, TIMEOUT or CANCELED; ``state`` and ``error`` say how."""

    def __init__(self, task_id: int, state: str, error: str | None):
        super().__init__(f"task {task_id} ended {state}: {error or ''}".rstrip(": "))
        self.task_id = task_id
        self.state = state
        self.error = error


class GroupDeadlock(CorralError):
    pass


class ChildFailed(CorralError):
    """An exception raised in a child process, carried back as text.

    ``text`` is its traceback, ``error`` the exception's own lines (what a
    failed attempt's error says). The child decides whether it is retryable
    with the task's own ``retry_on``/``permanent_on``, since the exception
    object itself may not survive the trip."""

    def __init__(self, kind: str, text: str, retryable: bool, error: str | None = None):
        super().__init__(text.strip().splitlines()[-1] if text.strip() else kind)
        self.kind = kind
        self.text = text
        self.retryable = retryable
        self.error = error if error else str(self)


class TaskSignal(CorralError):
    """Base of the exceptions a task raises to steer its own outcome."""


class Retry(TaskSignal):
    """Raise (or call ``ctx.retry(after=...)``) to ask for another attempt."""

    def __init__(self, after: float | None = None, reason: str = "retry requested"):
        if after is not None:  # NaN or a negative pause would run the task again at once, unsaid
            after = _pause(after)
        super().__init__(reason)
        self.after = after


#: The longest pause a task may ask for: ten years (``corral.core.validation.MAX_DURATION``).
MAX_PAUSE = 10 * 365.25 * 86_400


def _pause(after: object) -> float:
    """``Retry(after=...)`` as :func:`corral.core.validation.seconds` checks
    a duration (written here: that module imports this one)."""
    rule = f">= 0 and at most {MAX_PAUSE:.0f} (ten years)"
    if isinstance(after, bool) or not isinstance(after, int | float):
        raise ConfigError(f"Retry(after=...) must be a number of seconds {rule}, not {repr(after)[:80]}")
    if not math.isfinite(after) or after < 0 or after > MAX_PAUSE:
        raise ConfigError(f"Retry(after=...) must be a finite number of seconds {rule}, not {after!r}")
    return float(after)


class PermanentError(TaskSignal):
    """Raise to fail a task at once: it will not be retried."""


class Canceled(TaskSignal):
    """Raised by ``ctx`` calls once the task's cancel flag is set."""


#: The earlier spelling, kept working.
Cancelled = Canceled
