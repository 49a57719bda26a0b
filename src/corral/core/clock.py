"""Time, injected: one clock for the engine, the memory store, backoff and the sweeper.

Code that asks "what time is it" takes a :class:`Clock` instead of calling
:func:`time.time`, so tests move time by hand (``clock.advance(31)``) rather
than wait for a lease to expire. Durable stores keep their own clock for what
they write (PostgreSQL's ``now()``; SQLite's process clock, which a test may
replace with a :class:`FakeClock`).

Two readings, as in the standard library: :meth:`Clock.time` is wall-clock
epoch seconds (what is stored in rows), :meth:`Clock.monotonic` never goes
back (what deadlines inside one process use).
"""

from __future__ import annotations

import threading
import time as _time
from collections.abc import Callable
from typing import Protocol, runtime_checkable


@runtime_checkable
class Clock(Protocol):
    def time(self) -> float:
        """Wall-clock time in epoch seconds."""
        ...

    def monotonic(self) -> float:
        """Seconds on a clock that never goes back, for deadlines."""
        ...


class SystemClock:
    """The real clock."""

    __slots__ = ()

    def time(self) -> float:
        return _time.time()

    def monotonic(self) -> float:
        return _time.monotonic()

    def __repr__(self) -> str:
        return "SystemClock()"


#: The clock everything uses unless given another.
SYSTEM_CLOCK = SystemClock()


class FakeClock:
    """A clock that moves only when told to; both readings move together.

    Thread-safe: a test thread may advance it while worker threads read it.
    """

    def __init__(self, start: float = 1_700_000_000.0):
        self._lock = threading.Lock()
        self._wall = float(start)
        self._mono = 0.0

    def time(self) -> float:
        with self._lock:
            return self._wall

    def monotonic(self) -> float:
        with self._lock:
            return self._mono

    def advance(self, seconds: float) -> float:
        """Move time forward by ``seconds`` (never back); returns the new wall time."""
        if seconds < 0:
            raise ValueError("a clock does not go back; advance by 0 or more seconds")
        with self._lock:
            self._wall += seconds
            self._mono += seconds
            return self._wall

    def __repr__(self) -> str:
        return f"FakeClock(time={self._wall!r})"


def poll_until(
    predicate: Callable[[], bool],
    timeout: float | None,
    *,
    first: float = 0.0005,
    longest: float = 0.05,
    growth: float = 1.5,
) -> bool:
    """Call ``predicate`` until it is true or ``timeout`` (real seconds) runs out.

    The pause between calls starts at ``first`` and grows to ``longest``, so
    a quick answer is seen quickly and a long wait costs little. Returns the
    last answer. For waits on another process's work, where no event can be
    waited on."""
    end = None if timeout is None else _time.monotonic() + timeout
    delay = first
    while True:
        if predicate():
            return True
        if end is not None:
            left = end - _time.monotonic()
            if left <= 0:
                return False
            _time.sleep(min(delay, left))
        else:
            _time.sleep(delay)
        delay = min(longest, delay * growth)
