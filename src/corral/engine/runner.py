"""The slots: run a unit's tasks in order, each task's body, and what it ended as.

A worker has ``concurrency`` slot threads. Each takes the next unit from the
ledger's inbox and runs its tasks in order: before each, it makes sure the
unit's lease still stands (a worker cut off past its lease must start none
of them), then runs the body (in the thread, on an event loop, or in a
child process), classifies how it ended (:mod:`corral.engine.outcomes`)
and hands the outcome to the completer; it never waits for a write. A
retry, a snooze or a failure that halts the group hands the unit's tasks
not yet started back. Near the end of a unit under a limit, the slot asks
the completer for its successor (a *relay*).

A slot whose task the watchdog took over (a thread that cannot be stopped)
is left to that thread; the watchdog starts another in its place.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import logging
import threading
import time
from typing import Any

from corral.core import texts, validation
from corral.core.clock import Clock
from corral.core.gates import KEY_SEP
from corral.core.model import EXPIRED, Outcome, TaskRecord, dumps, expired
from corral.core.pacing import relay_due, relay_lead
from corral.core.states import State
from corral.engine import outcomes, tracing
from corral.engine.completer import START_RECORD_AFTER, Completer
from corral.engine.context import Context
from corral.engine.executors import ProcessRun, run_async
from corral.engine.hooks import Guarded
from corral.engine.limit_reporter import LimitReporter
from corral.engine.logs import set_running, task_fields
from corral.engine.pause_watch import PauseWatch
from corral.engine.registry import Registry
from corral.engine.units import RELAY_ASKED, RELAY_NONE, Ledger, Pace, Relay, TaskRun, Unit
from corral.errors import Canceled, PermanentError, StoreError
from corral.stores.base import Store

log = logging.getLogger("corral.worker")

#: What a run raises when it was canceled (by ctx, or its coroutine was cancelled).
_CANCELED = (Canceled, asyncio.CancelledError, concurrent.futures.CancelledError)
#: A task held here starts only with at least this share of its lease left
#: (as last renewed); with less, the lease is renewed first, and if that
#: fails the unit's tasks not yet started go back to the queue.
LEASE_MARGIN = 0.25
#: A held task whose deadline (``expires=``) is nearer than this on the
#: worker's reading of the store's clock is checked against the store's own
#: clock before it starts (one read); one further off starts without a look.
DEADLINE_MARGIN = 1.0


class Runner:
    """The slot threads of one worker and how they run a unit."""

    def __init__(
        self,
        store: Store,
        registry: Registry,
        clock: Clock,
        hooks: Guarded,
        ledger: Ledger,
        completer: Completer,
        pace: Pace,
        *,
        worker_id: str,
        lease_seconds: float,
        max_payload_bytes: int,
        stop_claiming: threading.Event,
        pauses: PauseWatch | None = None,
        limit_reports: LimitReporter | None = None,
    ):
        self.store = store
        self.registry = registry
        self.clock = clock
        self.hooks = hooks
        self.ledger = ledger
        self.completer = completer
        self.pace = pace
        self.id = worker_id
        self.lease_seconds = lease_seconds
        self.max_payload_bytes = max_payload_bytes
        self.stop_claiming = stop_claiming
        self.pauses = pauses if pauses is not None else PauseWatch(store)
        #: counts what tasks under adaptive limits did (None: nothing counted)
        self.limit_reports = limit_reports
        #: slot threads started (the watchdog adds one per abandoned thread)
        self.slots = 0
        #: how far the store's clock was ahead of the worker's when last read
        #: (None: not read yet; read at the first held task with a deadline)
        self._store_ahead: float | None = None

    def spawn_slot(self) -> None:
        """Start one more slot thread."""
        self.slots += 1
        threading.Thread(target=self._slot_loop, name=f"corral-slot-{self.slots}", daemon=True).start()

    def _slot_loop(self) -> None:
        while True:
            unit = self.ledger.inbox.get()
            if unit is None:
                return
            try:
                if not self._run_unit(unit):
                    return  # abandoned by the watchdog: a new slot replaced this one
            except Exception:  # noqa: BLE001 - never lose a slot to a bug
                log.exception("slot crashed running a unit")
                self.ledger.settle(unit)

    def _relay_due(self, unit: Unit, tasks_left: int) -> bool:
        """Should ``unit``, about to run its last ``tasks_left`` tasks, ask
        for its successor now? Only a unit under a capped limit's place
        (others free their slot at once, and a prefetch covers them), in a
        store that hands places over."""
        limits = unit.claim.tasks[0].limits
        if not limits or not self.store.hands_over or self.stop_claiming.is_set():
            return False
        if not self.store.keys_hand_over and any(KEY_SEP in n for n in limits):
            return False  # its slot is freed at its end (Completer.release)
        return relay_due(tasks_left, self.pace.tasks.known(), relay_lead(self.pace.handovers.known()))

    def _run_unit(self, unit: Unit) -> bool:
        """Run a unit's tasks in order; False when the watchdog took this slot's task."""
        tasks = unit.claim.tasks
        token = unit.claim.token
        runs = self.ledger.runs
        began = time.monotonic()
        for i, rec in enumerate(tasks):
            if not (unit.lost or unit.done) and not self._lease_stands(unit):
                if self._lease_gone(unit, i):
                    break
            late = self._past_deadline(unit, i, rec)
            if (i > 0 or unit.prefetched) and not (unit.lost or unit.done) and self.pauses.holds(rec, unit.claimed):
                # held, not started, and paused since its claim: back to the
                # queue, attempts intact (the store recorded no start for it)
                if self._paused_back(unit, i):
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
                if late:  # never started, past its deadline: ended "expired", fenced by the lease
                    self.completer.put(
                        Outcome(rec.id, token, rec.version, State.CANCELED, error=EXPIRED, attempt=rec.attempt)
                    )
                    log.info("task %s (%s) not started by its deadline: expired", rec.id, rec.name)
                    continue
                if i > 0 or unit.prefetched:  # the store recorded no start: the outcome does
                    rec.attempt += 1
                    unit.uncounted.add(rec.id)
                ctx = Context(self.store, rec, token, rec.attempt, self.max_payload_bytes)
                run = TaskRun(unit, rec, ctx, None if rec.timeout is None else self.clock.monotonic() + rec.timeout)
                runs[rec.id] = run
                relay = unit.relay == RELAY_NONE and self._relay_due(unit, len(tasks) - i)
                if relay:
                    unit.relay = RELAY_ASKED
            if relay:
                self.completer.put(Relay(unit))
            status = self._run_task(unit, rec, token, run)
            if status is None:
                return False  # abandoned
            if status in (State.RETRYING, State.PENDING) or (status is State.FAILED and rec.halt_group_on_failure):
                self.completer.hand_back(tasks[i + 1 :], token)
                break
        self.pace.units.observe(time.monotonic() - began)
        self.completer.release(unit)
        return True

    def _paused_back(self, unit: Unit, i: int) -> bool:
        """Give the unit's tasks from ``i`` on back: a pause by hand holds
        task ``i`` (none of them started). False when the unit was let go
        meanwhile (a stop, the heartbeat): that path ends it."""
        tasks = unit.claim.tasks
        with unit.lock:
            if unit.lost or unit.done:
                return False
            unit.lost = True  # nothing more starts; a stop gives back nothing twice
        self.completer.hand_back(tasks[i:], unit.claim.token)
        log.info(
            "worker %s: task(s) %s held here are paused; giving them back to the queue",
            self.id,
            ", ".join(str(t.id) for t in tasks[i:]),
        )
        return True

    def _lease_stands(self, unit: Unit) -> bool:
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
            self.hooks.on_leases_lost(self.id, {token})
            return False
        unit.lease_until = max(unit.lease_until, asked + self.lease_seconds)
        return True

    def _past_deadline(self, unit: Unit, i: int, rec: TaskRecord) -> bool:
        """Is the held task ``rec`` (a chunk member, a prefetched or relayed
        task: no claim started it) past the deadline of its first start? Read
        on the store's clock, which the claim and the sweeper judge by too:
        asked of the store when the deadline is near on the worker's reading
        of it, so no held task starts after its deadline however the clocks
        differ."""
        if rec.expires_at is None or not (i > 0 or unit.prefetched) or unit.lost or unit.done:
            return False
        if rec.attempt or rec.snoozes:  # started once: the deadline is spent
            return False
        ahead = self._store_ahead
        if ahead is not None and rec.expires_at - (self.clock.time() + ahead) > DEADLINE_MARGIN:
            return False
        try:
            now = self.store.now()
            self._store_ahead = now - self.clock.time()
        except StoreError as exc:
            log.warning("reading the store's clock before a held task's start failed: %s", exc)
            now = self.clock.time() + (ahead or 0.0)
        return expired(rec.expires_at, rec.attempt, rec.snoozes, now)

    def _lease_gone(self, unit: Unit, i: int) -> bool:
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
            self.completer.put(
                Outcome(first.id, unit.claim.token, first.version, State.PENDING, attempt=first.attempt - 1)
            )
            rest = rest[1:]
        self.completer.hand_back(rest, unit.claim.token)
        log.warning(
            "worker %s: the lease of task(s) %s may have run out before they started (not renewed for %.1fs);"
            " giving them back",
            self.id,
            ", ".join(str(t.id) for t in tasks[i:]),
            self.clock.monotonic() - (unit.lease_until - self.lease_seconds),
        )
        return True

    def _run_task(self, unit: Unit, rec: TaskRecord, token: str, run: TaskRun) -> State | None:
        """Run one task; return its outcome state, or None if the watchdog
        (or a shutdown) took it over."""
        tdef = self.registry.get(rec.name)
        started_at = self.clock.time()
        began = time.monotonic()
        held = rec.id in unit.uncounted  # the store has no start for it: record one if it runs on
        starts = self.completer.starts
        if held:
            starts.note(rec.id, began + START_RECORD_AFTER, token, rec.attempt, started_at)
        ctx = run.ctx
        if log.isEnabledFor(logging.DEBUG):
            log.debug("task %s (%s) started", rec.id, rec.name, extra=task_fields(rec))
        span = tracing.start_attempt(rec, rec.attempt) if tracing.ENABLED else None
        if span is not None:
            ctx._span_id = span.span_id
        timeout = rec.timeout
        outcome: Outcome | None = None
        raised: BaseException | None = None
        reports = self.limit_reports
        adaptive = reports.started(rec.limits) if reports is not None and rec.limits else ()
        set_running(ctx)
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
            raised = exc
            if run.proc is not None and run.proc.killed_for == "timeout":
                outcome = outcomes.timed_out(rec, token, tdef, started_at, self.store.now)
            else:
                outcome = outcomes.failure(rec, token, exc, tdef, started_at, self.store.now)
        except BaseException as exc:  # noqa: BLE001 - a task's error is data
            raised = exc
            outcome = outcomes.failure(rec, token, exc, tdef, started_at, self.store.now)
        finally:
            set_running(None)
            self.ledger.runs.pop(rec.id, None)
            if held:  # the outcome records the start from now on
                starts.drop(rec.id)
            took = time.monotonic() - began
            self.pace.tasks.observe(took)
            if adaptive:
                reports.ended(adaptive, outcome, raised, took)  # type: ignore[union-attr]
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
                self.ledger.abandoned.pop(rec.id, None)
                log.info(
                    "task %s (%s): its timed-out thread ended; writing the timeout",
                    rec.id,
                    rec.name,
                    extra=task_fields(rec),
                )
                self.completer.put(late)
                self.completer.release(unit)
            return None
        outcomes.log_outcome(rec, texts.safe_outcome(outcome))
        self.completer.put(outcome)
        return outcome.status

    def _child_message(self, ctx: Context, msg: tuple[Any, ...]) -> None:
        """Progress and checkpoints a child process sends, written for it."""
        if msg[0] == "progress":
            self.store.set_progress(ctx.task_id, ctx._token, msg[1], msg[2])
        elif msg[0] == "checkpoint":
            self.store.save_checkpoint(ctx.task_id, ctx._token, msg[1], msg[2])
