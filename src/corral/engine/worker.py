"""The worker: claim, run, complete; plus its watchdog and heartbeat.

Threads, each with one job:

- the *dispatcher* claims at most as many units as there are free slots and
  hands them to slot threads (so a worker never holds work it cannot start);
- *slots* run a unit's tasks in order and report outcomes;
- the *watchdog* times out overdue tasks without their help (a hung task
  cannot be trusted to notice) and replaces an abandoned slot so concurrency
  holds;
- the *heartbeat* renews leases every third of the lease and, in between,
  looks for cancel requests of the tasks running here every second;
- the *completer* (durable stores) writes outcomes in batches; a unit of a
  group or under a limit frees its slot only once its outcomes are written;
- an optional *sweeper* loop, one leader at a time across the fleet.

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
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from corral.core import validation
from corral.core.clock import SYSTEM_CLOCK, Clock
from corral.core.model import DEFAULT_LEASE_SECONDS, Claim, Outcome, TaskRecord, dumps, new_holder_id
from corral.core.retries import is_retryable, retry_delay
from corral.core.states import State
from corral.engine.context import Context, _set_current
from corral.engine.executors import ProcessRun, run_async
from corral.engine.hooks import OPEN, UNLIMITED, DispatchPolicy, Hooks
from corral.engine.registry import Registry, TaskSpec
from corral.errors import Canceled, ChildFailed, PermanentError, StoreCorrupt, StoreError
from corral.stores.base import Store

log = logging.getLogger("corral.worker")

#: What a run raises when it was canceled (by ctx, or its coroutine was cancelled).
_CANCELED = (Canceled, asyncio.CancelledError, concurrent.futures.CancelledError)
#: Writing outcomes through a store outage: tries, and the longest pause between them.
_COMPLETE_TRIES = 5
_COMPLETE_MAX_PAUSE = 5.0


@dataclass(eq=False)
class _Unit:
    claim: Claim
    done: bool = False  # accounting settled (by its slot or by the watchdog)
    lost: bool = False  # lease gone, or handed back at shutdown: start nothing more
    begun: int = -1  # index of the last task this unit's slot committed to run
    #: chunk members started here whose start the store has not recorded yet:
    #: their outcome carries the attempt, so a chunk costs no extra write per task
    uncounted: set[int] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)


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
        queues: Sequence[str] = ("default",),
        chunk_size: int = 1,
        lease_seconds: float = DEFAULT_LEASE_SECONDS,
        heartbeat_interval: float | None = None,
        poll_interval: float = 0.5,
        sweep_interval: float | None = None,
        worker_id: str | None = None,
        completer_window: float = 0.005,
        cancel_poll_interval: float = 1.0,
        max_payload_bytes: int = validation.DEFAULT_MAX_PAYLOAD_BYTES,
    ):
        validation.worker_options(
            concurrency=concurrency,
            chunk_size=chunk_size,
            lease_seconds=lease_seconds,
            heartbeat_interval=heartbeat_interval,
            poll_interval=poll_interval,
            cancel_poll_interval=cancel_poll_interval,
            completer_window=completer_window,
            sweep_interval=sweep_interval,
        )
        self.max_payload_bytes = validation.max_payload_bytes(max_payload_bytes)
        self.store = store
        self.registry = registry
        self.hooks = hooks if hooks is not None else Hooks()
        self.clock = clock
        self.concurrency = concurrency
        self.queues = tuple(queues)
        self.chunk_size = max(1, chunk_size)
        self.lease_seconds = lease_seconds
        # renewing a lease writes every row of the claim: a third of the lease is plenty
        self.heartbeat_interval = heartbeat_interval or lease_seconds / 3
        self.poll_interval = poll_interval
        self.cancel_poll_interval = cancel_poll_interval
        self.sweep_interval = sweep_interval
        self.id = worker_id or new_holder_id()
        self._cond = threading.Condition()
        self._inflight = 0  # units claimed and not settled
        self._units: set[_Unit] = set()
        self._runs: dict[int, _Run] = {}
        self._inbox: queue.SimpleQueue[_Unit | None] = queue.SimpleQueue()
        self._stop_claiming = threading.Event()
        self._stopped = threading.Event()
        self._threads: list[threading.Thread] = []
        self._slots = 0
        self._completer_q: queue.SimpleQueue[Outcome | _Unit] | None = (
            queue.SimpleQueue() if self.store.shared else None
        )
        #: how long the completer gathers outcomes into one write
        self.completer_window = completer_window
        self._completer_idle = threading.Event()
        self._completer_idle.set()
        self.started = False
        self._sweeper: Any = None
        #: Set when the store failed for good (damaged, foreign, too new): the worker stopped claiming.
        self.fatal: StoreCorrupt | None = None

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
        if self._completer_q is not None:
            self._thread(self._completer_loop, "completer")
        if self.sweep_interval:
            from corral.maintenance.sweeper import Sweeper

            self._sweeper = Sweeper(self.store, interval=self.sweep_interval, holder=self.id).start()
        return self

    def _thread(self, target: Callable[[], None], name: str) -> threading.Thread:
        t = threading.Thread(target=target, name=f"corral-{name}", daemon=True)
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

    def stop(self, grace: float = 30.0) -> bool:
        """Stop claiming, let in-flight work finish for ``grace`` seconds, hand
        back what did not, and stop. Returns True if nothing had to be handed back."""
        self._stop_claiming.set()
        with self._cond:
            self._cond.notify_all()
        clean = self.wait_idle(grace)
        if not clean:
            self._hand_back_all()
        self._flush(10.0)
        self._stopped.set()
        if self._sweeper is not None:
            self._sweeper.stop()
        for _ in range(self._slots):
            self._inbox.put(None)
        # the dispatcher may sit in wait_for_work: let it return before the caller closes the store
        for t in self._threads:
            if t.name != "corral-completer":
                t.join(self.poll_interval + 2.0)
        return clean

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
            if policy.max_units is None:
                self.store.wait_for_work(self.poll_interval)
                continue
            with self._cond:
                cap = self.concurrency if policy.slots is None else min(self.concurrency, policy.slots)
                free = cap - self._inflight
                if free <= 0:
                    self._cond.wait(self.poll_interval)
                    continue
                # reserve the slots this claim may fill, so nothing else
                # counts them free while the claim is under way
                want = min(free, policy.max_units)
                self._inflight += want
            try:
                claims = self._claim(want, names, policy)
            except StoreCorrupt as exc:  # no retry can cure it: stop claiming, let the runner exit
                self.fatal = exc
                claims = None
                log.error("claim failed, stopping: %s", exc)
                self._stop_claiming.set()
            except StoreError as exc:  # an outage must not end the worker; a bug may
                claims = None
                log.warning("claim failed, will retry: %s", exc)
            with self._cond:
                self._inflight -= want - len(claims or ())
                self._cond.notify_all()
            if claims is None:
                self._stop_claiming.wait(min(2.0, self.poll_interval * 4))
                continue
            if not claims:
                self.store.wait_for_work(self.poll_interval)
                continue
            self._hook("on_claims", self.id, claims)
            for c in claims:
                unit = _Unit(c)
                with self._cond:
                    self._units.add(unit)
                self._inbox.put(unit)
            time.sleep(0)  # let the woken slots take the GIL before the next claim

    def _claim(self, want: int, names: frozenset[str], policy: DispatchPolicy) -> list[Claim]:
        """One claim, or one per lane of the policy until ``want`` is reached."""
        extra = {"only_retries": True} if policy.only_retries else {}
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
        claims: list[Claim] = []
        for queues, lane_names in lanes:
            if not queues or not lane_names or len(claims) >= want:
                continue
            claims += self.store.claim(
                self.id,
                queues,
                want - len(claims),
                names=lane_names,
                chunk_size=self.chunk_size,
                lease_seconds=self.lease_seconds,
                **extra,
            )
        return claims

    def _release(self, unit: _Unit) -> None:
        """Free a unit's slot; for a group or a limit, only once its outcomes
        are in the store, so the next claim already sees them free (no empty
        claims). Other units free their slot at once."""
        first = unit.claim.tasks[0]
        if self._completer_q is None or (unit.claim.group is None and not first.limits):
            self._settle(unit)
        else:
            self._completer_idle.clear()
            self._completer_q.put(unit)

    def _settle(self, unit: _Unit) -> bool:
        """Mark a unit's slot free exactly once."""
        with unit.lock:
            if unit.done:
                return False
            unit.done = True
        with self._cond:
            self._inflight -= 1
            self._units.discard(unit)
            self._cond.notify_all()
        return True

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
        for i, rec in enumerate(tasks):
            # Commit to the next task under the unit's lock, so a shutdown
            # handing the unit back sees exactly which task is under way.
            with unit.lock:
                if unit.done:
                    return True
                if unit.lost:
                    break  # the sweeper (or a shutdown) owns the rest
                unit.begun = i
                if i > 0:
                    rec.attempt += 1
                    unit.uncounted.add(rec.id)
                ctx = Context(self.store, rec, token, rec.attempt)
                run = _Run(unit, rec, ctx, None if rec.timeout is None else self.clock.monotonic() + rec.timeout)
                self._runs[rec.id] = run
            status = self._run_task(unit, rec, token, run)
            if status is None:
                return False  # abandoned
            if status in (State.RETRYING, State.PENDING) or (status is State.FAILED and rec.halt_group_on_failure):
                self._hand_back(unit, tasks[i + 1 :], token)
                break
        self._release(unit)
        return True

    def _run_task(self, unit: _Unit, rec: TaskRecord, token: str, run: _Run) -> State | None:
        """Run one task; return its outcome state, or None if the watchdog
        (or a shutdown) took it over."""
        tdef = self.registry.get(rec.name)
        started_at = self.clock.time()
        ctx = run.ctx
        timeout = rec.timeout
        outcome: Outcome
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
                meta = (rec.id, rec.trace_id, rec.attempt, ctx.checkpoints)
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
            outcome = Outcome(rec.id, token, rec.version, State.SUCCESS, result=result, started_at=started_at)
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
        if rec.id in unit.uncounted:
            outcome.attempt = rec.attempt
        with unit.lock:
            if run.abandoned:
                return None
            run.finished = True
        self._write(outcome)
        return outcome.status

    def _failure_outcome(
        self, rec: TaskRecord, token: str, exc: BaseException, tdef: TaskSpec | None, started_at: float
    ) -> Outcome:
        if isinstance(exc, ChildFailed):
            retryable, text = exc.retryable, exc.text
        else:
            retryable = tdef is not None and is_retryable(exc, tdef.retry_on, tdef.permanent_on)
            text = "".join(traceback.format_exception_only(type(exc), exc)).strip()
        if tdef is not None and retryable and rec.attempt <= rec.max_retries:
            delay = retry_delay(exc, rec.attempt, tdef.backoff)
            return Outcome(
                rec.id,
                token,
                rec.version,
                State.RETRYING,
                error=text,
                run_at=self.store.now() + delay,
                started_at=started_at,
            )
        if retryable and rec.max_retries:
            text = f"{text} (gave up after {rec.attempt} attempts)"
        return Outcome(rec.id, token, rec.version, State.FAILED, error=text, started_at=started_at)

    def _timeout_outcome(self, rec: TaskRecord, token: str, started_at: float) -> Outcome:
        text = f"timed out after {rec.timeout:g}s (attempt {rec.attempt})"
        if rec.attempt <= rec.max_retries:
            tdef = self.registry.get(rec.name)
            delay = tdef.backoff.delay(rec.attempt) if tdef else 1.0
            return Outcome(
                rec.id,
                token,
                rec.version,
                State.RETRYING,
                error=text,
                run_at=self.store.now() + delay,
                started_at=started_at,
            )
        return Outcome(rec.id, token, rec.version, State.TIMEOUT, error=text, started_at=started_at)

    def _child_message(self, ctx: Context, msg: tuple[Any, ...]) -> None:
        if msg[0] == "progress":
            self.store.set_progress(ctx.task_id, ctx._token, msg[1], msg[2])
        elif msg[0] == "checkpoint":
            self.store.save_checkpoint(ctx.task_id, ctx._token, msg[1], msg[2])

    def _hand_back(self, unit: _Unit, rest: list[TaskRecord], token: str) -> None:
        """Give unstarted tasks of a chunk back to the queue, attempts intact."""
        for rec in rest:
            self._write(Outcome(rec.id, token, rec.version, State.PENDING, attempt=rec.attempt))

    def _hand_back_all(self) -> None:
        """After the grace period: give every unfinished task back, attempts intact.

        A task under way is abandoned (its process killed) and given back; its
        thread, if it ever returns, writes nothing."""
        with self._cond:
            units = list(self._units)
        token_tasks: list[tuple[_Unit, list[TaskRecord]]] = []
        for unit in units:
            tasks = unit.claim.tasks
            with unit.lock:
                if unit.done:
                    continue
                unit.lost = True  # its slot starts nothing more
                if unit.begun < 0:  # claimed, never started: the claim counted task 0's attempt
                    first = tasks[0]
                    self._write(
                        Outcome(first.id, unit.claim.token, first.version, State.PENDING, attempt=first.attempt - 1)
                    )
                    rest = tasks[1:]
                else:
                    run = self._runs.get(tasks[unit.begun].id)
                    if run is not None and not run.finished:
                        run.abandoned = True
                        if run.proc is not None:
                            run.proc.kill("shutdown")
                        rec = run.record
                        self._write(
                            Outcome(rec.id, unit.claim.token, rec.version, State.PENDING, attempt=rec.attempt - 1)
                        )
                    rest = tasks[unit.begun + 1 :]
            token_tasks.append((unit, rest))
        for unit, rest in token_tasks:
            self._hand_back(unit, rest, unit.claim.token)
            self._release(unit)

    # ---- writing outcomes ------------------------------------------------------
    def _write(self, outcome: Outcome) -> None:
        if self._completer_q is None:
            self._apply([outcome])
        else:
            self._completer_idle.clear()
            self._completer_q.put(outcome)

    def _apply(self, outcomes: list[Outcome]) -> None:
        for attempt in range(_COMPLETE_TRIES):
            try:
                applied = self.store.complete(outcomes)
                break
            except StoreError as exc:  # retry through an outage; a bug surfaces
                log.warning("completing %d outcome(s) failed (%s); retrying", len(outcomes), exc)
                time.sleep(min(_COMPLETE_MAX_PAUSE, 0.2 * 2**attempt))
        else:
            log.error("gave up writing %d outcome(s); the sweeper will recover them", len(outcomes))
            return
        for o, ok in zip(outcomes, applied):
            if not ok:
                log.info("task %s: late or stale outcome %s discarded", o.task_id, o.status.value)
        self._hook("on_outcomes", outcomes, applied)

    def _completer_loop(self) -> None:
        q = self._completer_q
        assert q is not None  # the completer runs only for a shared store
        window = self.completer_window
        while True:
            items: list[Outcome | _Unit] = [q.get()]
            # Gather for a moment: one write per batch, not per task. A unit
            # waiting for its slot (a marker in the queue) ends the wait.
            waiting = isinstance(items[0], _Unit)
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
                waiting = waiting or isinstance(item, _Unit)
            outcomes = [x for x in items if isinstance(x, Outcome)]
            if outcomes:
                self._apply(outcomes)
            for x in items:
                if isinstance(x, _Unit):
                    self._settle(x)
            if q.empty():
                self._completer_idle.set()

    def _flush(self, timeout: float | None) -> bool:
        if self._completer_q is None:
            return True
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
                if run.deadline is None or run.finished:
                    continue
                if run.deadline <= now:
                    self._time_out(run)
                else:
                    next_check = min(next_check, run.deadline - now)
            self._stopped.wait(max(0.005, next_check))

    def _time_out(self, run: _Run) -> None:
        unit = run.unit
        with unit.lock:
            if run.finished or run.abandoned or unit.done:
                return
            run.abandoned = True
            unit.lost = True  # the rest of the chunk is handed back below
        rec = run.record
        log.warning("task %s (%s) timed out after %ss; abandoning its thread", rec.id, rec.name, rec.timeout)
        if run.future is not None:
            run.future.cancel()
        self._runs.pop(rec.id, None)
        outcome = self._timeout_outcome(rec, unit.claim.token, self.clock.time() - (rec.timeout or 0))
        if rec.id in unit.uncounted:
            outcome.attempt = rec.attempt
        self._write(outcome)
        self._hand_back(unit, unit.claim.tasks[unit.begun + 1 :], unit.claim.token)
        self._spawn_slot()
        self._release(unit)

    def _heartbeat_loop(self) -> None:
        # Renewals follow the clock leases are measured on; the loop itself
        # wakes on real time, at least once a second.
        next_renewal = self.clock.monotonic() + self.heartbeat_interval
        while not self._stopped.wait(min(self.cancel_poll_interval, self.heartbeat_interval)):
            if self.clock.monotonic() < next_renewal:
                self._poll_cancels()
                continue
            next_renewal = self.clock.monotonic() + self.heartbeat_interval
            with self._cond:
                tokens = {u.claim.token for u in self._units}
            if not tokens:
                continue
            try:
                reply = self.store.heartbeat(tokens, self.lease_seconds)
            except StoreError as exc:
                log.warning("heartbeat failed: %s", exc)
                continue
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
