"""Tools for testing code that runs on corral, and corral itself.

- :class:`FakeClock`, :func:`run_until_idle`, :func:`assert_enqueued`: test
  your own tasks in process, with time moved by hand (``corral.testing.kit``);
  :func:`fire_ticks` enqueues the periodic ticks due on that clock.
- :class:`History`: check that every group ran one task at a time, in submit
  order, and that no task overlapped itself (``corral.testing.history``).
- ``corral.testing.limits_sim``: a fleet calling a simulated partner under one
  limit, on simulated time, to test the adaptive limit controller.
"""

from corral.testing.history import History, HistoryLog, Run, Violation
from corral.testing.kit import FakeClock, assert_enqueued, enqueued, fire_ticks, run_until_idle

__all__ = [
    "FakeClock",
    "History",
    "HistoryLog",
    "Run",
    "Violation",
    "assert_enqueued",
    "enqueued",
    "fire_ticks",
    "run_until_idle",
]
