"""The level keeper: the sweeper leader's step that sets the fleet's level.

After each sweep the leader reads the health signals, asks
:func:`corral.core.levels.target_level` what they call for, and moves the
stored level by :func:`corral.core.levels.step` (up at once, down one level
per calm period; a level set by hand is left alone, and one just handed back
goes straight to what the signals call for). Every
change is written with an event saying why, in one transaction. It also
trims the event log, so the log stays small without anyone minding it.

Signals, each a bounded read:

* failing kinds: task names whose newest outcomes in ``window`` are
  ``in_a_row`` failures with no success after them (``Store.failing_kinds``,
  from the dead-letter index);
* open breakers: circuit breakers now OPEN (``Store.breakers``; a breaker
  letting its probes through is HALF_OPEN and not counted);
* queue depth against ``queue_bound`` (``App(max_queued=)``), from the
  partial indexes behind ``Store.active_counts``;
* leases lost per minute, from the sweeps' own reports (lost leases are
  what a crashed or hung worker leaves behind).
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections import deque
from collections.abc import Callable

from corral.core.breaker import BreakerState
from corral.core.levels import Level, LevelState, Signals, Thresholds, step, target_level
from corral.core.model import SweepReport
from corral.core.states import State
from corral.stores.base import FleetLevel, Store

log = logging.getLogger("corral.levels")

#: Events kept: the newest this many, none older than ``EVENTS_MAX_AGE`` (the
#: stream holds every task's state changes: a few events per task).
EVENTS_KEEP = 100_000
EVENTS_MAX_AGE = 86400.0
#: Events deleted per statement, and statements per sweep at most: short
#: writes between which workers' claims and completions go on.
TRIM_BATCH = 5_000
TRIM_ROUNDS = 50


class LevelKeeper:
    """Compute and store the fleet level; :meth:`tick` runs after each sweep."""

    def __init__(
        self,
        store: Store,
        *,
        thresholds: Thresholds | None = None,
        calm_period: float | None = None,
        queue_bound: int | None = None,
        open_breakers: Callable[[], int] | None = None,
        window: float = 300.0,
        in_a_row: int = 3,
        events_keep: int | None = None,
        events_max_age: float | None = None,
    ):
        self.store = store
        self.thresholds = thresholds or Thresholds()
        if calm_period is not None:  # the pace of a step down (App(level_calm_period=))
            self.thresholds = dataclasses.replace(self.thresholds, calm_period=float(calm_period))
        self.queue_bound = queue_bound
        #: Where the count of open circuit breakers comes from (default: the
        #: breakers kept in the store that are OPEN).
        self.open_breakers = open_breakers or self._open_breakers
        self.window = window
        self.in_a_row = in_a_row
        # the module's values when built (a bench may shrink them for a short run)
        self.events_keep = EVENTS_KEEP if events_keep is None else events_keep
        self.events_max_age = EVENTS_MAX_AGE if events_max_age is None else events_max_age
        self._losses: deque[tuple[float, int]] = deque()  # (at, leases lost) per sweep

    def _open_breakers(self) -> int:
        return sum(1 for _, b in self.store.breakers().values() if b.state is BreakerState.OPEN)

    def signals(self, now: float, report: SweepReport | None = None) -> Signals:
        if report is not None:
            self._losses.append((now, len(report.lost_leases_retried) + len(report.lost_leases_failed)))
        while self._losses:
            at, _ = self._losses[0]
            if at >= now - self.window:
                break
            self._losses.popleft()
        depth = 0
        if self.queue_bound is not None:
            counts = self.store.active_counts()
            depth = sum(counts.get(s.value, 0) for s in (State.PENDING, State.RETRYING, State.WAITING))
        return Signals(
            failing_kinds=len(self.store.failing_kinds(now - self.window, self.in_a_row)),
            open_breakers=self.open_breakers(),
            queue_depth=depth,
            queue_bound=self.queue_bound,
            lease_losses_per_min=sum(n for _, n in self._losses) / (self.window / 60.0),
        )

    def trim(self, now: float) -> int:
        """Trim the event stream to its retention, a batch per statement."""
        gone = 0
        for _ in range(TRIM_ROUNDS):
            n = self.store.trim_events(self.events_keep, now - self.events_max_age, limit=TRIM_BATCH)
            gone += n
            if n < TRIM_BATCH:
                break
        return gone

    def tick(self, report: SweepReport | None = None) -> FleetLevel:
        """One step: read the signals, move the level, trim the event log."""
        now = self.store.now()
        signals = self.signals(now, report)
        stored = self.store.fleet_level()
        cur = LevelState(Level(stored.level), stored.manual, stored.calm_since, stored.reason)
        target = target_level(signals, self.thresholds)
        nxt = step(cur, target, now, self.thresholds)
        if nxt != cur:
            event = None
            if nxt.level != cur.level:
                event = json.dumps(
                    {
                        "from": cur.level.name,
                        "to": nxt.level.name,
                        "reason": nxt.reason,
                        "manual": False,
                        "signals": dataclasses.asdict(signals),
                    }
                )
            new = FleetLevel(int(nxt.level), False, nxt.calm_since, nxt.reason)
            if self.store.set_fleet_level(new, auto=True, event=event) and event is not None:
                log.log(
                    logging.WARNING if nxt.level > cur.level else logging.INFO,
                    "fleet level %s -> %s: %s (%s)",
                    cur.level.name,
                    nxt.level.name,
                    nxt.reason,
                    describe(signals),
                )
        self.trim(now)
        return self.store.fleet_level()


def describe(s: Signals) -> str:
    """The signals as one short line."""
    depth = f"{s.queue_depth}/{s.queue_bound}" if s.queue_bound is not None else "unbounded"
    return (
        f"failing kinds {s.failing_kinds}, open breakers {s.open_breakers}, queue {depth},"
        f" leases lost {s.lease_losses_per_min:g}/min"
    )
