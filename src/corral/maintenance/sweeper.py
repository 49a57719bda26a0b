"""The sweeper loop: recover what crashed workers left behind.

One skeleton, like every maintenance loop: options, a timer, a leader check,
and bounded store calls per tick. Each tick the sweeper asks the store to
lead (``store.try_lead("sweeper", holder, ttl)``). The holder recovers lost
leases and ends the queued tasks past their deadline (``expires=``) that no
claim met every tick and, at most every ``chores_every`` seconds (30 by
default), does the chores that must run once across the fleet and are not
urgent: stale pending tasks, dependents a crash left unsettled, batch
callbacks, (with ``levels``) the fleet's level and the event log's trim, and
(with ``retention``) the deletion of old finished tasks. After recovering
leases it forgets the rows of dead worker processes that hold nothing any
more (silent for ``forget_workers_after``), so ``corral workers`` lists a
dead worker, with what it held, until its leases were taken back.

Every other sweeper is a backstop for the one rule that blocks groups: it
recovers leases that expired ``backstop`` seconds ago (two intervals by
default) and are still RUNNING, which a live leader would have swept by
then. So a dead worker's groups move on within about a lease and an interval
whoever died (the leader too, or a leader sweeping at a slower pace), while a
live leader's reports still see every lost lease (the level's signal).
Leadership lasts two intervals, so a dead leader's chores pass to another
worker within about three. After an outage seen in this process, no sweeper
takes leases that ran out until the store has been reachable for a lease's
length (see :meth:`Sweeper.leases_due`).

Run it inside the workers (the default of ``corral worker``, ``App.run`` and
``App.start``), so a dead worker's group moves on without anyone remembering
to start a sweeper, and if you like also as its own process
(``corral sweep --loop``), which is not killed with the workers it cleans up
after. Every change is a guarded write, so even two sweepers racing change
each row at most once.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from corral.core.model import DEFAULT_LEASE_SECONDS, SweepReport, new_holder_id
from corral.errors import ConfigError, StoreUnavailable
from corral.maintenance.loop import Loop
from corral.maintenance.minute_recorder import MinuteRecorder
from corral.maintenance.recovery import (
    DEFAULT_MAX_ROWS,
    DEFAULT_STALE_PENDING_AGE,
    expire_queued,
    recover_lost_leases,
    sweep_once,
)
from corral.stores.base import Store

if TYPE_CHECKING:
    from corral.maintenance.level_keeper import LevelKeeper
    from corral.maintenance.retention import Retention

log = logging.getLogger("corral.sweeper")

ROLE = "sweeper"
#: Seconds between sweeps unless told. With the default 30 s lease, a killed
#: worker's tasks run again within the lease and about one interval.
DEFAULT_SWEEP_INTERVAL = 5.0
#: The leader's chores other than lost leases run at least this far apart.
CHORES_EVERY = 30.0
#: A worker process's row silent this long, holding no task, is forgotten (its
#: worker died or was stopped without a word); until then it is shown dead.
FORGET_WORKERS_AFTER = 60.0


class Sweeper(Loop):
    """Sweep ``store`` every ``interval`` seconds while this process leads."""

    def __init__(
        self,
        store: Store,
        *,
        interval: float = DEFAULT_SWEEP_INTERVAL,
        stale_pending_age: float | None = DEFAULT_STALE_PENDING_AGE,
        max_rows: int = DEFAULT_MAX_ROWS,
        holder: str | None = None,
        on_report: Callable[[SweepReport], None] | None = None,
        levels: LevelKeeper | None = None,
        retention: Retention | None = None,
        outage_grace: float = DEFAULT_LEASE_SECONDS,
        backstop: float | None = None,
        chores_every: float | None = None,
        forget_workers_after: float = FORGET_WORKERS_AFTER,
    ):
        if interval <= 0:
            raise ConfigError("the sweep interval must be > 0 seconds")
        if max_rows < 1:
            raise ConfigError("max_rows must be at least 1")
        self.store = store
        self.interval = float(interval)
        self.stale_pending_age = stale_pending_age
        self.max_rows = max_rows
        self.holder = holder or new_holder_id()
        self.on_report = on_report
        #: the leader's next step after each sweep: the fleet's degradation level
        self.levels = levels
        #: and the deletion of old finished tasks (None: none)
        self.retention = retention
        #: Leadership lasts two intervals, so one slow tick does not lose it
        #: and a dead leader is replaced within about three.
        self.lead_ttl = self.interval * 2
        #: A sweeper that does not lead recovers leases expired this long ago
        #: (default two intervals): what a live leader would have swept by then.
        self.backstop = self.interval * 2 if backstop is None else max(0.0, float(backstop))
        #: tasks the backstop recovered (while another sweeper led)
        self.backstop_recovered = 0
        #: The leader's other chores (stale pending, unsettled dependents,
        #: batch callbacks, the level, the event trim, retention) run at most
        #: this often (default: every interval, and at least 30 s apart): they
        #: are what a sweep costs the database, and nothing in them is urgent.
        self.chores_every = max(self.interval, CHORES_EVERY) if chores_every is None else float(chores_every)
        self._chores_at: float | None = None
        self.forget_workers_after = float(forget_workers_after)
        #: each minute's figures, written by the leader (the Over time page's)
        self.minutes = MinuteRecorder(store)
        self._unreported = SweepReport()
        self.is_leader = False
        self.ticks = 0
        #: After the store was unreachable (a tick of this sweeper failed, or
        #: any call of this process), leases that ran out are left to their
        #: workers for this long (a lease's length) of good health: they renew
        #: them and write the outcomes they hold, rather than see finished
        #: work run again.
        self.outage_grace = float(outage_grace)
        self._outage_at: float | None = None
        self._holding_off = False
        super().__init__()

    thread_name = "corral-sweeper"
    what = "sweep"
    log = log

    def step(self) -> SweepReport | None:
        try:
            return self.tick()
        except StoreUnavailable:
            self._outage_at = time.monotonic()
            raise

    def leases_due(self) -> bool:
        """May a sweep take the leases that ran out? Not until the store has
        been reachable for :attr:`outage_grace` since the last outage seen here."""
        seen = [t for t in (self._outage_at, self.store.last_outage()) if t is not None]
        healthy = time.monotonic() - max(seen) if seen else None
        due = healthy is None or healthy >= self.outage_grace
        if not due and not self._holding_off:
            log.info(
                "sweeper %s: the store was unreachable %.1fs ago; leases that ran out are left to their"
                " workers until it has been reachable for %gs",
                self.holder,
                healthy,
                self.outage_grace,
            )
        self._holding_off = not due
        return due

    def tick(self) -> SweepReport | None:
        """One pass: take or renew the lead, then one bounded sweep.

        Returns the report, or None when another process leads (this one
        then only recovers leases the leader left expired, see ``backstop``)."""
        self.ticks += 1
        leading = self.store.try_lead(ROLE, self.holder, self.lead_ttl)
        if leading != self.is_leader:
            log.info("sweeper %s %s the lead", self.holder, "took" if leading else "lost")
            self.is_leader = leading
        due = self.leases_due()
        if not leading:
            if due:
                late = recover_lost_leases(self.store, expired_for=self.backstop, max_rows=self.max_rows)
                if late.total:
                    self.backstop_recovered += late.total
                    log.warning(
                        "sweeper %s recovered %d task(s) whose lease expired over %gs ago, unswept by the leader: %s",
                        self.holder,
                        late.total,
                        self.backstop,
                        describe(late),
                    )
            return None
        now = time.monotonic()
        chores = self._chores_at is None or now - self._chores_at >= self.chores_every
        if chores:
            self._chores_at = now
            report = sweep_once(
                self.store, stale_pending_age=self.stale_pending_age, max_rows=self.max_rows, rescue_leases=due
            )
        else:  # between the chores, only the rule that blocks groups
            report = recover_lost_leases(self.store, max_rows=self.max_rows) if due else SweepReport()
        # every tick: a task past its deadline holds its group's line until it is ended
        report.expired_canceled = expire_queued(self.store, max_rows=self.max_rows).expired_canceled
        if report.total:
            log.warning("sweeper recovered %d task(s): %s", report.total, describe(report))
        if due:
            self._forget_workers()
        for f in report.__dataclass_fields__:  # the level's signal counts every tick's losses
            getattr(self._unreported, f).extend(getattr(report, f))
        if chores:
            try:  # a batch whose last task ended outside a worker (cancel, sweep) gets its callback here
                settled = self.store.settle_batches(None, limit=self.max_rows)
            except NotImplementedError:
                settled = []
            if settled:
                log.info("sweeper submitted %d batch callback(s)", len(settled))
            self._forget_keys()
        if self.on_report is not None:
            self.on_report(report)
        if chores:
            seen, self._unreported = self._unreported, SweepReport()
            if self.levels is not None:
                self.levels.tick(seen)
            self.after_sweep()
        return report

    def _forget_workers(self) -> None:
        """Clear the rows of dead workers whose leases were taken back."""
        try:
            gone = self.store.forget_workers(self.store.now() - self.forget_workers_after)
        except NotImplementedError:
            return
        if gone:
            log.info("sweeper forgot %d dead worker(s) that held nothing any more", gone)

    def _forget_keys(self) -> None:
        """Delete a bounded batch of keyed limits' key rows that are at rest
        (bucket full, window empty, no pause): no row per key kept for ever."""
        try:
            gone = self.store.forget_keys(self.max_rows)
        except NotImplementedError:
            return
        except Exception as exc:  # noqa: BLE001 - tried again at the next pass
            log.warning("forgetting idle keys failed, will try again: %s", exc)
            return
        if gone:
            log.debug("sweeper forgot %d idle key(s) of keyed limits", gone)

    def after_sweep(self) -> None:
        """The leader's housekeeping after its sweep: the minutes' figures,
        then retention, if any. A failure here is logged and does not undo the sweep."""
        try:
            self.minutes.tick()
        except NotImplementedError:
            pass
        except Exception as exc:  # noqa: BLE001 - retried at the next tick
            log.warning("recording the minutes' figures failed, will try again: %s", exc)
        if self.retention is None:
            return
        try:
            self.retention.tick()
        except Exception as exc:  # noqa: BLE001 - retried at the next tick
            log.warning("retention failed, will try again: %s", exc)


_LABELS = {
    "lost_leases_retried": "lost leases retried",
    "lost_leases_failed": "lost leases failed",
    "overdue_failed": "overdue failed",
    "stale_pending_canceled": "stale pending canceled",
    "exhausted_failed": "retries exhausted failed",
    "expired_canceled": "expired canceled",
}


def describe(report: SweepReport) -> str:
    """One line: ``lost leases retried: 2 (ids 4, 7); overdue failed: 1 (id 9)``."""
    parts = []
    for field, label in _LABELS.items():
        ids = getattr(report, field)
        if ids:
            shown = ", ".join(str(i) for i in ids[:10]) + (", ..." if len(ids) > 10 else "")
            parts.append(f"{label}: {len(ids)} (id{'s' if len(ids) > 1 else ''} {shown})")
    return "; ".join(parts) or "nothing to do"
