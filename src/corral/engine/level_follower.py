"""Workers follow the fleet's degradation level (see :mod:`corral.core.levels`).

:class:`LevelHooks` reads the level from the store at most once a second
(cached), so every worker of the fleet follows a change within about a
second at the cost of one small read per second, never one per claim. It
turns the level into what the dispatcher may claim:

* NORMAL: everything; WARNING: claims of half the slots (the slots stay
  full: units are still held ahead, each claim ahead as small).
* DEGRADED: half the slots, and only critical work: tasks whose kind is
  marked ``@app.task(critical=True)`` or whose queue is in
  ``App(critical_queues=[...])``. When nothing is marked critical, all work
  counts as critical (the level then only halves the slots): pausing
  everything is what EMERGENCY is for.
* CIRCUIT_OPEN: only retries (fresh work waits, nothing burns an attempt).
* EMERGENCY: nothing until an operator sets another level.

When the store cannot be read the last level seen is kept: an outage of the
store must not change what the fleet runs.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection

from corral.core import validation as check
from corral.core.levels import HANDED_BACK, Level, dispatch_at
from corral.core.model import dumps
from corral.engine.hooks import DispatchPolicy, Hooks, Lane
from corral.errors import ConfigError, StoreError
from corral.stores.base import FleetLevel, Store

log = logging.getLogger("corral.levels")

#: How long a worker trusts the level it read (seconds of real time).
REFRESH = 1.0


class LevelHooks(Hooks):
    """Claim what the fleet's level allows (see the module docstring)."""

    def __init__(
        self,
        store: Store,
        concurrency: int,
        *,
        critical_names: Collection[str] = (),
        critical_queues: Collection[str] = (),
        refresh: float = REFRESH,
        monotonic: Callable[[], float] = time.monotonic,
    ):
        self.store = store
        self.concurrency = concurrency
        self.refresh = refresh
        self._monotonic = monotonic
        lanes = []
        if critical_queues:
            lanes.append(Lane(queues=frozenset(critical_queues)))
        if critical_names:
            lanes.append(Lane(names=frozenset(critical_names)))
        #: what DEGRADED still claims (None: everything, nothing being marked critical)
        self.critical_lanes: tuple[Lane, ...] | None = tuple(lanes) or None
        self._lock = threading.Lock()
        self._level = Level.NORMAL
        self._read_at: float | None = None

    def level(self) -> Level:
        """The fleet's level, read from the store at most every ``refresh`` seconds."""
        now = self._monotonic()
        with self._lock:
            if self._read_at is not None and now - self._read_at < self.refresh:
                return self._level
            self._read_at = now
        try:
            stored = self.store.fleet_level()
            level = Level(stored.level)
        except (StoreError, ValueError) as exc:  # keep steering by the last level seen
            log.warning("cannot read the fleet level, keeping %s: %s", self._level.name, exc)
            return self._level
        with self._lock:
            before, self._level = self._level, level
        if level != before:
            reason = f": {stored.reason}" if stored.reason else ""
            log.log(
                logging.WARNING if level > Level.NORMAL else logging.INFO,
                "fleet level %s -> %s%s",
                before.name,
                level.name,
                reason,
            )
        return level

    def dispatch(self) -> DispatchPolicy:
        level = self.level()
        d = dispatch_at(level, self.concurrency)
        if d.max_units is None:
            return DispatchPolicy(None)
        return DispatchPolicy(
            d.max_units,
            slots=d.slots if d.slots < self.concurrency else None,
            only_retries=d.only_retries,
            lanes=self.critical_lanes if d.only_critical else None,
        )

    def dispatch_budget(self) -> int | None:
        return self.dispatch().max_units


def set_level(store: Store, level: str | int | Level, *, reason: str = "") -> Level:
    """Set the fleet's level by hand, or hand it back with ``"auto"`` (see
    :meth:`corral.App.set_level`); the change and its reason go to the event log.

    Handing back keeps the level until the sweeper leader's next evaluation,
    which sets what the signals call for at once (:data:`HANDED_BACK`):
    stepping down from EMERGENCY one calm period at a time would keep a
    healthy fleet idle for many minutes."""
    if not isinstance(reason, str):
        raise ConfigError(f"reason must be text, not {check.shown(reason)}")
    cur = store.fleet_level()
    if isinstance(level, str) and level.strip().lower() == "auto":
        new = FleetLevel(cur.level, False, HANDED_BACK, reason or "handed back to the automatic rules")
    else:
        try:
            lv = Level.parse(level)
        except ValueError as exc:
            raise ConfigError(f"{exc}, or auto") from None
        new = FleetLevel(int(lv), True, None, reason or "set by hand")
    event = {"from": Level(cur.level).name, "to": Level(new.level).name, "reason": new.reason, "manual": new.manual}
    store.set_fleet_level(new, auto=False, event=dumps(event))
    return Level(new.level)
