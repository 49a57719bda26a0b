"""The watchdog: times out overdue tasks without their help.

A hung task cannot be trusted to notice its own deadline, so a thread of
the worker watches the deadlines of the bodies running in thread slots (a
child process times itself out). A timed-out thread cannot be stopped: by
default its task keeps its lease (renewed by the heartbeat), and so its
group and its limits, until the thread really ends; only then is the
timeout written. Its slot is replaced so concurrency holds. Too many such
threads (``max_abandoned_threads``) and the worker stops claiming: only a
process exit ends a thread. A task with ``overlap_on_timeout`` gets its
outcome at once and frees its lane.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from corral.core.clock import Clock
from corral.engine import outcomes
from corral.engine.completer import Completer
from corral.engine.logs import task_fields
from corral.engine.registry import Registry
from corral.engine.units import RELAY_CLOSED, Ledger, TaskRun
from corral.stores.base import Store

log = logging.getLogger("corral.worker")

#: Timed-out task threads still running before a worker stops claiming.
DEFAULT_MAX_ABANDONED_THREADS = 10


class Watchdog:
    """Times out the thread tasks of one worker (see the module docstring)."""

    def __init__(
        self,
        store: Store,
        registry: Registry,
        clock: Clock,
        ledger: Ledger,
        completer: Completer,
        *,
        worker_id: str,
        spawn_slot: Callable[[], None],
        max_abandoned_threads: int,
        stop_claiming: threading.Event,
        stopped: threading.Event,
    ):
        self.store = store
        self.registry = registry
        self.clock = clock
        self.ledger = ledger
        self.completer = completer
        self.id = worker_id
        self.spawn_slot = spawn_slot
        #: timed-out task threads still running here; at this many the worker stops claiming
        self.max_abandoned_threads = max_abandoned_threads
        self.stop_claiming = stop_claiming
        self.stopped = stopped
        #: set when the worker stopped claiming because of its abandoned threads
        self.halted = threading.Event()

    def loop(self) -> None:
        while not self.stopped.is_set():
            now = self.clock.monotonic()
            next_check = 0.05
            for run in list(self.ledger.runs.values()):
                if run.deadline is None or run.finished or run.abandoned:
                    continue
                if run.deadline <= now:
                    self.time_out(run)
                else:
                    next_check = min(next_check, run.deadline - now)
            self.stopped.wait(max(0.005, next_check))

    def time_out(self, run: TaskRun) -> None:
        """Time out a thread task: its outcome waits for the thread's end
        (or, with ``overlap_on_timeout``, is written at once), the rest of
        its unit goes back to the queue, and a new slot takes its place."""
        unit = run.unit
        rec = run.record
        ledger = self.ledger
        tdef = self.registry.get(rec.name)
        overlap = bool(getattr(tdef, "overlap_on_timeout", False))
        started_at = self.clock.time() - (rec.timeout or 0)
        outcome = outcomes.timed_out(rec, unit.claim.token, tdef, started_at, self.store.now)
        if rec.id in unit.uncounted:
            outcome.attempt = rec.attempt
        waiting = None
        with unit.lock:
            if run.finished or run.abandoned or unit.done:
                return
            run.abandoned = True
            unit.lost = True  # the rest of the chunk is handed back below
            if not overlap:
                run.late_outcome = outcome
                unit.slot_freed = True
                ledger.abandoned[rec.id] = run
                # a successor relayed to it would wait for the thread's end: back to the queue
                waiting, unit.successor, unit.relay = unit.successor, None, RELAY_CLOSED
        if run.future is not None:
            run.future.cancel()
        self.completer.hand_back(unit.claim.tasks[unit.begun + 1 :], unit.claim.token)
        if waiting is not None:
            self.completer.give_back(waiting)
        if overlap:
            log.warning(
                "task %s (%s) timed out after %ss; abandoning its thread",
                rec.id,
                rec.name,
                rec.timeout,
                extra=task_fields(rec),
            )
            ledger.runs.pop(rec.id, None)
            self.completer.put(outcome)
            self.spawn_slot()
            self.completer.release(unit)
            return
        held = len(ledger.abandoned)
        log.warning(
            "task %s (%s) timed out after %ss; its thread cannot be stopped, so the task stays leased"
            " until it ends (%d timed-out thread(s) running here; isolation='process' stops a task hard)",
            rec.id,
            rec.name,
            rec.timeout,
            held,
            extra=task_fields(rec),
        )
        if held >= self.max_abandoned_threads and not self.halted.is_set():
            log.error(
                "worker %s: %d timed-out task threads still running (max_abandoned_threads=%d); it stops"
                " claiming. Only a process exit ends a thread: restart this worker",
                self.id,
                held,
                self.max_abandoned_threads,
            )
            self.halted.set()
            self.stop_claiming.set()  # before the slot is freed, so nothing is claimed into it
            ledger.handed_back += self.completer.hand_back_prefetched()  # they would wait for a slot in vain
        self.spawn_slot()
        with ledger.cond:
            ledger.inflight -= 1  # the unit stays in the ledger's units: the heartbeat keeps its lease
            ledger.count(unit, -1)
            ledger.cond.notify_all()
