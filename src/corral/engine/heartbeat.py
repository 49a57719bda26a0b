"""The heartbeat: leases renewed, cancel requests looked for, strays reported.

A worker's units are leased: a sweeper takes back the tasks of a lease that
ran out, as a crashed worker's. The heartbeat renews every lease held here
every third of the lease (renewing writes every row of a claim: a third is
plenty), and after a failed renewal again within a second, so that once the
store is back the leases are renewed before a sweeper takes them. A lease
the store says is lost marks its unit: its slot starts nothing more.

In between it asks, once a second in one read, which tasks running here
were asked to cancel, so a cancel from another process lands within a
second. About once a minute it also warns of queued tasks of a name no
worker here registers, and tells the store (``worker.health`` events, read
by ``corral status``) what it sees but cannot fix.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence

from corral.core.clock import Clock
from corral.core.model import TaskFilter, dumps
from corral.core.states import State
from corral.engine.hooks import Guarded
from corral.engine.registry import Registry
from corral.engine.units import Ledger
from corral.errors import StoreError
from corral.stores.base import Store

log = logging.getLogger("corral.worker")

#: The event a worker writes about once a minute with what it cannot fix itself.
HEALTH_EVENT = "worker.health"
#: Rows read per queue by the check for queued tasks no worker here registers.
_STRAY_SCAN = 200
#: After a failed renewal, the heartbeat tries again this soon (seconds):
#: after an outage, leases are renewed before a sweeper may take them.
RENEW_RETRY = 1.0


class Heartbeat:
    """Renews the leases of one worker and brings it news from the store."""

    def __init__(
        self,
        store: Store,
        registry: Registry,
        clock: Clock,
        hooks: Guarded,
        ledger: Ledger,
        *,
        worker_id: str,
        queues: Sequence[str],
        lease_seconds: float,
        interval: float,
        cancel_poll_interval: float,
        stray_check_interval: float,
        stopped: threading.Event,
    ):
        self.store = store
        self.registry = registry
        self.clock = clock
        self.hooks = hooks
        self.ledger = ledger
        self.id = worker_id
        self.queues = tuple(queues)
        self.lease_seconds = lease_seconds
        #: seconds between renewals (on the worker clock)
        self.interval = interval
        self.cancel_poll_interval = cancel_poll_interval
        self.stray_check_interval = stray_check_interval
        self.stopped = stopped
        #: stray checks made (each reads the queues once)
        self.stray_checks = 0
        self._strays_seen: set[tuple[str, str]] = set()

    def loop(self) -> None:
        # Renewals follow the clock leases are measured on; the loop itself
        # wakes on real time, at least once a second.
        next_renewal = self.clock.monotonic() + self.interval
        next_stray_check = time.monotonic() + min(self.stray_check_interval, 5.0)
        while not self.stopped.wait(min(self.cancel_poll_interval, self.interval)):
            if time.monotonic() >= next_stray_check:
                next_stray_check = time.monotonic() + self.stray_check_interval
                self._check_strays()
            if self.clock.monotonic() < next_renewal:
                self._poll_cancels()
                continue
            asked = self.clock.monotonic()
            next_renewal = asked + self.interval
            if not self._renew(asked):
                next_renewal = min(next_renewal, self.clock.monotonic() + RENEW_RETRY)

    def _renew(self, asked: float) -> bool:
        """Renew every lease held here; False when the store could not be asked."""
        ledger = self.ledger
        with ledger.cond:
            units = list(ledger.units)
        tokens = {u.claim.token for u in units}
        if not tokens:
            return True
        try:
            reply = self.store.heartbeat(tokens, self.lease_seconds)
        except StoreError as exc:
            # try again soon: once the store is back, leases that ran out
            # meanwhile are renewed before a sweeper takes them
            log.warning("heartbeat failed: %s", exc)
            return False
        for u in units:
            if u.claim.token not in reply.lost_tokens:
                u.lease_until = max(u.lease_until, asked + self.lease_seconds)
        for tid in reply.cancel_requested:
            self._cancel(tid)
        with ledger.cond:
            lost_units = [u for u in ledger.units if u.claim.token in reply.lost_tokens]
        for u in lost_units:  # units that finished meanwhile are not lost
            u.lost = True
        if lost_units:
            log.warning("lost %d lease(s); their results will be discarded", len(lost_units))
            self.hooks.on_leases_lost(self.id, {u.claim.token for u in lost_units})
        return True

    def _cancel(self, task_id: int) -> None:
        run = self.ledger.runs.get(task_id)
        if run is not None:
            run.cancel()

    def _poll_cancels(self) -> None:
        """Between renewals, ask the store (one read for all) which tasks
        running here were asked to cancel, so a cancel from another process
        lands within a second."""
        ids = [tid for tid, run in list(self.ledger.runs.items()) if not run.ctx.canceled]
        if not ids:
            return
        try:
            asked = self.store.cancel_requested(ids)
        except StoreError:  # the next renewal reports it too
            return
        for tid in asked:
            self._cancel(tid)

    def _check_strays(self) -> None:
        """Warn, once per name and queue, of queued tasks this worker cannot
        claim because it does not register their name: they wait, and hold
        their groups, until a worker that does comes along."""
        self.stray_checks += 1
        names = frozenset(self.registry)
        seen_now: dict[str, int] = {}  # "queue:name" -> pending tasks, for `corral status`
        for q in self.queues:
            try:
                rows = self.store.list_tasks(
                    TaskFilter(status=State.PENDING, queue=q, limit=_STRAY_SCAN, newest_first=False)
                )
            except StoreError:  # the next check tries again
                return
            strays: dict[str, int] = {}
            for r in rows:
                if r.name not in names:
                    seen_now[f"{q}:{r.name}"] = seen_now.get(f"{q}:{r.name}", 0) + 1
                    if (r.name, q) not in self._strays_seen:
                        strays[r.name] = strays.get(r.name, 0) + 1
            for name, n in sorted(strays.items()):
                self._strays_seen.add((name, q))
                log.warning(
                    "queue %r holds %d%s pending task(s) named %r, a name this worker does not register:"
                    " it cannot run them, and they hold their groups until a worker that registers it runs",
                    q,
                    n,
                    "+" if len(rows) >= _STRAY_SCAN else "",
                    name,
                )
        self._report_health(seen_now)

    def _report_health(self, unregistered: dict[str, int]) -> None:
        """Tell the store what this worker sees but cannot fix, so that
        ``corral status`` shows it: pending tasks of names it does not
        register, and timed-out threads still running here."""
        data = {"unregistered": unregistered, "abandoned_threads": len(self.ledger.abandoned)}
        try:
            self.store.add_event(HEALTH_EVENT, self.id, dumps(data))
        except (StoreError, NotImplementedError):  # a report, not the work: the next check sends it again
            pass
