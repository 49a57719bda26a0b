"""The worker: claim, run, complete; plus its watchdog and heartbeat.

Threads, each with one job:

- the *dispatcher* claims as many units as there are free slots and hands
  them to slot threads; beyond that it may hold up to ``prefetch`` units
  waiting for a slot, claimed so that they hold no limit's place, token or
  probe and record no start (a hand-back or a crash costs them no attempt);
- *slots* run a unit's tasks in order and report outcomes;
- the *watchdog* times out overdue tasks without their help (a hung task
  cannot be trusted to notice) and replaces an abandoned slot so concurrency
  holds. A timed-out thread cannot be stopped, so its task keeps its lease
  (renewed by the heartbeat) and its group and limits stay held until the
  thread really ends; only then is the timeout written. Too many such
  threads (``max_abandoned_threads``) and the worker stops claiming: only a
  process exit ends a thread;
- the *heartbeat* renews leases every third of the lease and, in between,
  looks for cancel requests of the tasks running here every second; about
  once a minute it also warns of queued tasks no worker here can claim;
- the *completer* writes outcomes in batches, off the slot threads (a slot
  never waits for a write between the tasks of its unit); a unit of a group
  or under a limit frees its slot only once its outcomes are written;
- an optional *sweeper* loop (``sweep_interval``; on by default in
  ``App.start``, ``App.run`` and ``corral worker``): one leader at a time
  across the fleet sweeps, the others back it up on lost leases.

The worker knows a store, a registry of task definitions and one
:class:`~corral.engine.hooks.Hooks` object; it never imports the public API.
Time that is stored or that decides a task's fate (start times, timeouts,
lease renewals) comes from a :class:`~corral.core.clock.Clock`; waits that
only pace this process's own threads use real time.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import logging
import queue
import threading
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from corral.core import slots, texts, validation
from corral.core.breaker import counts_as_failure
from corral.core.clock import SYSTEM_CLOCK, Clock
from corral.core.cron import Schedule
from corral.core.model import (
    DEFAULT_LEASE_SECONDS,
    Claim,
    Outcome,
    Start,
    TaskFilter,
    TaskRecord,
    dumps,
    new_holder_id,
)
from corral.core.pacing import AutoChunk, RunningMean, auto_prefetch, relay_due, relay_lead, tail_bound, tail_split
from corral.core.retries import MAX_SNOOZES, Backoff, http_status, is_retryable, retry_delay
from corral.core.retry_after import retry_after
from corral.core.states import State
from corral.engine import tracing
from corral.engine.context import Context, _set_current
from corral.engine.executors import ProcessRun, run_async
from corral.engine.hooks import OPEN, UNLIMITED, DispatchPolicy, Hooks
from corral.engine.logs import task_fields
from corral.engine.presence import Presence
from corral.engine.registry import Registry, TaskSpec
from corral.errors import (
    Canceled,
    ChildFailed,
    ConfigError,
    PermanentError,
    Retry,
    StoreCorrupt,
    StoreError,
    StoreUnavailable,
    WorkerFailed,
)
from corral.stores.base import Offer, Store

log = logging.getLogger("corral.worker")
#: The level of the line a finished attempt writes.
_OUTCOME_LEVELS = {
    State.SUCCESS: logging.DEBUG,
    State.RETRYING: logging.INFO,
    State.PENDING: logging.INFO,
    State.CANCELED: logging.INFO,
    State.FAILED: logging.WARNING,
    State.TIMEOUT: logging.WARNING,
}


def _error_line(text: str | None) -> str:
    lines = [ln for ln in (text or "").strip().splitlines() if ln.strip()]
    return lines[-1].strip() if lines else "-"


#: A worker writes its row (engine/presence.py) at least this often, in seconds.
PRESENCE_EVERY = 5.0

#: The event a worker writes about once a minute with what it cannot fix itself.
HEALTH_EVENT = "worker.health"

#: What a run raises when it was canceled (by ctx, or its coroutine was cancelled).
_CANCELED = (Canceled, asyncio.CancelledError, concurrent.futures.CancelledError)
#: Writing outcomes through a store outage: tries, and the longest pause between them.
_COMPLETE_TRIES = 5
#: How long the completer gathers outcomes into one write for a store in
#: another process or on a disk (none for the in-process memory store).
COMPLETER_WINDOW = 0.005
_COMPLETE_MAX_PAUSE = 5.0
#: The longest pause between writes of outcomes through an outage: they
#: must land soon after it ends, before sweepers look at their leases.
_OUTAGE_PAUSE = 0.5
#: A held task's start (a chunk member, a prefetched or relayed task) is
#: recorded once its body has run this long without an outcome (a shorter one
#: records it with its outcome: no write of its own), in one write with every
#: other start due, at most once per START_WRITE_EVERY: a start shows within
#: about half a second, for a few writes a second at most.
START_RECORD_AFTER = 0.25
START_WRITE_EVERY = 0.2
#: Timed-out task threads still running before a worker stops claiming.
DEFAULT_MAX_ABANDONED_THREADS = 10
#: Rows read per queue by the check for queued tasks no worker here registers.
_STRAY_SCAN = 200
#: Rows read per state when a drain reports what it left in the store.
_LEFT_SCAN = 1000
#: How often a worker reads the backlog for the chunks of the end of the
#: queued work (a bounded count: 2 ms on PostgreSQL at its largest), at
#: most how seldom while the last count reached its bound, and for how long
#: after a grouped claim.
TAIL_LOOK_EVERY = 0.05
TAIL_FAR_LOOK_EVERY = 0.25
TAIL_GROUPED_WITHIN = 1.0
#: A task held here starts only with at least this share of its lease left
#: (as last renewed); with less, the lease is renewed first, and if that
#: fails the unit's tasks not yet started go back to the queue.
LEASE_MARGIN = 0.25
#: After a failed renewal, the heartbeat tries again this soon (seconds):
#: after an outage, leases are renewed before a sweeper may take them.
RENEW_RETRY = 1.0


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


def _is_retry(claim: Claim, prefetched: bool) -> bool:
    """Is the claim headed by a task run again after an attempt that ended?
    (A prefetched head's attempt is not raised until it starts.)"""
    return claim.tasks[0].attempt + (1 if prefetched else 0) > 1


#: A unit's relay: none asked, asked of the completer, a successor waits in
#: its place, or closed (it ended first, or none came: its end hands over)
RELAY_NONE, RELAY_ASKED, RELAY_GIVEN, RELAY_CLOSED = range(4)


@dataclass(eq=False)
class _Unit:
    claim: Claim
    done: bool = False  # accounting settled (by its slot or by the watchdog)
    lost: bool = False  # lease gone, or handed back at shutdown: start nothing more
    #: handed back before it started: the hand-back frees its slot once written
    given_back: bool = False
    slot_freed: bool = False  # its slot was replaced (a timed-out thread): not counted in flight
    begun: int = -1  # index of the last task this unit's slot committed to run
    #: claimed ahead of a free slot: the store recorded no start, not even the head's
    prefetched: bool = False
    #: chunk members started here whose start the store has not recorded yet:
    #: their outcome carries the attempt, so a chunk costs no extra write per task
    uncounted: set[int] = field(default_factory=set)
    #: until when its lease surely stands, on the worker clock's monotonic
    #: time: the lease's length after the claim or the last renewal was *asked*
    #: (the store counts it from a later moment)
    lease_until: float = float("-inf")
    lock: threading.Lock = field(default_factory=threading.Lock)
    #: where its relay stands (RELAY_*), and the successor waiting in its place
    relay: int = RELAY_NONE
    successor: _Unit | None = None
    #: headed by a task run again after an attempt that ended (the retry path).
    #: Fixed at the claim: a prefetched head's attempt is raised when it
    #: starts, and the unit must leave the count it entered.
    retry: bool = field(init=False)

    def __post_init__(self) -> None:
        self.retry = _is_retry(self.claim, self.prefetched)

    @property
    def queue(self) -> str:
        return self.claim.tasks[0].queue


@dataclass(eq=False)
class _Relay:
    """The completer's cue: ``unit`` is near its end, claim its successor."""

    unit: _Unit


@dataclass(eq=False)
class _Run:
    unit: _Unit
    record: TaskRecord
    ctx: Context
    deadline: float | None
    abandoned: bool = False
    finished: bool = False
    proc: ProcessRun | None = None
    future: Any = None
    #: written when an abandoned thread really ends (None: write nothing then)
    late_outcome: Outcome | None = None


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
        self.max_payload_bytes = validation.max_payload_bytes(max_payload_bytes)
        #: at most this share of a claim goes to retries while fresh work waits
        #: (None: retries queue with fresh work, by priority then due time)
        self.retry_share = validation.retry_share(retry_share)
        self.store = store
        self.registry = registry
        self.hooks = hooks if hooks is not None else Hooks()
        self.clock = clock
        #: per-queue slots (``{"default": 8, "bulk": 2}``), or None: one pool
        self.queue_slots: dict[str, int] | None = None
        if isinstance(queues, Mapping):
            self.queue_slots = slots.check_slots(queues)
            concurrency = sum(self.queue_slots.values())
            validation.integer(concurrency, "concurrency (the queues' slots together)", validation.CONCURRENCY_RANGE)
        self.concurrency = concurrency
        self.queues = tuple(queues)
        #: None: sized by itself from the tasks' durations (see core.pacing.AutoChunk)
        self.chunk_size = None if chunk_size is None else max(1, chunk_size)
        self._auto_chunk = AutoChunk()
        self._backlog: tuple[float, int | None] = (-1.0, None)  # (read at, queued tasks) for tail_split
        self._grouped_at = -1.0  # when a claim last brought a group's unit
        #: units held beyond the free slots (0: claim only into free slots;
        #: None: sized by itself from the units' durations, see :attr:`prefetch`)
        self.prefetch_given = prefetch
        self._unit_time = RunningMean()
        self._handover_time = RunningMean()  # a handover's write: how early a relay is asked
        # A worker running limited tasks lets its prefetch run dry before the
        # next claim into a free slot, which alone may take limited work: so
        # limited work is never starved by a steady flow of unlimited work.
        self._mixed = any(getattr(t, "limits", ()) for t in registry.values())
        self._prefetch_turn = True
        self._prefetch_after = 0.0  # after an empty prefetch claim, the next one waits this long
        self.lease_seconds = lease_seconds
        # renewing a lease writes every row of the claim: a third of the lease is plenty
        self.heartbeat_interval = heartbeat_interval or lease_seconds / 3
        self.poll_interval = poll_interval
        self.cancel_poll_interval = cancel_poll_interval
        self.sweep_interval = sweep_interval
        #: the finished tasks' retention its sweeper applies when it leads (None or empty: none)
        self.retention = dict(retention) if retention else None
        #: the sweeper leader's level keeper (fleet level, event trim), if any
        self.levels = levels
        #: periodic schedules this worker enqueues ticks of (each tick once across the fleet)
        self.schedules = tuple(schedules)
        if periodic_interval <= 0:
            raise ConfigError("periodic_interval must be > 0 seconds")
        self.periodic_interval = periodic_interval
        self.id = worker_id or new_holder_id()
        self._cond = threading.Condition()
        self._inflight = 0  # units claimed and not settled
        self._held: dict[str, int] = {}  # of those, by queue (per-queue slots)
        self._retries_held = 0  # of those, retries (their share of the slots)
        self._fresh_held = 0  # and fresh units
        self._fresh_peak = slots.RecentPeak(1.0)  # the most fresh units held in about the last second
        self._turn = 0  # which queue asks first (per-queue slots)
        self._full_queues = False  # the last claim left out a queue with no slot free
        self._units: set[_Unit] = set()
        self._runs: dict[int, _Run] = {}
        self._inbox: queue.SimpleQueue[_Unit | None] = queue.SimpleQueue()
        self._stop_claiming = threading.Event()
        self._stopped = threading.Event()
        self._threads: list[threading.Thread] = []
        self._slots = 0
        # Outcomes go through the completer for every store: a slot never
        # waits on the store's lock between the tasks of its unit (the memory
        # store's lock is held by a submit of a thousand tasks for tens of
        # milliseconds, and slots completing in step with it stood idle).
        self._completer_q: queue.SimpleQueue[Outcome | _Unit | _Relay] = queue.SimpleQueue()
        #: how long the completer gathers outcomes into one write (see COMPLETER_WINDOW)
        self.completer_window = completer_window
        self._completer_idle = threading.Event()
        self._completer_idle.set()
        # orders "queue empty, so idle" against "not idle, then queued": without
        # it an item put in between could be written while the flag says idle
        self._completer_gate = threading.Lock()
        #: starts not recorded yet of held tasks whose bodies run:
        #: id -> (when due to be written, lease token, attempt, started_at)
        self._starts: dict[int, tuple[float, str, int, float]] = {}
        self._starts_lock = threading.Lock()
        self._starts_written_at = 0.0
        self.started = False
        self._sweeper: Any = None
        self._presence: Presence | None = None
        self._periodic: Any = None
        #: Set when the store failed for good (damaged, foreign, too new) or a
        #: thread of this worker failed: the worker stopped claiming.
        self.fatal: StoreCorrupt | WorkerFailed | None = None
        #: timed-out task threads still running here; at this many the worker stops claiming
        self.max_abandoned_threads = max_abandoned_threads
        self._abandoned: dict[int, _Run] = {}
        #: set when the worker stopped claiming because of its abandoned threads
        self.halted = threading.Event()
        #: tasks handed back by the last stop, and timed-out threads it left running
        self.handed_back = 0
        self.abandoned_at_stop = 0
        # drain: claims begun, the last one that found nothing with nothing in flight
        self._claim_seq = 0
        self._quiet_seq = 0
        self._writes = 0  # outcome batches written (a drain looks again after one)
        self._draining = 0
        self.stray_check_interval = stray_check_interval
        self._strays_seen: set[tuple[str, str]] = set()
        self._stray_checks = 0
        self._handover_asked = float("-inf")  # when the completer's last handover was asked (its clock)

    # ---- life cycle -------------------------------------------------------
    def start(self) -> Worker:
        if self.started:
            return self
        self.started = True
        for _ in range(self.concurrency):
            self._spawn_slot()
        self._thread(self._dispatch_loop, "dispatcher")
        self._thread(self._watchdog_loop, "watchdog")
        self._thread(self._heartbeat_loop, "heartbeat")
        self._thread(self._completer_loop, "completer")
        self._presence = Presence(
            self.store,
            self.id,
            queues=self.queues,
            slots=self.concurrency,
            in_use=lambda: len(self._runs),
            every=min(self.heartbeat_interval, PRESENCE_EVERY),
        ).start()
        if self.sweep_interval:
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
                with self._cond:
                    self._cond.notify_all()  # a drain under way ends with the error

        t = threading.Thread(target=run, name=f"corral-{name}", daemon=True)
        t.start()
        self._threads.append(t)
        return t

    def _spawn_slot(self) -> None:
        self._slots += 1
        threading.Thread(target=self._slot_loop, name=f"corral-slot-{self._slots}", daemon=True).start()

    @property
    def busy(self) -> int:
        """Units in flight. Lock-free (one int read), so a signal handler may ask."""
        return self._inflight

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Wait until no unit is in flight here and every outcome is written."""
        end = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            ok = self._cond.wait_for(
                lambda: self._inflight == 0, None if end is None else max(0, end - time.monotonic())
            )
        if not ok:
            return False
        return self._flush(None if end is None else max(0.0, end - time.monotonic()))

    @property
    def abandoned_threads(self) -> int:
        """Timed-out task threads still running here (their tasks stay leased)."""
        return len(self._abandoned)

    def stop(self, grace: float = 30.0) -> bool:
        """Stop claiming, let in-flight work finish for ``grace`` seconds, hand
        back what did not, and stop. Returns True if nothing had to be handed back.

        A timed-out thread still running is not waited for: its task keeps its
        lease, unrenewed, so the sweeper recovers it once the lease runs out
        (by then a worker process that exits has ended the thread)."""
        self.handed_back = 0
        self._stop_claiming.set()
        self.store.wake_waiters()  # an idle dispatcher stops now, not after its poll interval
        if self._periodic is not None:
            self._periodic.stop()
        with self._cond:
            self._cond.notify_all()
        self.handed_back += self._hand_back_prefetched()
        clean = self.wait_idle(grace)
        if not clean:
            self._hand_back_all()
        self._let_go_abandoned()
        self._flush(10.0)
        self._stopped.set()
        if self._presence is not None:
            self._presence.stop()
        if self._sweeper is not None:
            self._sweeper.stop()
        for _ in range(self._slots):
            self._inbox.put(None)
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

        def left() -> float | None:
            return None if end is None else max(0.0, end - time.monotonic())

        with self._cond:
            self._draining += 1
            since = [self._claim_seq]  # a claim begun after this found nothing
            writes = self._writes
            self._cond.notify_all()
        try:
            while True:
                with self._cond:
                    ok = self._cond.wait_for(
                        lambda: self._quiet_seq > since[0] or self._claims_over() or self.fatal is not None, left()
                    )
                    since[0] = self._claim_seq
                if self.fatal is not None:
                    raise self.fatal  # nothing more will be claimed or written here
                if not ok or not self._flush(left()):
                    return False
                if self._writes != writes and not self._claims_over():
                    # outcomes written since may have freed work (a task whose
                    # last upstream just succeeded): a claim begun after them
                    # must find nothing too
                    with self._cond:
                        writes = self._writes
                        since[0] = self._claim_seq
                        self._cond.notify_all()
                    continue
                due = self._retries_due(horizon)
                if due is None:
                    with self._cond:
                        # a claim begun since may have taken a retry that fell
                        # due meanwhile (it is RUNNING, no longer RETRYING)
                        if self._claim_seq == since[0] and self._inflight == 0:
                            return True
                    continue
                pause = 0.05 if end is None else min(0.05, end - time.monotonic())
                if pause <= 0:
                    return False
                self._stopped.wait(pause)
        finally:
            with self._cond:
                self._draining -= 1

    def _claims_over(self) -> bool:
        """No claim will come (stopped or halted) and nothing is in flight."""
        return self._stop_claiming.is_set() and self._inflight == 0

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
        run = self._runs.get(task_id)
        if run is None:
            return
        run.ctx._request_cancel()
        if run.proc is not None:
            run.proc.kill("cancel")
        elif run.future is not None:
            run.future.cancel()

    # ---- hooks ----------------------------------------------------------------
    def _hook(self, name: str, *args: Any) -> Any:
        """Call a hook; an error in one is logged, never allowed to stop the worker."""
        try:
            return getattr(self.hooks, name)(*args)
        except Exception:  # noqa: BLE001 - a watcher's bug must not stop the work
            log.exception("hook %s failed", name)
            return {"dispatch_budget": UNLIMITED, "dispatch": OPEN}.get(name)

    # ---- dispatch -----------------------------------------------------------
    def _dispatch_loop(self) -> None:
        names = frozenset(self.registry)
        while not self._stop_claiming.is_set():
            policy: DispatchPolicy = self._hook("dispatch")
            if policy.max_units is None:  # paused: nothing can run now, as far as a drain is concerned
                with self._cond:
                    self._claim_seq += 1
                    if self._inflight == 0:
                        self._quiet_seq = self._claim_seq
                        self._cond.notify_all()
                self.store.wait_for_work(self._idle_wait())
                continue
            with self._cond:
                cap = self.concurrency if policy.slots is None else min(self.concurrency, policy.slots)
                free = cap - self._inflight
                ahead = False
                if free <= 0:
                    # slots all busy: top up the prefetch once it is half used
                    held = -free
                    if not (self._may_prefetch(policy) and held <= self.prefetch // 2):
                        self._cond.wait(self.poll_interval)
                        continue
                    ahead = True
                    free = self.prefetch - held
                self._claim_seq += 1
                seq = self._claim_seq
                quiet = self._inflight == 0  # an empty claim now means nothing here can run
                # reserve the slots this claim may fill, so nothing else
                # counts them free while the claim is under way
                # (a prefetch is only made under a policy that restricts nothing)
                want = free if ahead else min(free, policy.max_units)
                self._inflight += want
                if not ahead:
                    self._prefetch_turn = True  # a claim into free slots opens the next prefetch
            asked = self.clock.monotonic()  # the leases of what this claim takes stand until lease_seconds after
            try:
                claims = self._claim(want, names, policy, prefetch=ahead)
            except StoreCorrupt as exc:  # no retry can cure it: stop claiming, let the runner exit
                self.fatal = exc
                claims = None
                log.error("claim failed, stopping: %s", exc)
                self._stop_claiming.set()
            except StoreError as exc:  # an outage must not end the worker; a bug ends it (see _thread)
                claims = None
                log.warning("claim failed, will retry: %s", exc)
            except BaseException:
                with self._cond:  # the slots reserved for this claim are free: the stop need not wait for them
                    self._inflight -= want
                    self._cond.notify_all()
                raise
            with self._cond:
                self._inflight -= want - len(claims or ())
                if claims == [] and quiet:
                    self._quiet_seq = max(self._quiet_seq, seq)
                self._cond.notify_all()
            if claims is None:
                self._stop_claiming.wait(min(2.0, self.poll_interval * 4))
                continue
            if ahead:
                if claims and self._mixed:
                    # limited work waits for a claim into a free slot: let
                    # the prefetch run dry before the next one
                    self._prefetch_turn = False
                elif not claims:
                    # nothing to take ahead: look again in a while, or when a
                    # slot frees (that claim may take limited work too)
                    self._prefetch_after = time.monotonic() + self.poll_interval
                    continue
            if not claims:
                if self._full_queues:
                    # a queue with no slot free may hold work: a slot freeing
                    # there is not news to the store, so look again soon
                    with self._cond:
                        self._cond.wait(min(self._idle_wait(), 0.05))
                    continue
                asked = self.clock.monotonic()
                claims = self._wait_for_work(policy, want, names)
                if not claims:
                    continue
                ahead = True  # handed over in a submit: no start recorded, as for a prefetch
            self._hook("on_claims", self.id, claims)
            units = [_Unit(c, prefetched=ahead, lease_until=asked + self.lease_seconds) for c in claims]
            with self._cond:
                self._units.update(units)
                for unit in units:
                    self._count(unit, +1)
            if ahead and self._stop_claiming.is_set():
                # stopped or halted while this prefetch was under way: its
                # units would wait for a slot in vain, give them back now
                self.handed_back += self._hand_back_prefetched()
            for unit in units:
                self._inbox.put(unit)  # a unit handed back is skipped by its slot
            time.sleep(0)  # let the woken slots take the GIL before the next claim

    def _wait_for_work(self, policy: DispatchPolicy, free: int, names: frozenset[str]) -> list[Claim]:
        """Wait for work. With nothing restricting what this worker takes,
        its ``free`` slots are offered meanwhile: a store that can hands a
        new plain task over in the submit's own commit (one commit, not a
        submit's and a claim's), and those tasks come back here, counted in
        flight."""
        timeout = self._idle_wait()
        if policy.lanes is not None or policy.only_retries or self.queue_slots is not None or self._draining:
            self.store.wait_for_work(timeout, self.queues)
            return []
        offer = Offer(self.id, tuple(self.queues), names, free, self.lease_seconds)
        claims = self.store.wait_offering(timeout, self.queues, offer)
        if claims:
            with self._cond:
                self._inflight += len(claims)
        return claims

    def _count(self, unit: _Unit, step: int) -> None:
        """Keep the per-queue and retry counts of units in flight (lock held)."""
        q = unit.queue
        self._held[q] = self._held.get(q, 0) + step
        if unit.retry:
            self._retries_held += step
        else:
            self._fresh_held += step
            if step > 0:
                self._fresh_peak.note(self._fresh_held, time.monotonic())

    def _may_prefetch(self, policy: DispatchPolicy) -> bool:
        """Claim ahead of a free slot now? Only with nothing restricting the
        claim (a degradation level's policy or per-queue slots restrict it),
        with no retry in flight here, and, for a worker running limited
        tasks, only once between two claims into free slots."""
        return (
            self.prefetch > 0
            and self._unrestricted(policy)
            # while retries run here, fresh arrivals must find a free slot, not
            # a line of units held ahead (the retry path's promise)
            and self._retries_held == 0
            and self._prefetch_turn
            and time.monotonic() >= self._prefetch_after
            and (policy.max_units or 0) >= self.concurrency
        )

    def _unrestricted(self, policy: DispatchPolicy) -> bool:
        """Does nothing restrict what a claim may take now (no per-queue
        slots, no degradation policy's slots, lanes or retries only) while
        this worker still claims?"""
        return (
            self.queue_slots is None
            and policy.slots is None
            and policy.lanes is None
            and not policy.only_retries
            and not self._stop_claiming.is_set()
        )

    def _claim(
        self, want: int, names: frozenset[str], policy: DispatchPolicy, *, prefetch: bool = False
    ) -> list[Claim]:
        """One claim, or one per lane of the policy (and with per-queue slots,
        one per queue with a slot free) until ``want`` is reached."""
        extra = self._claim_extra(policy, prefetch)
        if policy.lanes is None:
            lanes: tuple[tuple[tuple[str, ...], frozenset[str]], ...] = ((self.queues, names),)
        else:
            lanes = tuple(
                (
                    self.queues if lane.queues is None else tuple(q for q in self.queues if q in lane.queues),
                    names if lane.names is None else names & lane.names,
                )
                for lane in policy.lanes
            )
        chunk = self.current_chunk_size()
        tail = self._tail(chunk)
        claims: list[Claim] = []
        self._full_queues = False
        for queues, lane_names in lanes:
            if not queues or not lane_names or len(claims) >= want:
                continue
            if self.queue_slots is None:
                asks = [(queues, want - len(claims))]
            else:
                with self._cond:
                    held = dict(self._held)
                    for c in claims:  # claimed in this round, not yet counted
                        held[c.tasks[0].queue] = held.get(c.tasks[0].queue, 0) + 1
                self._turn += 1
                budgets = slots.queue_budgets(
                    slots.rotate(queues, self._turn), self.queue_slots, held, want - len(claims)
                )
                self._full_queues = self._full_queues or any(held.get(q, 0) >= self.queue_slots[q] for q in queues)
                asks = [((q,), n) for q, n in budgets]
            for ask_queues, n in asks:
                if n <= 0 or len(claims) >= want:
                    continue
                got = self.store.claim(
                    self.id,
                    ask_queues,
                    min(n, want - len(claims)),
                    names=lane_names,
                    chunk_size=chunk,
                    tail=tail,
                    lease_seconds=self.lease_seconds,
                    **extra,
                )
                claims += got
                if any(c.group is not None for c in got):
                    self._grouped_at = time.monotonic()
                retried = sum(1 for c in got if _is_retry(c, prefetch))
                for key in ("retry_cap", "retry_max"):
                    if extra.get(key) is not None:
                        extra[key] = max(0, extra[key] - retried)
        return claims

    def _claim_extra(self, policy: DispatchPolicy, prefetch: bool) -> dict[str, Any]:
        """The claim's options that follow from the policy and the retries held here."""
        extra: dict[str, Any] = {"only_retries": True} if policy.only_retries else {}
        if prefetch:
            extra["prefetch"] = True
        if self.retry_share is not None and not policy.only_retries:
            # the share bounds the retries this worker *holds*, not each claim
            slots_now = self.concurrency if policy.slots is None else min(self.concurrency, policy.slots)
            with self._cond:
                retries_held = self._retries_held
                fresh_peak = self._fresh_peak.peak(time.monotonic())
            extra["retry_share"] = self.retry_share
            extra["retry_cap"] = validation.held_retry_cap(slots_now, self.retry_share, retries_held)
            if fresh_peak:
                # fresh work came a moment ago: keep room for its next arrivals
                room = slots.retry_room(slots_now, self.retry_share, fresh_peak)
                extra["retry_max"] = max(0, room - retries_held)
            if prefetch:
                # retries are claimed into free slots only: a retry held ahead
                # would take a turn fresh arrivals need
                extra["retry_cap"] = extra["retry_max"] = 0
        return extra

    @property
    def prefetch(self) -> int:
        """Units this worker may hold beyond its free slots now: the number
        given, or one sized from how long its units take (see
        :func:`corral.core.pacing.auto_prefetch`)."""
        if self.prefetch_given is not None:
            return self.prefetch_given
        return auto_prefetch(self.concurrency, self._unit_time.known())

    def _tail(self, chunk: int, *, read: bool = True) -> tuple[int, int] | None:
        """Chunks for the end of the queued work (:func:`tail_split`), for a
        worker that sizes its chunks itself and ran grouped work a moment
        ago (plain work has no chunks: no count is read for it). With
        ``read`` false the last count stands, however old: a handover must
        not wait for a count (see :meth:`_completer_loop`)."""
        now = time.monotonic()
        if chunk <= 1 or self.chunk_size is not None or now - self._grouped_at > TAIL_GROUPED_WITHIN:
            return None
        bound = tail_bound(chunk, self.concurrency)
        read_at, backlog = self._backlog
        every = TAIL_LOOK_EVERY
        if backlog is not None and backlog >= bound:
            # far from the end: look again before a quarter of the bound can
            # have run (about a chunk's time), within these limits
            every = min(TAIL_FAR_LOOK_EVERY, max(every, chunk * (self._auto_chunk.known() or 0.0)))
        if read and now - read_at > every:
            try:
                backlog = self.store.backlog(bound)
            except StoreError as exc:
                log.debug("reading the backlog failed: %s", exc)
                backlog = None
            self._backlog = (now, backlog)
        return None if backlog is None else tail_split(chunk, backlog, self.concurrency)

    def current_chunk_size(self) -> int:
        """The chunk size the next claim asks for: the one given, or one
        sized from the durations of the tasks run here so far."""
        return self.chunk_size if self.chunk_size is not None else self._auto_chunk.size()

    def _idle_wait(self) -> float:
        """How long an idle dispatcher waits for work: briefly while a drain
        waits for a claim to find nothing."""
        return min(self.poll_interval, 0.02) if self._draining else self.poll_interval

    def _relay_due(self, unit: _Unit, tasks_left: int) -> bool:
        """Should ``unit``, about to run its last ``tasks_left`` tasks, ask
        for its successor now? Only a unit under a capped limit's place
        (others free their slot at once, and a prefetch covers them), in a
        store that hands places over."""
        if not unit.claim.tasks[0].limits or not self.store.hands_over or self._stop_claiming.is_set():
            return False
        return relay_due(tasks_left, self._auto_chunk.known(), relay_lead(self._handover_time.known()))

    def _release(self, unit: _Unit) -> None:
        """Free a unit's slot; for a group or a limit, only once its outcomes
        are in the store, so the next claim already sees them free (no empty
        claims). Other units free their slot at once. A successor relayed
        to the unit takes its slot instead."""
        successor = self._relay_end(unit)
        if successor is not None:
            self._pass_place(unit, successor)
            return
        first = unit.claim.tasks[0]
        if unit.claim.group is None and not first.limits:
            self._settle(unit)
        else:
            self._to_completer(unit)

    @staticmethod
    def _relay_end(unit: _Unit) -> _Unit | None:
        """At a unit's end: the successor waiting in its place, if one is
        there and still to run; no relay comes after this."""
        with unit.lock:
            successor, unit.successor = unit.successor, None
            unit.relay = RELAY_CLOSED
        if successor is None:
            return None
        with successor.lock:
            return None if successor.lost or successor.done else successor

    def _pass_place(self, unit: _Unit, successor: _Unit) -> None:
        """``unit`` ended: its successor takes its slot, in one step (the
        dispatcher never sees the slot free), and the place it holds under
        its limits (the lease token they share)."""
        counted = self._end(unit)
        with successor.lock:
            successor.slot_freed = False  # counted in flight from now on
        with self._cond:
            if counted is not None:
                self._forget(unit, counted)
            self._count(successor, +1)
            self._inflight += 1
            self._cond.notify_all()
        self._inbox.put(successor)

    def _settle(self, unit: _Unit) -> bool:
        """Mark a unit's slot free exactly once."""
        counted = self._end(unit)
        if counted is None:
            return False
        with self._cond:
            self._forget(unit, counted)
            self._cond.notify_all()
        return True

    @staticmethod
    def _end(unit: _Unit) -> bool | None:
        """Mark a unit done exactly once: whether its slot still counts in
        flight, or None if it was done already."""
        with unit.lock:
            if unit.done:
                return None
            unit.done = True
            return not unit.slot_freed

    def _forget(self, unit: _Unit, counted: bool) -> None:
        """Take a unit that ended out of the counts (lock held)."""
        if counted:
            self._inflight -= 1
            self._count(unit, -1)
        self._units.discard(unit)

    # ---- slots ---------------------------------------------------------------
    def _slot_loop(self) -> None:
        while True:
            unit = self._inbox.get()
            if unit is None:
                return
            try:
                if not self._run_unit(unit):
                    return  # abandoned by the watchdog: a new slot replaced this one
            except Exception:  # noqa: BLE001 - never lose a slot to a bug
                log.exception("slot crashed running a unit")
                self._settle(unit)

    def _run_unit(self, unit: _Unit) -> bool:
        """Run a unit's tasks in order; False when the watchdog took this slot's task."""
        tasks = unit.claim.tasks
        token = unit.claim.token
        began = time.monotonic()
        for i, rec in enumerate(tasks):
            if not (unit.lost or unit.done) and not self._lease_stands(unit):
                if self._lease_gone(unit, i):
                    break
            # Commit to the next task under the unit's lock, so a shutdown
            # handing the unit back sees exactly which task is under way.
            with unit.lock:
                if unit.done:
                    return True
                if unit.lost:
                    if unit.given_back:
                        return True  # not ours to free: in flight until the hand-back is written
                    break  # the sweeper (or a shutdown) owns the rest
                unit.begun = i
                if i > 0 or unit.prefetched:  # the store recorded no start: the outcome does
                    rec.attempt += 1
                    unit.uncounted.add(rec.id)
                ctx = Context(self.store, rec, token, rec.attempt, self.max_payload_bytes)
                run = _Run(unit, rec, ctx, None if rec.timeout is None else self.clock.monotonic() + rec.timeout)
                self._runs[rec.id] = run
                relay = unit.relay == RELAY_NONE and self._relay_due(unit, len(tasks) - i)
                if relay:
                    unit.relay = RELAY_ASKED
            if relay:
                self._to_completer(_Relay(unit))
            status = self._run_task(unit, rec, token, run)
            if status is None:
                return False  # abandoned
            if status in (State.RETRYING, State.PENDING) or (status is State.FAILED and rec.halt_group_on_failure):
                self._hand_back(unit, tasks[i + 1 :], token)
                break
        self._unit_time.observe(time.monotonic() - began)
        self._release(unit)
        return True

    def _lease_stands(self, unit: _Unit) -> bool:
        """May the unit's next task start? Only under a lease that surely
        still stands: one renewed lately enough (no round trip), or renewed
        now. A worker that was stopped or cut off past its lease may find its
        unit swept and its tasks run elsewhere; it must start none of them."""
        if unit.lease_until - self.clock.monotonic() > self.lease_seconds * LEASE_MARGIN:
            return True
        token = unit.claim.token
        asked = self.clock.monotonic()
        try:
            reply = self.store.heartbeat({token}, self.lease_seconds)
        except StoreError as exc:
            log.warning("renewing a lease before a task's start failed: %s", exc)
            return False
        if token in reply.lost_tokens:
            self._hook("on_leases_lost", self.id, {token})
            return False
        unit.lease_until = max(unit.lease_until, asked + self.lease_seconds)
        return True

    def _lease_gone(self, unit: _Unit, i: int) -> bool:
        """The unit's lease may be gone before its task ``i`` started: give
        that task and the rest back (fenced by the lease token: if a sweep
        took them already, the hand-back changes nothing). False when the
        unit was let go meanwhile (a stop, the heartbeat): that path ends it."""
        tasks = unit.claim.tasks
        with unit.lock:
            if unit.lost or unit.done:
                return False
            unit.lost = True
        rest = tasks[i:]
        if i == 0 and not unit.prefetched:  # the claim counted the head's attempt: give it back too
            first = rest[0]
            self._to_completer(
                Outcome(first.id, unit.claim.token, first.version, State.PENDING, attempt=first.attempt - 1)
            )
            rest = rest[1:]
        self._hand_back(unit, rest, unit.claim.token)
        log.warning(
            "worker %s: the lease of task(s) %s may have run out before they started (not renewed for %.1fs);"
            " giving them back",
            self.id,
            ", ".join(str(t.id) for t in tasks[i:]),
            self.clock.monotonic() - (unit.lease_until - self.lease_seconds),
        )
        return True

    def _run_task(self, unit: _Unit, rec: TaskRecord, token: str, run: _Run) -> State | None:
        """Run one task; return its outcome state, or None if the watchdog
        (or a shutdown) took it over."""
        tdef = self.registry.get(rec.name)
        started_at = self.clock.time()
        began = time.monotonic()
        held = rec.id in unit.uncounted  # the store has no start for it: record one if it runs on
        if held:
            with self._starts_lock:
                self._starts[rec.id] = (began + START_RECORD_AFTER, token, rec.attempt, started_at)
        ctx = run.ctx
        if log.isEnabledFor(logging.DEBUG):
            log.debug("task %s (%s) started", rec.id, rec.name, extra=task_fields(rec))
        span = tracing.start_attempt(rec, rec.attempt) if tracing.ENABLED else None
        if span is not None:
            ctx._span_id = span.span_id
        timeout = rec.timeout
        outcome: Outcome | None = None
        _set_current(ctx)
        try:
            if tdef is None:
                raise PermanentError(f"unknown task {rec.name!r}: not registered in this worker's app")
            try:
                args, kwargs = rec.arguments
            except Exception as exc:  # noqa: BLE001
                raise PermanentError(f"cannot decode the task's arguments: {exc}") from exc
            if ctx.canceled:
                raise Canceled("canceled before start")
            if tdef.isolation == "process":
                run.deadline = None  # the process run times itself out and kills the child
                ups = ctx._upstream() if tdef.takes_ctx else ()  # the child cannot reach the store
                meta = (rec.id, rec.trace_id, rec.attempt, ctx.checkpoints, ctx._span_id, ups, self.max_payload_bytes)
                run.proc = ProcessRun(
                    tdef.fn,
                    tdef.takes_ctx,
                    args,
                    kwargs,
                    meta,
                    lambda m: self._child_message(ctx, m),
                    retry_on=tdef.retry_on,
                    permanent_on=tdef.permanent_on,
                )
                value = run.proc.wait(timeout)
            else:
                call_args = (ctx, *args) if tdef.takes_ctx else tuple(args)
                value = tdef.fn(*call_args, **kwargs)
                if inspect.iscoroutine(value):
                    value = run_async(value, on_future=lambda f: setattr(run, "future", f))
            try:
                result = dumps(value)
            except (TypeError, ValueError) as exc:
                raise PermanentError(f"result is not JSON-serialisable: {exc}") from exc
            too_big = validation.payload_problem(result, self.max_payload_bytes, "the result")
            if too_big is not None:
                raise PermanentError(too_big)
            outcome = Outcome(
                rec.id, token, rec.version, State.SUCCESS, result=result, started_at=started_at, breaker_failure=False
            )
        except _CANCELED:
            outcome = Outcome(rec.id, token, rec.version, State.CANCELED, error="canceled", started_at=started_at)
        except TimeoutError as exc:
            if run.proc is not None and run.proc.killed_for == "timeout":
                outcome = self._timeout_outcome(rec, token, started_at)
            else:
                outcome = self._failure_outcome(rec, token, exc, tdef, started_at)
        except BaseException as exc:  # noqa: BLE001 - a task's error is data
            outcome = self._failure_outcome(rec, token, exc, tdef, started_at)
        finally:
            _set_current(None)
            self._runs.pop(rec.id, None)
            if held:  # the outcome records the start from now on
                with self._starts_lock:
                    self._starts.pop(rec.id, None)
            self._auto_chunk.observe(time.monotonic() - began)
            if span is not None:
                ended = ("ABANDONED", None) if outcome is None else (outcome.status.value, outcome.error)
                tracing.end_attempt(span, *ended)
        assert outcome is not None  # every way out of the body above sets it
        if held:  # a snooze never counts: the attempt raised at its start goes back
            outcome.attempt = rec.attempt - 1 if outcome.snooze else rec.attempt
        late = None
        with unit.lock:
            run.finished = True
            if run.abandoned:
                late, run.late_outcome = run.late_outcome, None
        if run.abandoned:
            if late is not None:  # the lane was held for this thread: free it now
                self._abandoned.pop(rec.id, None)
                log.info(
                    "task %s (%s): its timed-out thread ended; writing the timeout",
                    rec.id,
                    rec.name,
                    extra=task_fields(rec),
                )
                self._to_completer(late)
                self._release(unit)
            return None
        self._log_outcome(rec, texts.safe_outcome(outcome))
        self._to_completer(outcome)
        return outcome.status

    def _log_outcome(self, rec: TaskRecord, outcome: Outcome) -> None:
        """One line per finished attempt at the level it deserves (a success
        only at DEBUG: a busy worker writes nothing per task by default)."""
        status = outcome.status
        level = _OUTCOME_LEVELS.get(status, logging.INFO)
        if not log.isEnabledFor(level):
            return
        # a failed attempt's traceback (bounded) below its line
        tb = f"\n{outcome.traceback}" if outcome.traceback else ""
        if status is State.SUCCESS:
            log.log(level, "task %s (%s) succeeded", rec.id, rec.name, extra=task_fields(rec))
        elif status is State.RETRYING:
            log.log(
                level,
                "task %s (%s) will run again: %s%s",
                rec.id,
                rec.name,
                _error_line(outcome.error),
                tb,
                extra=task_fields(rec),
            )
        else:
            log.log(
                level,
                "task %s (%s) ended %s: %s%s",
                rec.id,
                rec.name,
                status.value,
                _error_line(outcome.error),
                tb,
                extra=task_fields(rec),
            )

    def _failure_outcome(
        self, rec: TaskRecord, token: str, exc: BaseException, tdef: TaskSpec | None, started_at: float
    ) -> Outcome:
        snooze = self._snooze_outcome(rec, token, exc, started_at)
        if snooze is not None:
            return snooze
        if isinstance(exc, ChildFailed):
            retryable, text = exc.retryable, exc.error
        else:
            retryable = tdef is not None and is_retryable(exc, tdef.retry_on, tdef.permanent_on)
            text = "".join(traceback.format_exception_only(type(exc), exc)).strip()
        verdict = counts_as_failure(exc, permanent=not retryable)
        if tdef is not None and retryable and rec.attempt <= rec.max_retries:
            delay = retry_delay(exc, rec.attempt, tdef.backoff)
            outcome = self._retry_later(rec, token, text, delay, started_at, verdict)
        else:
            if retryable and rec.max_retries:
                text = f"{text} (gave up after {rec.attempt} attempts)"
            outcome = Outcome(
                rec.id, token, rec.version, State.FAILED, error=text, started_at=started_at, breaker_failure=verdict
            )
        outcome.traceback = texts.traceback_of(exc)
        return outcome

    def _retry_later(
        self, rec: TaskRecord, token: str, error: str, delay: float, started_at: float, breaker_failure: bool
    ) -> Outcome:
        """A failed attempt with retries left: RETRYING after its backoff."""
        return Outcome(
            rec.id,
            token,
            rec.version,
            State.RETRYING,
            error=error,
            run_at=self.store.now() + delay,
            started_at=started_at,
            breaker_failure=breaker_failure,
        )

    def _snooze_outcome(self, rec: TaskRecord, token: str, exc: BaseException, started_at: float) -> Outcome | None:
        """``Retry`` (and a 429 with Retry-After under a limit) runs the task
        again later without counting a failure: the attempt is given back and a
        snooze counted, up to MAX_SNOOZES. A 429 also pauses the task's limits
        fleet-wide for as long as the downstream asked."""
        pause = None
        if isinstance(exc, Retry):
            now = self.store.now()
            after = retry_delay(exc, rec.snoozes + 1, Backoff())  # no ``after``: a growing pause
            reason = str(exc)
        elif rec.limits and http_status(exc) == 429:
            now = self.store.now()
            ra = retry_after(exc, now)
            if ra is None:
                return None
            after = pause = ra
            reason = f"429 from downstream: retry after {ra:g}s"
        else:
            return None
        if rec.snoozes >= MAX_SNOOZES:
            text = f"asked to run later {rec.snoozes} times, the most a task may (last: {reason})"
            return Outcome(rec.id, token, rec.version, State.FAILED, error=text, started_at=started_at)
        return Outcome(
            rec.id,
            token,
            rec.version,
            State.RETRYING,
            error=reason,
            run_at=now + after,
            started_at=started_at,
            snooze=True,
            pause_limits=pause,
        )

    def _timeout_outcome(self, rec: TaskRecord, token: str, started_at: float) -> Outcome:
        text = f"timed out after {rec.timeout:g}s (attempt {rec.attempt})"
        if rec.attempt <= rec.max_retries:
            tdef = self.registry.get(rec.name)
            delay = tdef.backoff.delay(rec.attempt) if tdef else 1.0
            return self._retry_later(rec, token, text, delay, started_at, True)
        return Outcome(
            rec.id, token, rec.version, State.TIMEOUT, error=text, started_at=started_at, breaker_failure=True
        )

    def _child_message(self, ctx: Context, msg: tuple[Any, ...]) -> None:
        if msg[0] == "progress":
            self.store.set_progress(ctx.task_id, ctx._token, msg[1], msg[2])
        elif msg[0] == "checkpoint":
            self.store.save_checkpoint(ctx.task_id, ctx._token, msg[1], msg[2])

    def _hand_back(self, unit: _Unit, rest: list[TaskRecord], token: str) -> None:
        """Give unstarted tasks of a chunk back to the queue, attempts intact."""
        for rec in rest:
            self._to_completer(Outcome(rec.id, token, rec.version, State.PENDING, attempt=rec.attempt))

    def _hand_back_all(self) -> None:
        """After the grace period: give every unfinished task back, attempts intact.

        A task under way is abandoned (its process killed) and given back; its
        thread, if it ever returns, writes nothing. A timed-out thread's task
        is left to :meth:`_let_go_abandoned`."""
        with self._cond:
            units = list(self._units)
        token_tasks: list[tuple[_Unit, list[TaskRecord]]] = []
        for unit in units:
            tasks = unit.claim.tasks
            with unit.lock:
                if unit.done or unit.slot_freed:
                    continue
                unit.lost = True  # its slot starts nothing more
                if unit.begun < 0:  # claimed, never started: the claim counted task 0's attempt (unless prefetched)
                    first = tasks[0]
                    given = first.attempt if unit.prefetched else first.attempt - 1
                    self._to_completer(Outcome(first.id, unit.claim.token, first.version, State.PENDING, attempt=given))
                    self.handed_back += 1
                    rest = tasks[1:]
                else:
                    run = self._runs.get(tasks[unit.begun].id)
                    if run is not None and not run.finished:
                        run.abandoned = True
                        if run.proc is not None:
                            run.proc.kill("shutdown")
                        rec = run.record
                        self._to_completer(
                            Outcome(rec.id, unit.claim.token, rec.version, State.PENDING, attempt=rec.attempt - 1)
                        )
                        self.handed_back += 1
                    rest = tasks[unit.begun + 1 :]
            token_tasks.append((unit, rest))
        for unit, rest in token_tasks:
            self._hand_back(unit, rest, unit.claim.token)
            self.handed_back += len(rest)
            self._release(unit)

    def _hand_back_prefetched(self) -> int:
        """At stop: give back at once the prefetched units no slot has
        started, attempts intact (their start was never recorded), rather
        than start them during the grace period. Returns the tasks given back."""
        with self._cond:
            units = [u for u in self._units if u.prefetched]
        given = 0
        for unit in units:
            with unit.lock:
                if unit.done or unit.lost or unit.begun >= 0:
                    continue
                unit.lost = True  # a slot that picks it up starts nothing
                unit.given_back = True
            self._hand_back(unit, unit.claim.tasks, unit.claim.token)
            given += len(unit.claim.tasks)
            # free it once the hand-back is written: not in flight means back in the queue
            self._to_completer(unit)
        return given

    def _let_go_abandoned(self) -> None:
        """At stop: timed-out threads still running keep their tasks' leases,
        no longer renewed; the sweeper recovers the tasks when the leases run
        out. Writing their outcome now would let another worker start a task
        whose thread may still run here."""
        runs = list(self._abandoned.values())
        self.abandoned_at_stop = len(runs)
        for run in runs:
            with run.unit.lock:
                run.late_outcome = None  # a thread that ends after this writes nothing
            self._abandoned.pop(run.record.id, None)
            self._settle(run.unit)
        if runs:
            log.warning(
                "worker %s: %d timed-out task thread(s) still running at stop: task(s) %s stay leased"
                " until the lease runs out, then the sweeper recovers them",
                self.id,
                len(runs),
                ", ".join(str(r.record.id) for r in runs),
            )

    # ---- writing outcomes ------------------------------------------------------
    def _to_completer(self, item: Outcome | _Unit | _Relay) -> None:
        """An outcome to write, a unit whose slot frees once what came before
        it is written, or a unit near its end that asks for its successor."""
        with self._completer_gate:
            self._completer_idle.clear()
            self._completer_q.put(item)

    def _apply(self, outcomes: list[Outcome]) -> None:
        """Write outcomes; through an outage, for as long as it lasts (each
        write is fenced by its lease token, so one that comes too late
        changes nothing, and sweepers leave leases that ran out during an
        outage to their workers for a while after it). Other errors are
        tried a few times."""
        failures = 0
        while True:
            try:
                applied = self.store.complete(outcomes)
                self._writes += 1
                break
            except StoreUnavailable as exc:
                if failures == 0:
                    log.warning(
                        "completing %d outcome(s) failed (%s); retrying until the store is back", len(outcomes), exc
                    )
                failures += 1
                time.sleep(min(_OUTAGE_PAUSE, 0.1 * 2**failures))
            except StoreError as exc:  # a bug surfaces after a few tries
                failures += 1
                if failures >= _COMPLETE_TRIES:
                    log.error("gave up writing %d outcome(s) (%s); the sweeper will recover them", len(outcomes), exc)
                    return
                log.warning("completing %d outcome(s) failed (%s); retrying", len(outcomes), exc)
                time.sleep(min(_COMPLETE_MAX_PAUSE, 0.2 * 2**failures))
        self._applied(outcomes, applied)

    def _hand_over(
        self, outcomes: list[Outcome], ended: list[_Unit], names: frozenset[str], relays: Sequence[_Unit] = ()
    ) -> list[Claim] | None:
        """Write the outcomes and claim the ended units' successors in one
        transaction: a place under a limit passes from one unit to the next
        with no moment free, no claim of the dispatcher's and no wait for
        the limit's lock. None when it cannot be done now (the outcomes are
        then written as usual, and the dispatcher claims): also when more
        units ended than one claim may take (a level that shrinks claims), as
        the places left over must be announced to every worker.

        ``relays`` are units near their end that asked for a successor: one
        claimed for such a unit waits in its place (:meth:`_relayed`)."""
        policy: DispatchPolicy = self._hook("dispatch")
        if (
            not self.store.hands_over
            or policy.max_units is None
            or len(ended) > policy.max_units
            or not self._unrestricted(policy)
        ):
            self._relayed(relays, {})
            return None
        chunk = self.current_chunk_size()
        began = time.monotonic()
        self._handover_asked = self.clock.monotonic()
        try:
            applied, claims = self.store.complete_and_claim(
                outcomes,
                [u.claim.tasks[0].limits for u in ended],
                self.id,
                self.queues,
                relays=[(u.claim.token, u.claim.tasks[0].limits) for u in relays],
                names=names,
                chunk_size=chunk,
                tail=self._tail(chunk, read=False),
                lease_seconds=self.lease_seconds,
                **self._claim_extra(policy, False),
            )
        except StoreError as exc:
            log.warning("handing %d place(s) over failed (%s); writing the outcomes alone", len(ended), exc)
            self._relayed(relays, {})
            return None
        self._handover_time.observe(time.monotonic() - began)
        self._writes += 1
        self._applied(outcomes, applied)
        if any(c.group is not None for c in claims):
            self._grouped_at = time.monotonic()
        tokens = {u.claim.token for u in relays}
        self._relayed(relays, {c.token: c for c in claims if c.token in tokens})
        return [c for c in claims if c.token not in tokens]

    def _relayed(self, relays: Sequence[_Unit], successors: Mapping[str, Claim]) -> None:
        """Put each relayed successor in its predecessor's place: it waits
        there (held, not counted in flight) until the predecessor ends. A
        predecessor that ended meanwhile hands its place over to it now; one
        that was let go (a stop, a lost lease) gives it back."""
        for unit in relays:
            claim = successors.get(unit.claim.token)
            if claim is None:
                with unit.lock:
                    if unit.relay == RELAY_ASKED:
                        unit.relay = RELAY_CLOSED
                continue
            self._hook("on_claims", self.id, [claim])
            successor = _Unit(
                claim, prefetched=True, slot_freed=True, lease_until=self._handover_asked + self.lease_seconds
            )
            with self._cond:
                self._units.add(successor)
            with unit.lock:
                waiting = unit.relay == RELAY_ASKED and not unit.lost and not unit.done
                if waiting:
                    unit.relay, unit.successor = RELAY_GIVEN, successor
            if waiting:
                continue
            with unit.lock:
                stays = not unit.lost and not unit.done
            if stays:  # it ended a moment ago: its end, still queued here, hands nothing over
                self._pass_place(unit, successor)
            else:
                self._give_back(successor)

    def _give_back(self, successor: _Unit) -> None:
        """Give a relayed successor that never started back to the queue,
        attempts intact; it leaves the units once the hand-back is written."""
        with successor.lock:
            successor.lost = successor.given_back = True
        self._hand_back(successor, successor.claim.tasks, successor.claim.token)
        self.handed_back += len(successor.claim.tasks)
        self._to_completer(successor)

    def _take_over(self, ended: list[_Unit], claims: list[Claim]) -> None:
        """Free the ended units' slots and fill them with their successors in
        one step, so the dispatcher never counts them free meanwhile."""
        if claims:
            self._hook("on_claims", self.id, claims)
        units = [_Unit(c, lease_until=self._handover_asked + self.lease_seconds) for c in claims]
        ends = [(unit, self._end(unit)) for unit in ended]
        with self._cond:
            for unit, counted in ends:
                if counted is not None:
                    self._forget(unit, counted)
            self._units.update(units)
            for unit in units:
                self._count(unit, +1)
            self._inflight += len(units)
            self._cond.notify_all()
        for unit in units:
            self._inbox.put(unit)

    def _applied(self, outcomes: list[Outcome], applied: list[bool]) -> None:
        for o, ok in zip(outcomes, applied):
            if not ok:
                log.info(
                    "task %s: late or stale outcome %s discarded",
                    o.task_id,
                    o.status.value,
                    extra={"task_id": o.task_id, "attempt": o.attempt},
                )
        self._hook("on_outcomes", outcomes, applied)

    def _completer_loop(self) -> None:
        q = self._completer_q
        window = self.completer_window
        names = frozenset(self.registry)
        while True:
            try:
                first = q.get(timeout=self._start_wait())
            except queue.Empty:
                self._write_starts()
                continue
            items: list[Outcome | _Unit | _Relay] = [first]
            # Gather for a moment: one write per batch, not per task. A unit
            # waiting for its slot (a marker in the queue) ends the wait.
            waiting = isinstance(items[0], (_Unit, _Relay))
            deadline = time.monotonic() + window
            while len(items) < 512:
                try:
                    if waiting:
                        item = q.get_nowait()
                    else:
                        left = deadline - time.monotonic()
                        item = q.get(timeout=left) if left > 0 else q.get_nowait()
                except queue.Empty:
                    break
                items.append(item)
                waiting = waiting or isinstance(item, (_Unit, _Relay))
            self._write_starts()
            outcomes = [x for x in items if isinstance(x, Outcome)]
            # (a unit whose relayed successor took its place is done already)
            ended = [x for x in items if isinstance(x, _Unit) and not x.lost and not x.done]
            relays = [x.unit for x in items if isinstance(x, _Relay) and x.unit.relay == RELAY_ASKED]
            successors = self._hand_over(outcomes, ended, names, relays) if ended or relays else None
            if successors is None:
                if outcomes:
                    self._apply(outcomes)
            else:
                self._take_over(ended, successors)
                # the count the handover used, read again if it is due: after
                # the places passed over, not while they waited (a count is
                # a few milliseconds on PostgreSQL)
                self._tail(self.current_chunk_size())
            for x in items:
                if isinstance(x, _Unit):
                    self._settle(x)
            with self._completer_gate:
                if q.empty():
                    self._completer_idle.set()

    def _start_wait(self) -> float:
        """How long the completer may wait for an item: until the next start
        is due to be written (or a while, for a start noted meanwhile)."""
        with self._starts_lock:
            first = next(iter(self._starts.values()), None)
        wait = START_RECORD_AFTER if first is None else first[0] - time.monotonic()
        wait = max(wait, self._starts_written_at + START_WRITE_EVERY - time.monotonic())
        return max(0.001, wait)

    def _write_starts(self) -> None:
        """Record, in one write, the starts of held tasks running for a while."""
        now = time.monotonic()
        if now < self._starts_written_at + START_WRITE_EVERY:
            return
        with self._starts_lock:
            due = [Start(tid, tok, n, at) for tid, (when, tok, n, at) in self._starts.items() if when <= now]
            for st in due:
                del self._starts[st.task_id]
        if not due:
            return
        self._starts_written_at = now
        try:
            self.store.record_starts(due)
        except StoreError as exc:  # the outcomes record them; only the view waits
            log.warning("recording %d start(s) failed (%s); their outcomes record them", len(due), exc)

    def _flush(self, timeout: float | None) -> bool:
        end = None if timeout is None else time.monotonic() + timeout
        while not (self._completer_q.empty() and self._completer_idle.is_set()):
            if end is not None and time.monotonic() > end:
                return False
            self._completer_idle.wait(0.01)
        return True

    # ---- watchdog, heartbeat, sweeper ---------------------------------------------
    def _watchdog_loop(self) -> None:
        while not self._stopped.is_set():
            now = self.clock.monotonic()
            next_check = 0.05
            for run in list(self._runs.values()):
                if run.deadline is None or run.finished or run.abandoned:
                    continue
                if run.deadline <= now:
                    self._time_out(run)
                else:
                    next_check = min(next_check, run.deadline - now)
            self._stopped.wait(max(0.005, next_check))

    def _time_out(self, run: _Run) -> None:
        """Time out a thread task. Its thread cannot be stopped, so by default
        the task keeps its lease (and so its group and limits) until the
        thread really ends, and only then is the timeout written; the slot is
        replaced so concurrency holds. A task with ``overlap_on_timeout``
        gets its outcome at once and frees its lane."""
        unit = run.unit
        rec = run.record
        tdef = self.registry.get(rec.name)
        overlap = bool(getattr(tdef, "overlap_on_timeout", False))
        outcome = self._timeout_outcome(rec, unit.claim.token, self.clock.time() - (rec.timeout or 0))
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
                self._abandoned[rec.id] = run
                # a successor relayed to it would wait for the thread's end: back to the queue
                waiting, unit.successor, unit.relay = unit.successor, None, RELAY_CLOSED
        if run.future is not None:
            run.future.cancel()
        self._hand_back(unit, unit.claim.tasks[unit.begun + 1 :], unit.claim.token)
        if waiting is not None:
            self._give_back(waiting)
        if overlap:
            log.warning(
                "task %s (%s) timed out after %ss; abandoning its thread",
                rec.id,
                rec.name,
                rec.timeout,
                extra=task_fields(rec),
            )
            self._runs.pop(rec.id, None)
            self._to_completer(outcome)
            self._spawn_slot()
            self._release(unit)
            return
        held = len(self._abandoned)
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
            self._stop_claiming.set()  # before the slot is freed, so nothing is claimed into it
            self.handed_back += self._hand_back_prefetched()  # they would wait for a slot in vain
        self._spawn_slot()
        with self._cond:
            self._inflight -= 1  # the unit stays in _units: the heartbeat keeps its lease
            self._count(unit, -1)
            self._cond.notify_all()

    def _heartbeat_loop(self) -> None:
        # Renewals follow the clock leases are measured on; the loop itself
        # wakes on real time, at least once a second.
        next_renewal = self.clock.monotonic() + self.heartbeat_interval
        next_stray_check = time.monotonic() + min(self.stray_check_interval, 5.0)
        while not self._stopped.wait(min(self.cancel_poll_interval, self.heartbeat_interval)):
            if time.monotonic() >= next_stray_check:
                next_stray_check = time.monotonic() + self.stray_check_interval
                self._check_strays()
            if self.clock.monotonic() < next_renewal:
                self._poll_cancels()
                continue
            asked = self.clock.monotonic()
            next_renewal = asked + self.heartbeat_interval
            with self._cond:
                units = list(self._units)
            tokens = {u.claim.token for u in units}
            if not tokens:
                continue
            try:
                reply = self.store.heartbeat(tokens, self.lease_seconds)
            except StoreError as exc:
                # try again soon: once the store is back, leases that ran out
                # meanwhile are renewed before a sweeper takes them
                log.warning("heartbeat failed: %s", exc)
                next_renewal = min(next_renewal, self.clock.monotonic() + RENEW_RETRY)
                continue
            for u in units:
                if u.claim.token not in reply.lost_tokens:
                    u.lease_until = max(u.lease_until, asked + self.lease_seconds)
            for tid in reply.cancel_requested:
                self.cancel_local(tid)
            with self._cond:
                lost_units = [u for u in self._units if u.claim.token in reply.lost_tokens]
            for u in lost_units:  # units that finished meanwhile are not lost
                u.lost = True
            if lost_units:
                log.warning("lost %d lease(s); their results will be discarded", len(lost_units))
                self._hook("on_leases_lost", self.id, {u.claim.token for u in lost_units})

    def _poll_cancels(self) -> None:
        """Between renewals, ask the store (one read for all) which tasks
        running here were asked to cancel, so a cancel from another process
        lands within a second."""
        ids = [tid for tid, run in list(self._runs.items()) if not run.ctx.canceled]
        if not ids:
            return
        try:
            asked = self.store.cancel_requested(ids)
        except StoreError:  # the next renewal reports it too
            return
        for tid in asked:
            self.cancel_local(tid)

    def _check_strays(self) -> None:
        """Warn, once per name and queue, of queued tasks this worker cannot
        claim because it does not register their name: they wait, and hold
        their groups, until a worker that does comes along."""
        self._stray_checks += 1
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
        data = {"unregistered": unregistered, "abandoned_threads": self.abandoned_threads}
        try:
            self.store.add_event(HEALTH_EVENT, self.id, dumps(data))
        except (StoreError, NotImplementedError):  # a report, not the work: the next check sends it again
            pass
