"""The periodic loop: enqueue each schedule's ticks, once across the fleet.

The sweeper's skeleton (a timer and one bounded store call per step), with
no leader: every worker runs one, and the store's unique (schedule, tick)
row lets exactly one of them enqueue each tick (``Store.fire_tick``). So a
tick is not lost when a worker dies, and never enqueued twice when several
are alive.

The check is cheap: between ticks it only compares the clock with the next
tick it computed; the store is asked only once a tick is due. Time comes from
the worker's :class:`~corral.core.clock.Clock`, so a test moves cron with a
:class:`~corral.core.clock.FakeClock`; the pause between checks is real time.

One machine's clock does not own the fleet's ticks: the store refuses a tick
ahead of its own clock (:data:`~corral.core.cron.MAX_CLOCK_AHEAD`, EARLY), so
a worker whose clock runs ahead cannot take ticks that have not come. Refused
once, the loop reads the store's time and from then on runs that far behind
its own clock (read again at each visit of the store, so a clock put right
is followed), firing ticks on time as the rest of the fleet does.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence

from corral.core.clock import SYSTEM_CLOCK, Clock
from corral.core.cron import EARLY, MAX_TICKS_PER_CHECK, SKIPPED, Schedule, TickResult, due_ticks
from corral.errors import ConfigError
from corral.maintenance.loop import Loop
from corral.stores.base import Store

log = logging.getLogger("corral.periodic")

#: Seconds between two checks of the clock (real time).
DEFAULT_INTERVAL = 1.0


class Scheduler(Loop):
    """Enqueue the ticks of ``schedules`` into ``store`` as they come."""

    def __init__(
        self,
        store: Store,
        schedules: Sequence[Schedule],
        *,
        clock: Clock = SYSTEM_CLOCK,
        interval: float = DEFAULT_INTERVAL,
    ):
        if interval <= 0:
            raise ConfigError("the periodic check interval must be > 0 seconds")
        names = [s.name for s in schedules]
        if len(set(names)) != len(names):
            raise ConfigError("two schedules share a name")
        self.store = store
        self.schedules = list(schedules)
        self.clock = clock
        self.interval = float(interval)
        #: what this process's checks did, by outcome (ENQUEUED, SKIPPED, TAKEN)
        self.counts: dict[str, int] = {}
        self._saved = False
        self._last_check: float | None = None
        self._cursor: dict[str, float] = {}  # newest tick decided here, per schedule
        self._next: dict[str, float] = {}  # when to look at the store again, per schedule
        #: seconds added to the clock (<= 0): how far it ran ahead of the store's when a tick was refused
        self.offset = 0.0
        super().__init__()

    thread_name = "corral-periodic"
    what = "periodic check"
    log = log

    def step(self) -> list[tuple[str, int, TickResult]]:
        return self.check()

    def _now(self) -> float:
        return self.clock.time() + self.offset

    def _follow_store(self) -> float:
        """Read the store's time; keep the offset for a clock ahead of it (never for one behind)."""
        ahead = self.clock.time() - self.store.now()
        before, self.offset = self.offset, -ahead if ahead > 0 else 0.0
        if abs(self.offset - before) > 1.0:
            if self.offset:
                log.warning(
                    "periodic: this worker's clock is %.0f s ahead of the store's; its ticks follow the store's time",
                    -self.offset,
                )
            else:
                log.info("periodic: this worker's clock agrees with the store's again")
        return self._now()

    def check(self) -> list[tuple[str, int, TickResult]]:
        """One check: enqueue what is due now; returns (schedule, tick, result) per tick tried."""
        now = self._now()
        if not self._saved:
            self.store.save_schedules(self.schedules, now)
            self._saved = True
            self._last_check = now
        last_check = self._last_check if self._last_check is not None else now
        due = [s for s in self.schedules if self._next.get(s.name, float("-inf")) <= now]
        out: list[tuple[str, int, TickResult]] = []
        if due:
            if self.offset:  # the clock was found ahead: the store's time again, in case it was put right
                now = self._follow_store()
                due = [s for s in self.schedules if self._next.get(s.name, float("-inf")) <= now]
            stored = {st.name: st for st in self.store.schedules()}
            for sch in due:
                st = stored.get(sch.name)
                since = max(
                    st.created_at if st is not None else now,
                    st.last_tick if st is not None and st.last_tick is not None else float("-inf"),
                    self._cursor.get(sch.name, float("-inf")),
                )
                ticks = due_ticks(sch, since, now, last_check=last_check)
                early = False
                for i, tick in enumerate(ticks):
                    result = self.store.fire_tick(sch, tick)
                    self.counts[result.outcome] = self.counts.get(result.outcome, 0) + 1
                    out.append((sch.name, tick, result))
                    if result.outcome == EARLY:  # this clock runs ahead: the later ticks are later still
                        early = True
                        ticks = ticks[:i]
                        break
                    if result.outcome == SKIPPED:
                        log.info("periodic %s: tick %d skipped, its previous run is still going", sch.name, tick)
                        self._note_skip(sch.name, tick)
                    if result.task_id is not None:
                        log.debug("periodic %s: tick %d enqueued task %d", sch.name, tick, result.task_id)
                # nothing due here again before the next tick after what was decided
                if ticks:
                    self._cursor[sch.name] = ticks[-1]
                if early:  # look again at the next check, on the store's time
                    self._next[sch.name] = float("-inf")
                    now = self._follow_store()
                    last_check = min(last_check, now)
                elif len(ticks) >= MAX_TICKS_PER_CHECK:
                    self._next[sch.name] = now  # a backlog (catch_up="all"): go on at the next check
                else:
                    self._next[sch.name] = sch.next_after(now)
        self._last_check = min(now, self._now())
        return out

    def _note_skip(self, name: str, tick: int) -> None:
        """A ``periodic`` event for the skip (the tick's row already says it; this is for the event stream)."""
        try:
            self.store.add_event("periodic", name, json.dumps({"tick": tick, "outcome": SKIPPED}))
        except Exception as exc:  # noqa: BLE001 - the skip is stored; the event is a courtesy
            log.debug("periodic %s: could not log the skip: %s", name, exc)
