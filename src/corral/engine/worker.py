"""The worker: the rooms that claim, run and complete tasks, put together.

A worker is five rooms sharing one :class:`~corral.engine.units.Ledger` of
the units it holds, each with one job and its own thread(s):

- the *dispatcher* (:mod:`corral.engine.dispatcher`) claims into free slots
  and a few units ahead of them, asking through one
  :class:`~corral.engine.claimer.Claimer` (chunks, lanes, retry share);
- the *slots* (:mod:`corral.engine.runner`) run a unit's tasks in order and
  classify how each ended (:mod:`corral.engine.outcomes`);
- the *completer* (:mod:`corral.engine.completer`) writes outcomes in
  batches, frees slots once their outcomes are in, and hands a place under
  a limit over to its successor in the same write;
- the *watchdog* (:mod:`corral.engine.watchdog`) times out overdue tasks
  without their help;
- the *heartbeat* (:mod:`corral.engine.heartbeat`) renews leases, looks for
  cancel requests, and reports what it cannot fix.

Beside them a presence thread (:mod:`corral.engine.presence`) writes the
worker's row every few seconds, and an optional *sweeper* loop
(``sweep_interval``; on by default in ``App.start``, ``App.run`` and
``corral worker``) keeps leases honest: one leader at a time across the
fleet sweeps, the others back it up on lost leases. This module starts and stops them all: :meth:`Worker.stop` hands
back what did not finish in its grace period, :meth:`Worker.drain` waits
until nothing is left that this worker can run now.

The worker knows a store, a registry of task definitions and one
:class:`~corral.engine.hooks.Hooks` object; it never imports the public API.
Time that is stored or that decides a task's fate (start times, timeouts,
lease renewals) comes from a :class:`~corral.core.clock.Clock`; waits that
only pace this process's own threads use real time.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from corral.core import slots, validation
from corral.core.clock import SYSTEM_CLOCK, Clock
from corral.core.cron import Schedule
from corral.core.model import DEFAULT_LEASE_SECONDS, Outcome, TaskFilter, TaskRecord, new_holder_id
from corral.core.states import State
from corral.engine.claimer import Claimer
from corral.engine.completer import COMPLETER_WINDOW, Completer
from corral.engine.dispatcher import Dispatcher
from corral.engine.heartbeat import Heartbeat
from corral.engine.hooks import Guarded, Hooks
from corral.engine.limit_reporter import LimitReporter
from corral.engine.presence import Presence
from corral.engine.registry import Registry
from corral.engine.runner import Runner
from corral.engine.units import Ledger, Pace, Unit
from corral.engine.watchdog import DEFAULT_MAX_ABANDONED_THREADS, Watchdog
from corral.errors import ConfigError, StoreCorrupt, StoreError, WorkerFailed
from corral.stores.base import Store

log = logging.getLogger("corral.worker")

#: Rows read per state when a drain reports what it left in the store.
_LEFT_SCAN = 1000
#: A worker writes its row (engine/presence.py) at least this often, in seconds.
PRESENCE_EVERY = 5.0


@dataclass
class DrainReport:
    """What a drain or a close left unfinished; true when nothing was.

    ``left`` counts queued tasks this worker could not run now, by reason:
    ``unregistered`` (a name this worker does not register), ``other_queue``,
    ``delayed`` (due later), ``waiting`` (on dependencies) and ``blocked``
    (behind their group's head or a limit, or a retry due later).
    """

    drained: bool = True
    handed_back: int = 0  # tasks in flight here, given back to the queue
    abandoned_threads: int = 0  # timed-out threads still running, their tasks leased
    left: dict[str, int] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return self.drained

    def summary(self) -> str:
        """One line for the log."""
        head = "drained" if self.drained else "not drained (timeout)"
        parts = [f"{n} {why}" for why, n in sorted(self.left.items()) if n]
        left = f"; left in the store: {', '.join(parts)}" if parts else ""
        extra = ""
        if self.handed_back:
            extra += f"; {self.handed_back} in-flight task(s) handed back"
        if self.abandoned_threads:
            extra += (
                f"; {self.abandoned_threads} timed-out thread(s) still running"
                " (their tasks stay leased until the lease runs out)"
            )
        return head + left + extra


class Worker:
    """Runs the tasks of ``registry`` found in ``store``.

    Built by :meth:`corral.App.worker` (which ``App.start``, ``App.run`` and
    ``corral worker`` all go through); tests may build one directly.
    """

    def __init__(
        self,
        store: Store,
        registry: Registry,
        *,
        hooks: Hooks | None = None,
        clock: Clock = SYSTEM_CLOCK,
        concurrency: int = 10,
        queues: Sequence[str] | Mapping[str, int] = ("default",),
        chunk_size: int | None = None,
        prefetch: int | None = None,
        lease_seconds: float = DEFAULT_LEASE_SECONDS,
        heartbeat_interval: float | None = None,
        poll_interval: float = 0.5,
        sweep_interval: float | None = None,
        levels: Any = None,
        worker_id: str | None = None,
        completer_window: float | None = None,
        cancel_poll_interval: float = 1.0,
        max_payload_bytes: int = validation.DEFAULT_MAX_PAYLOAD_BYTES,
        max_abandoned_threads: int = DEFAULT_MAX_ABANDONED_THREADS,
        stray_check_interval: float = 60.0,
        retry_share: float | None = validation.DEFAULT_RETRY_SHARE,
        schedules: Sequence[Schedule] = (),
        periodic_interval: float = 1.0,
        retention: Mapping[State, float] | None = None,
    ):
        if completer_window is None:
            completer_window = COMPLETER_WINDOW if store.shared else 0.0
        validation.worker_options(
            concurrency=concurrency,
            chunk_size=1 if chunk_size is None else chunk_size,
            lease_seconds=lease_seconds,
            heartbeat_interval=heartbeat_interval,
            poll_interval=poll_interval,
            cancel_poll_interval=cancel_poll_interval,
            completer_window=completer_window,
            sweep_interval=sweep_interval,
        )
        validation.integer(max_abandoned_threads, "max_abandoned_threads", (1, 10_000))
        if prefetch is not None:
            validation.integer(prefetch, "prefetch", (0, 10_000))
        if periodic_interval <= 0:
            raise ConfigError("periodic_interval must be > 0 seconds")
        queue_slots = None
        if isinstance(queues, Mapping):
            queue_slots = slots.check_slots(queues)
            concurrency = sum(queue_slots.values())
            validation.integer(concurrency, "concurrency (the queues' slots together)", validation.CONCURRENCY_RANGE)
        self.store = store
        self.registry = registry
        self.hooks = hooks if hooks is not None else Hooks()
        self.clock = clock
        self.id = worker_id or new_holder_id()
        self.concurrency = concurrency
        self.queues = tuple(queues)
        self.max_payload_bytes = validation.max_payload_bytes(max_payload_bytes)
        self.lease_seconds = lease_seconds
        self.poll_interval = poll_interval
        self.sweep_interval = sweep_interval
        #: the finished tasks' retention its sweeper applies when it leads (None or empty: none)
        self.retention = dict(retention) if retention else None
        #: the sweeper leader's level keeper (fleet level, event trim), if any
        self.levels = levels
        #: periodic schedules this worker enqueues ticks of (each tick once across the fleet)
        self.schedules = tuple(schedules)
        self.periodic_interval = periodic_interval

        # The rooms, and what they share.
        self._stop_claiming = threading.Event()
        self._stopped = threading.Event()
        guarded = Guarded(self.hooks)
        self.ledger = Ledger()
        self.pace = Pace()
        self.claimer = Claimer(
            store,
            self.id,
            self.queues,
            concurrency=concurrency,
            queue_slots=queue_slots,
            chunk_size=None if chunk_size is None else max(1, chunk_size),
            retry_share=validation.retry_share(retry_share),
            lease_seconds=lease_seconds,
            ledger=self.ledger,
            pace=self.pace,
            stop_claiming=self._stop_claiming,
        )
        # Outcomes go through the completer for every store: a slot never
        # waits on the store's lock between the tasks of its unit (the memory
        # store's lock is held by a submit of a thousand tasks for tens of
        # milliseconds, and slots completing in step with it stood idle).
        self.completer = Completer(
            store, clock, guarded, self.ledger, self.claimer, self.pace, registry=registry, window=completer_window
        )
        self.dispatcher = Dispatcher(
            store,
            registry,
            clock,
            guarded,
            self.ledger,
            self.claimer,
            self.completer,
            self.pace,
            prefetch=prefetch,
            poll_interval=poll_interval,
            stop_claiming=self._stop_claiming,
            on_corrupt=self._store_failed,
        )
        #: what tasks under adaptive limits did, reported once a second
        self.limit_reports = LimitReporter(store, self.id)
        self.runner = Runner(
            store,
            registry,
            clock,
            guarded,
            self.ledger,
            self.completer,
            self.pace,
            worker_id=self.id,
            lease_seconds=lease_seconds,
            max_payload_bytes=self.max_payload_bytes,
            stop_claiming=self._stop_claiming,
            limit_reports=self.limit_reports,
        )
        self.watchdog = Watchdog(
            store,
            registry,
            clock,
            self.ledger,
            self.completer,
            worker_id=self.id,
            spawn_slot=self.runner.spawn_slot,
            max_abandoned_threads=max_abandoned_threads,
            stop_claiming=self._stop_claiming,
            stopped=self._stopped,
        )
        self.heartbeat = Heartbeat(
            store,
            registry,
            clock,
            guarded,
            self.ledger,
            worker_id=self.id,
            queues=self.queues,
            lease_seconds=lease_seconds,
            # renewing a lease writes every row of the claim: a third of the lease is plenty
            interval=heartbeat_interval or lease_seconds / 3,
            cancel_poll_interval=cancel_poll_interval,
            stray_check_interval=stray_check_interval,
            stopped=self._stopped,
        )
        self._threads: list[threading.Thread] = []
        self.started = False
        self._sweeper: Any = None
        self._presence: Presence | None = None
        self._adaptive: Any = None
        self._periodic: Any = None
        #: Set when the store failed for good (damaged, foreign, too new) or a
        #: thread of this worker failed: the worker stopped claiming.
        self.fatal: StoreCorrupt | WorkerFailed | None = None
        #: timed-out threads the last stop left running
        self.abandoned_at_stop = 0

    # ---- what the rooms hold, as the worker's own --------------------------------
    @property
    def queue_slots(self) -> dict[str, int] | None:
        """Per-queue slots (``{"default": 8, "bulk": 2}``), or None: one pool."""
        return self.claimer.queue_slots

    @property
    def chunk_size(self) -> int | None:
        """Tasks of one group per claim as given; None: sized by itself from
        the tasks' durations (see :meth:`current_chunk_size`)."""
        return self.claimer.chunk_size

    @property
    def retry_share(self) -> float | None:
        """At most this share of a claim goes to retries while fresh work
        waits (None: retries queue with fresh work, by priority then due time)."""
        return self.claimer.retry_share

    @property
    def prefetch_given(self) -> int | None:
        """Units held beyond the free slots as given (0: claim only into free
        slots; None: sized by itself, see :attr:`prefetch`)."""
        return self.dispatcher.prefetch_given

    @property
    def prefetch(self) -> int:
        """Units this worker may hold beyond its free slots now (see
        :attr:`corral.engine.dispatcher.Dispatcher.prefetch`)."""
        return self.dispatcher.prefetch

    def current_chunk_size(self) -> int:
        """The chunk size the next claim asks for: the one given, or one
        sized from the durations of the tasks run here so far."""
        return self.claimer.chunk()

    @property
    def heartbeat_interval(self) -> float:
        """Seconds between lease renewals."""
        return self.heartbeat.interval

    @heartbeat_interval.setter
    def heartbeat_interval(self, seconds: float) -> None:
        self.heartbeat.interval = seconds

    @property
    def cancel_poll_interval(self) -> float:
        return self.heartbeat.cancel_poll_interval

    @property
    def stray_check_interval(self) -> float:
        return self.heartbeat.stray_check_interval

    @property
    def completer_window(self) -> float:
        """How long the completer gathers outcomes into one write."""
        return self.completer.window

    @property
    def max_abandoned_threads(self) -> int:
        """Timed-out task threads still running here at which the worker stops claiming."""
        return self.watchdog.max_abandoned_threads

    @property
    def halted(self) -> threading.Event:
        """Set when the worker stopped claiming because of its abandoned threads."""
        return self.watchdog.halted

    @property
    def handed_back(self) -> int:
        """Tasks handed back by the last stop (or a halt)."""
        return self.ledger.handed_back

    @handed_back.setter
    def handed_back(self, n: int) -> None:
        self.ledger.handed_back = n

    @property
    def busy(self) -> int:
        """Units in flight. Lock-free (one int read), so a signal handler may ask."""
        return self.ledger.inflight

    @property
    def abandoned_threads(self) -> int:
        """Timed-out task threads still running here (their tasks stay leased)."""
        return len(self.ledger.abandoned)

    # ---- life cycle -------------------------------------------------------
    def start(self) -> Worker:
        if self.started:
            return self
        self.started = True
        self.limit_reports.start()  # knows the adaptive limits before the first task starts
        for _ in range(self.concurrency):
            self.runner.spawn_slot()
        self._thread(self.dispatcher.loop, "dispatcher")
        self._thread(self.watchdog.loop, "watchdog")
        self._thread(self.heartbeat.loop, "heartbeat")
        self._thread(self.completer.loop, "completer")
        self._presence = Presence(
            self.store,
            self.id,
            queues=self.queues,
            slots=self.concurrency,
            in_use=lambda: len(self.ledger.runs),
            every=min(self.heartbeat_interval, PRESENCE_EVERY),
        ).start()
        if self.sweep_interval:
            from corral.maintenance.adaptive_keeper import AdaptiveKeeper
            from corral.maintenance.retention import Retention
            from corral.maintenance.sweeper import Sweeper

            retention = Retention(self.store, self.retention) if self.retention else None
            self._sweeper = Sweeper(
                self.store,
                interval=self.sweep_interval,
                holder=self.id,
                retention=retention,
                outage_grace=self.lease_seconds,
                levels=self.levels,
            ).start()
            self._adaptive = AdaptiveKeeper(self.store, self._sweeper).start()
        if self.schedules:
            from corral.maintenance.periodic import Scheduler

            self._periodic = Scheduler(
                self.store, self.schedules, clock=self.clock, interval=self.periodic_interval
            ).start()
        return self

    def _thread(self, target: Callable[[], None], name: str) -> threading.Thread:
        def run() -> None:
            try:
                target()
            except Exception as exc:  # noqa: BLE001 - a bug here must not leave a worker that takes no work
                if self._stop_claiming.is_set():
                    log.warning("worker %s: its %s thread failed while stopping: %s", self.id, name, exc)
                    return
                log.exception("worker %s: its %s thread failed; the worker stops", self.id, name)
                if self.fatal is None:
                    said = (str(exc).splitlines() or [""])[0]
                    self.fatal = WorkerFailed(f"the worker's {name} thread failed: {type(exc).__name__}: {said}")
                self._stop_claiming.set()
                with self.ledger.cond:
                    self.ledger.cond.notify_all()  # a drain under way ends with the error

        t = threading.Thread(target=run, name=f"corral-{name}", daemon=True)
        t.start()
        self._threads.append(t)
        return t

    def _store_failed(self, exc: StoreCorrupt) -> None:
        """The store failed for good (the dispatcher stops claiming)."""
        self.fatal = exc

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Wait until no unit is in flight here and every outcome is written."""
        end = None if timeout is None else time.monotonic() + timeout
        ledger = self.ledger
        with ledger.cond:
            ok = ledger.cond.wait_for(
                lambda: ledger.inflight == 0, None if end is None else max(0, end - time.monotonic())
            )
        if not ok:
            return False
        return self.completer.flush(None if end is None else max(0.0, end - time.monotonic()))

    def stop(self, grace: float = 30.0) -> bool:
        """Stop claiming, let in-flight work finish for ``grace`` seconds, hand
        back what did not, and stop. Returns True if nothing had to be handed back.

        A timed-out thread still running is not waited for: its task keeps its
        lease, unrenewed, so the sweeper recovers it once the lease runs out
        (by then a worker process that exits has ended the thread)."""
        ledger = self.ledger
        ledger.handed_back = 0
        self._stop_claiming.set()
        self.store.wake_waiters()  # an idle dispatcher stops now, not after its poll interval
        if self._periodic is not None:
            self._periodic.stop()
        with ledger.cond:
            ledger.cond.notify_all()
        ledger.handed_back += self.completer.hand_back_prefetched()
        clean = self.wait_idle(grace)
        if not clean:
            self._hand_back_all()
        self._let_go_abandoned()
        self.completer.flush(10.0)
        self._stopped.set()
        if self._presence is not None:
            self._presence.stop()
        self.limit_reports.stop()
        if self._adaptive is not None:
            self._adaptive.stop()
        if self._sweeper is not None:
            self._sweeper.stop()
        for _ in range(self.runner.slots):
            ledger.inbox.put(None)
        # the dispatcher may sit in wait_for_work: let it return before the
        # caller closes the store (waking it again, in case it began its wait
        # after the wake-up above)
        for t in self._threads:
            if t.name == "corral-completer":
                continue
            deadline = time.monotonic() + self.poll_interval + 2.0
            while t.is_alive() and time.monotonic() < deadline:
                self.store.wake_waiters()
                t.join(0.05)
        return clean

    def drain(self, timeout: float | None = None) -> bool:
        """Wait until this worker has nothing left it can run now; True if reached.

        Drained means: nothing is in flight here, every outcome is written, a
        claim made after this call found nothing (so nothing of this worker's
        queues and task names is due and free to start), and no retry of
        those is due before the deadline (with no timeout: none at all).
        Tasks of other names or queues, delayed ones and those held behind
        their group or a limit are not waited for; :meth:`leftovers` counts
        them. A timed-out thread still running is not waited for either.
        Claiming goes on: :meth:`stop` ends it. Raises :attr:`fatal` once the
        worker has stopped for good (a damaged store, a failed thread of its
        own), since nothing more will be done here."""
        end = None if timeout is None else time.monotonic() + timeout
        horizon = None if timeout is None else self.store.now() + timeout
        cond = self.ledger.cond
        dispatcher = self.dispatcher
        completer = self.completer

        def left() -> float | None:
            return None if end is None else max(0.0, end - time.monotonic())

        with cond:
            dispatcher.draining += 1
            since = [dispatcher.claim_seq]  # a claim begun after this found nothing
            writes = completer.writes
            cond.notify_all()
        try:
            while True:
                with cond:
                    ok = cond.wait_for(
                        lambda: dispatcher.quiet_seq > since[0] or self._claims_over() or self.fatal is not None,
                        left(),
                    )
                    since[0] = dispatcher.claim_seq
                if self.fatal is not None:
                    raise self.fatal  # nothing more will be claimed or written here
                if not ok or not completer.flush(left()):
                    return False
                if completer.writes != writes and not self._claims_over():
                    # outcomes written since may have freed work (a task whose
                    # last upstream just succeeded): a claim begun after them
                    # must find nothing too
                    with cond:
                        writes = completer.writes
                        since[0] = dispatcher.claim_seq
                        cond.notify_all()
                    continue
                due = self._retries_due(horizon)
                if due is None:
                    with cond:
                        # a claim begun since may have taken a retry that fell
                        # due meanwhile (it is RUNNING, no longer RETRYING)
                        if dispatcher.claim_seq == since[0] and self.ledger.inflight == 0:
                            return True
                    continue
                pause = 0.05 if end is None else min(0.05, end - time.monotonic())
                if pause <= 0:
                    return False
                self._stopped.wait(pause)
        finally:
            with cond:
                dispatcher.draining -= 1

    def _claims_over(self) -> bool:
        """No claim will come (stopped or halted) and nothing is in flight."""
        return self._stop_claiming.is_set() and self.ledger.inflight == 0

    def _retries_due(self, horizon: float | None) -> float | None:
        """The earliest retry of this worker's tasks due by ``horizon``
        (store time; None: any), or None if there is none."""
        names = frozenset(self.registry)
        earliest: float | None = None
        for q in self.queues:
            try:
                rows = self.store.list_tasks(
                    TaskFilter(status=State.RETRYING, queue=q, limit=_LEFT_SCAN, newest_first=False)
                )
            except StoreError as exc:
                log.warning("drain: reading retries failed: %s", exc)
                return time.monotonic()
            for r in rows:
                due = r.run_at or 0.0
                if r.name in names and (horizon is None or due <= horizon):
                    earliest = due if earliest is None else min(earliest, due)
        return earliest

    def leftovers(self) -> dict[str, int]:
        """Count queued tasks this worker cannot run now, by reason (see :class:`DrainReport`).

        Reads at most a bounded number of rows per state: a count, not an inventory."""
        names = frozenset(self.registry)
        now = self.store.now()
        left: dict[str, int] = {}
        for status in (State.PENDING, State.RETRYING, State.WAITING):
            for r in self.store.list_tasks(TaskFilter(status=status, limit=_LEFT_SCAN, newest_first=False)):
                if r.name not in names:
                    why = "unregistered"
                elif r.queue not in self.queues:
                    why = "other_queue"
                elif status is State.WAITING:
                    why = "waiting"
                elif r.run_at is not None and r.run_at > now:
                    why = "delayed"
                else:
                    why = "blocked"
                left[why] = left.get(why, 0) + 1
        return left

    def cancel_local(self, task_id: int) -> None:
        """Apply a cancel request to a task running here, without waiting for the heartbeat."""
        run = self.ledger.runs.get(task_id)
        if run is not None:
            run.cancel()

    # ---- what a stop gives back ----------------------------------------------------
    def _hand_back_all(self) -> None:
        """After the grace period: give every unfinished task back, attempts intact.

        A task under way is abandoned (its process killed) and given back; its
        thread, if it ever returns, writes nothing. A timed-out thread's task
        is left to :meth:`_let_go_abandoned`."""
        ledger = self.ledger
        completer = self.completer
        with ledger.cond:
            units = list(ledger.units)
        token_tasks: list[tuple[Unit, list[TaskRecord]]] = []
        for unit in units:
            tasks = unit.claim.tasks
            with unit.lock:
                if unit.done or unit.slot_freed:
                    continue
                unit.lost = True  # its slot starts nothing more
                if unit.begun < 0:  # claimed, never started: the claim counted task 0's attempt (unless prefetched)
                    first = tasks[0]
                    given = first.attempt if unit.prefetched else first.attempt - 1
                    completer.put(Outcome(first.id, unit.claim.token, first.version, State.PENDING, attempt=given))
                    ledger.handed_back += 1
                    rest = tasks[1:]
                else:
                    run = ledger.runs.get(tasks[unit.begun].id)
                    if run is not None and not run.finished:
                        run.abandoned = True
                        if run.proc is not None:
                            run.proc.kill("shutdown")
                        rec = run.record
                        completer.put(
                            Outcome(rec.id, unit.claim.token, rec.version, State.PENDING, attempt=rec.attempt - 1)
                        )
                        ledger.handed_back += 1
                    rest = tasks[unit.begun + 1 :]
            token_tasks.append((unit, rest))
        for unit, rest in token_tasks:
            completer.hand_back(rest, unit.claim.token)
            ledger.handed_back += len(rest)
            completer.release(unit)

    def _let_go_abandoned(self) -> None:
        """At stop: timed-out threads still running keep their tasks' leases,
        no longer renewed; the sweeper recovers the tasks when the leases run
        out. Writing their outcome now would let another worker start a task
        whose thread may still run here."""
        abandoned = self.ledger.abandoned
        runs = list(abandoned.values())
        self.abandoned_at_stop = len(runs)
        for run in runs:
            with run.unit.lock:
                run.late_outcome = None  # a thread that ends after this writes nothing
            abandoned.pop(run.record.id, None)
            self.ledger.settle(run.unit)
        if runs:
            log.warning(
                "worker %s: %d timed-out task thread(s) still running at stop: task(s) %s stay leased"
                " until the lease runs out, then the sweeper recovers them",
                self.id,
                len(runs),
                ", ".join(str(r.record.id) for r in runs),
            )
