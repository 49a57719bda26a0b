"""``memory://``: the store in a dict, for one process and for speed.

No durability. Same claim rules as the durable stores (see ``stores.base``),
implemented with a ready heap per queue, a delayed heap, and a deque per group
holding the ids that still occupy the group in id order.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import sys
import threading
import uuid
from collections import deque
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

from corral.core import adaptive as adp
from corral.core import breaker as brk
from corral.core import dag, texts
from corral.core import events as ev
from corral.core import limits as limit_rules
from corral.core.batches import FINAL_STATUSES as FINAL_BATCH
from corral.core.batches import callback_task
from corral.core.claims import NO_LIMITS, Candidate, ClaimPlanner, ClaimRequest
from corral.core.clock import SYSTEM_CLOCK, Clock
from corral.core.cron import (
    EARLY,
    ENQUEUED,
    SKIPPED,
    TAKEN,
    Schedule,
    ScheduleState,
    TickRecord,
    TickResult,
    first_stamp,
    too_early,
)
from corral.core.gates import (
    KEY_SEP,
    BreakerRow,
    Gates,
    LimitState,
    busiest_keys,
    fold_keys,
    key_at_rest,
    keyed_name,
    record_outcomes,
    split_key,
)
from corral.core.minutes import FinishedRun, MinuteStat
from corral.core.model import (
    EXPIRED,
    SUPERSEDED,
    BreakerEvent,
    Claim,
    LimitSpec,
    NewTask,
    Outcome,
    Start,
    SubmitResult,
    TaskFilter,
    TaskRecord,
    WorkerInfo,
    dumps,
    expired,
    loads,
)
from corral.core.pauses import Pause, Paused, pause_order
from corral.core.pauses import event_of as pause_event
from corral.core.planning import HISTORY_SCAN, HistoryRow
from corral.core.priorities import claim_rank
from corral.core.states import ACTIVE, FINAL, QUEUED, RESERVED, State, check_transition, shown
from corral.core.stats import percentile
from corral.errors import ConfigError, SubmitError
from corral.stores import base
from corral.stores.base import (
    DEAD,
    BatchSummary,
    Event,
    FinishedTask,
    FleetLevel,
    GroupLine,
    HeartbeatReply,
    Rescue,
    Store,
    SweepRow,
)

#: Events the memory store keeps (the oldest go first); a durable store's
#: sweeper trims by age and count instead.
MEMORY_EVENTS_KEEP = 100_000


@dataclass(slots=True)
class _Group:
    ids: deque = field(default_factory=deque)  # tasks occupying the group, id order
    running: int = 0
    last_claimed_at: float = 0.0


@dataclass(slots=True)
class _Lease:
    remaining: set
    limits: tuple


class _EventRow(NamedTuple):
    """An event as kept: its data may still be a dict (the JSON is made when
    someone reads, so a task's state changes cost the memory store little)."""

    id: int
    at: float
    kind: str
    subject: str
    data: str | dict


@dataclass(slots=True)
class _Batch:
    on_complete: str | None = None  # the callback's template
    settled: bool = False


class MemoryStore(Store):
    shared = False

    def __init__(self, url: str = "memory://", *, clock: Clock = SYSTEM_CLOCK):
        self.url = url
        self._clock = clock
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._tasks: dict[int, TaskRecord] = {}
        self._ids = itertools.count(1)
        self._keys: dict[str, int] = {}
        self._ready: dict[str, list] = {}  # queue -> heap of fresh (PENDING) (rank, id, stamp)
        self._retry_ready: dict[str, list] = {}  # queue -> heap of RETRYING ones, the retry path
        self._stamp: dict[int, int] = {}
        #: (task name, debounce key) -> the task the key's submits collapse into, while PENDING
        self._debounced: dict[tuple[str, str], int] = {}
        #: (task name, supersede key) -> the tasks submitted with it, not yet seen final
        self._superseding: dict[tuple[str, str], set[int]] = {}
        #: running tasks asked to stop for a reason other than a cancel ("superseded")
        self._cancel_reasons: dict[int, str] = {}
        #: tasks submitted with a deadline, not yet seen started or final (the sweeper's read)
        self._deadlines: dict[int, float] = {}
        self._stamps = itertools.count(1)
        self._delayed: list = []  # heap of (run_at, id, stamp)
        self._groups: dict[str, _Group] = {}
        self._dependents: dict[int, list[int]] = {}
        self._waiting_on: dict[int, set[int]] = {}
        self._leases: dict[str, _Lease] = {}
        self._running: set[int] = set()
        self._minutes: dict[tuple[int, str, str], MinuteStat] = {}
        self._workers: dict[str, WorkerInfo] = {}
        self._limits: dict[str, LimitState] = {}
        #: adaptive limits: name -> (spec as JSON, the controller's state as JSON or None)
        self._adaptive: dict[str, tuple[str, str | None]] = {}
        #: a keyed adaptive limit's keys' controller states (JSON), by gate name: the key rows' ``controller``
        self._key_controllers: dict[str, str] = {}
        #: the workers' reports of adaptive limits not taken yet: (worker, at, JSON)
        self._limit_reports: list[tuple[str, float, str]] = []
        self._usage: dict[str, int] = {}
        self._breakers: dict[str, BreakerRow] = {}
        #: pauses by hand, (kind, name) -> Pause, and the sets a claim obeys
        self._pauses: dict[tuple[str, str], Pause] = {}
        self._paused = Paused()
        self._breaker_events: list[BreakerEvent] = []
        self._leaders: dict[str, tuple[str, float]] = {}
        self._level = FleetLevel()
        self._events: list[_EventRow] = []  # oldest first
        self._event_added = threading.Condition(self._lock)
        self._event_ids = itertools.count(1)
        self._changes = 0
        self._count: dict[State, int] = {s: 0 for s in State}  # kept current: counts() is O(1)
        self._batches: dict[str, _Batch] = {}
        self._schedules: dict[str, dict[str, Any]] = {}  # name -> stored columns
        self._ticks: dict[str, dict[int, TickRecord]] = {}  # schedule -> tick -> row

    def now(self) -> float:
        return self._clock.time()

    # ---- queue bookkeeping (lock held) -----------------------------------
    def _enqueue(self, t: TaskRecord, now: float) -> None:
        """Put a QUEUED task where claim will find it, if it may run."""
        if t.run_at > now:
            stamp = self._stamp[t.id] = next(self._stamps)
            heapq.heappush(self._delayed, (t.run_at, t.id, stamp))
            return
        eligible = t.run_at
        if t.group is not None:
            g = self._groups[t.group]
            if g.running or not g.ids or g.ids[0] != t.id:
                return  # not the head: pushed when it becomes one
            eligible = max(eligible, g.last_claimed_at)
        stamp = self._stamp[t.id] = next(self._stamps)
        ready = self._retry_ready if t.status is State.RETRYING else self._ready
        heapq.heappush(ready.setdefault(t.queue, []), (claim_rank(t.priority, eligible), t.id, stamp))

    def _promote_due(self, now: float) -> None:
        while self._delayed and self._delayed[0][0] <= now:
            _, tid, stamp = heapq.heappop(self._delayed)
            t = self._tasks[tid]
            if self._stamp.get(tid) == stamp and t.status in QUEUED:
                self._enqueue(t, now)

    def _group_advance(self, gkey: str, now: float) -> None:
        g = self._groups[gkey]
        while g.ids:
            head = self._tasks[g.ids[0]]
            if head.status in ACTIVE or (head.status is State.FAILED and head.halt_group_on_failure):
                break
            g.ids.popleft()
        if not g.ids and not g.running:
            del self._groups[gkey]
            return
        if not g.running and g.ids:
            head = self._tasks[g.ids[0]]
            if head.status in QUEUED:
                self._enqueue(head, now)

    def _group_insert(self, t: TaskRecord) -> None:
        assert t.group is not None
        g = self._groups.setdefault(t.group, _Group())
        if t.id in g.ids:
            return
        if not g.ids or t.id > g.ids[-1]:
            g.ids.append(t.id)
        else:
            g.ids = deque(sorted([*g.ids, t.id]))

    def _requeue(self, t: TaskRecord, now: float) -> None:
        """A final task queued again (by an operator): back into its group's line."""
        if t.group is not None:
            self._group_insert(t)
            self._group_advance(t.group, now)
        else:
            self._enqueue(t, now)

    def _finish_effects(self, t: TaskRecord, now: float) -> None:
        """After ``t`` reached a final state: dependents (transitively, without
        recursion: a long chain must not overflow the stack) and groups."""
        ended = [t]
        while ended:
            u = ended.pop()
            # a success is for good; after a bad end an operator may retry the
            # upstream, so its dependents are kept to be settled again
            deps = self._dependents.pop(u.id, ()) if u.status is State.SUCCESS else self._dependents.get(u.id, ())
            for did in deps:
                d = self._tasks[did]
                if d.status is not State.WAITING:
                    continue
                waiting = self._waiting_on.get(did)
                if waiting is not None:
                    waiting.discard(u.id)
                if u.status is not State.SUCCESS and d.on_upstream_failure == "cancel":
                    self._waiting_on.pop(did, None)
                    reason = dag.upstream_reason(u.id, u.status.value)
                    self._set(d, State.CANCELED, error=reason, finished_at=now)
                    ended.append(d)
                elif not waiting:
                    # every upstream ended once; one retried since is running again
                    active = {x for x in d.depends_on if self._tasks[x].status not in FINAL}
                    if active:
                        self._waiting_on[did] = active
                        for x in active:
                            if did not in self._dependents.setdefault(x, []):
                                self._dependents[x].append(did)
                        continue
                    self._waiting_on.pop(did, None)
                    self._set(d, State.PENDING)
                    self._enqueue(d, now)
            if u.group is not None and u.group in self._groups:
                self._group_advance(u.group, now)

    def _set(self, t: TaskRecord, status: State, **fields) -> None:
        before = t.status
        self._count[before] -= 1
        self._count[status] += 1
        t.status = status
        t.version += 1
        for k, v in fields.items():
            setattr(t, k, v)
        self._changes += 1
        if status is not before:
            self._task_event(t, before, self._clock.time())

    def _release(self, t: TaskRecord, now: float) -> None:
        """``t`` leaves RUNNING: lease, limits and group bookkeeping."""
        self._running.discard(t.id)
        token = t.lease_token
        lease = self._leases.get(token) if token else None
        if token and lease is not None:
            lease.remaining.discard(t.id)
            if not lease.remaining:
                del self._leases[token]
                for name in lease.limits:
                    self._usage[name] = self._usage.get(name, 1) - 1
        t.lease_token = None
        t.lease_expires_at = None
        if t.group is not None:
            g = self._groups.get(t.group)
            if g is not None:
                g.running -= 1

    # ---- producers --------------------------------------------------------
    def submit(self, tasks: Sequence[NewTask], *, max_queued: int | None = None) -> list[SubmitResult]:
        with self._lock:
            return self._submit_locked(tasks, max_queued)

    def _submit_locked(self, tasks: Sequence[NewTask], max_queued: int | None) -> list[SubmitResult]:
        base.check_bound({s.value: n for s, n in self._count.items()}, len(tasks), max_queued)
        now = self.now()
        # validate first: all or nothing
        batch_keys: dict[str, int] = {}
        for nt in tasks:
            for dep in nt.depends_on:
                if dep not in self._tasks:
                    raise SubmitError(f"unknown dependency id {dep}")
        # build every record first, then apply them: a row that fails to build
        # leaves nothing behind
        results: list[SubmitResult] = []
        made: list[tuple[TaskRecord, set[int]]] = []
        fresh: dict[int, TaskRecord] = {}
        for nt in tasks:
            if nt.debounce_key is not None:
                merged = self._debounce_into(nt, fresh, now)
                if merged is not None:
                    results.append(SubmitResult(merged, False))
                    continue
            if nt.key is not None:
                existing = self._keys.get(nt.key)
                if existing is None:
                    existing = batch_keys.get(nt.key)
                if existing is not None:
                    results.append(SubmitResult(existing, False))
                    continue
            tid = next(self._ids)
            deps = tuple(dict.fromkeys((*nt.depends_on, *(results[j].id for j in nt.after))))
            states = [(d, (fresh.get(d) or self._tasks[d]).status) for d in deps]
            status, error = dag.initial_state(states, nt.on_upstream_failure)
            waiting = {d for d, st in states if st not in FINAL} if status is State.WAITING else set()
            t = TaskRecord(
                id=tid,
                name=nt.name,
                args=nt.args,
                status=status,
                queue=nt.queue,
                priority=nt.priority,
                max_retries=nt.max_retries,
                timeout=nt.timeout,
                group=nt.group,
                batch=nt.batch,
                key=nt.key,
                trace_id=nt.trace_id,
                limits=tuple(nt.limits),
                depends_on=deps,
                halt_group_on_failure=nt.halt_group_on_failure,
                created_at=now,
                run_at=nt.run_at if nt.run_at is not None else now,
                error=error,
                finished_at=now if status in FINAL else None,
                ref=nt.ref,
                on_upstream_failure=nt.on_upstream_failure,
                expires_at=nt.expires_at,
                debounce_key=nt.debounce_key,
            )
            if nt.debounce is not None:
                t.run_at = now + nt.debounce
                self._debounced[(nt.name, nt.debounce_key)] = tid  # type: ignore[index]
            made.append((t, waiting))
            fresh[tid] = t
            if nt.key is not None:
                batch_keys[nt.key] = tid
            results.append(SubmitResult(tid, True))
        for t, waiting in made:
            tid, status = t.id, t.status
            self._tasks[tid] = t
            self._count[status] += 1
            if t.key is not None:
                self._keys[t.key] = tid
            if t.expires_at is not None:
                self._deadlines[tid] = t.expires_at
            if status is State.WAITING:
                self._waiting_on[tid] = waiting
                for dep in waiting:
                    self._dependents.setdefault(dep, []).append(tid)
            if t.group is not None and status in ACTIVE:
                self._group_insert(t)
            if status is State.PENDING:
                self._enqueue(t, now)
            self._task_event(t, None, now)
        for nt, r in zip(tasks, results):
            if nt.supersede_key is not None and r.created:
                self._supersede((nt.name, nt.supersede_key), r.id, now)
        self._changes += 1
        self._wake.notify_all()
        return results

    def _debounce_into(self, nt: NewTask, fresh: dict[int, TaskRecord], now: float) -> int | None:
        """The PENDING task ``nt``'s debounce key collapses into, given its
        arguments and its later run_at; None when there is none (a new one)."""
        tid = self._debounced.get((nt.name, nt.debounce_key))  # type: ignore[arg-type]
        t = None if tid is None else (fresh.get(tid) or self._tasks.get(tid))
        if t is None or t.status is not State.PENDING or t.started_at is not None:
            return None
        run_at = now + (nt.debounce or 0.0)
        if nt.debounce_max is not None:
            run_at = min(run_at, t.created_at + nt.debounce_max)
        t.args = nt.args
        t.run_at = run_at
        if t.id not in fresh:
            t.version += 1
            self._enqueue(t, now)  # a new stamp: its earlier place in the queues is stale
        return t.id

    def _supersede(self, key: tuple[str, str], newest: int, now: float) -> None:
        """Cancel the queued tasks submitted with ``key`` before ``newest``
        ("superseded") and ask a running one to stop."""
        older = self._superseding.setdefault(key, set())
        for tid in sorted(older):
            t = self._tasks.get(tid)
            if t is None or t.status in FINAL:
                older.discard(tid)
            elif t.status is State.RUNNING:
                t.cancel_requested = True
                self._cancel_reasons[tid] = SUPERSEDED
            elif t.status in (State.PENDING, State.RETRYING, State.WAITING):
                self._stamp.pop(t.id, None)
                self._waiting_on.pop(t.id, None)
                self._set(t, State.CANCELED, finished_at=now, error=SUPERSEDED)
                self._finish_effects(t, now)
                older.discard(tid)
        older.add(newest)

    # ---- workers ----------------------------------------------------------
    def claim(self, worker_id: str, request: ClaimRequest) -> list[Claim]:
        claims: list[Claim] = []
        if request.max_units <= 0:
            return claims
        with self._lock:
            now = self.now()
            self._promote_due(now)
            breakers = {n: b.state.state is brk.BreakerState.CLOSED for n, b in self._breakers.items()}
            paused = self._paused
            plan = ClaimPlanner(
                request, lambda: Gates(now, self._limits, self._usage, self._breakers), breakers, paused=paused
            )
            queues = [q for q in request.queues if q not in paused.queues]
            # entries read from the heaps that still stand: put back unless taken
            read: list[tuple[list, tuple]] = []
            ranks: dict[int, tuple] = {}
            ranked = plan.retry_cap is not None  # the retry path apart: merged by rank

            def ordered(heaps: list[list]) -> Iterator[Candidate]:
                """The heads queued in ``heaps``, in claim order (rank, then id)."""
                heaps = [h for h in heaps if h]
                while heaps:
                    heap = min(heaps, key=lambda h: h[0])
                    entry = heapq.heappop(heap)
                    if not heap:
                        heaps.remove(heap)
                    tid, stamp = entry[1], entry[2]
                    t = self._tasks[tid]
                    if self._stamp.get(tid) != stamp or t.status not in QUEUED:
                        continue  # a stale entry
                    g = self._groups.get(t.group) if t.group is not None else None
                    if g is not None and (g.running or g.ids[0] != tid):
                        continue  # not its group's head: queued again when it is
                    if t.expires_at is not None and expired(t.expires_at, t.attempt, t.snoozes, now):
                        self._expire(t, now)  # never started: ended here, in the claim
                        continue
                    read.append((heap, entry))
                    c = _candidate(t, now)
                    if not plan.shut_out(c):
                        if ranked:
                            ranks[tid] = entry
                        yield c

            def read_line(c: Candidate, far: int) -> list[Candidate]:
                """The tasks after ``c`` still in its group's line, at most ``far``."""
                line: list[Candidate] = []
                for nid in itertools.islice(self._groups[c.group].ids, 1, None):  # type: ignore[index]
                    if len(line) >= far:
                        break
                    n = self._tasks[nid]
                    if n.status in FINAL and not (n.status is State.FAILED and n.halt_group_on_failure):
                        continue  # ended: no longer in the group's line (as the SQL stores read it)
                    line.append(_candidate(n, now))
                return line

            def try_take(c: Candidate) -> bool:
                return plan.try_head(c, read_line)

            retry = [self._retry_ready[q] for q in queues if self._retry_ready.get(q)]
            fresh = [] if request.only_retries else [self._ready[q] for q in queues if self._ready.get(q)]
            if plan.retry_cap is None:
                plan.run(ordered(fresh + retry), None, try_take, lambda c: ranks[c.id])
            else:
                plan.run(ordered(fresh), ordered(retry), try_take, lambda c: ranks[c.id])
            for members in plan.units:
                claims.append(self._take(worker_id, request, members, now))
            stamps = self._stamp
            for heap, entry in read:
                if stamps.get(entry[1]) == entry[2]:  # not taken (a claim drops its tasks' stamps)
                    heapq.heappush(heap, entry)
            gates = plan.gates
            if gates is not None:
                for name, charge in gates.rate_writes().items():
                    lim = self._limits.get(name)
                    if lim is None:  # a key's budget, created on first use
                        lim = self._limits[name] = LimitState(LimitSpec(name))
                    lim.tokens, lim.counted_at, lim.starts = charge.tokens, charge.counted_at, charge.starts
                for name, (state, bev) in gates.breaker_writes().items():
                    self._breakers[name].state = state
                    if bev is not None:
                        self._breaker_event(bev)
            self._note_gate_wait(gates.wait if gates is not None else None)
            if claims:
                self._changes += 1
        return claims

    def _expire(self, t: TaskRecord, now: float) -> None:
        """End the queued ``t``, past the deadline of its first start: CANCELED "expired"."""
        self._stamp.pop(t.id, None)
        self._deadlines.pop(t.id, None)
        self._set(t, State.CANCELED, finished_at=now, error=EXPIRED)
        self._finish_effects(t, now)

    def _take(self, worker_id: str, request: ClaimRequest, unit: list[Candidate], now: float) -> Claim:
        """Claim the tasks of ``unit`` (its head first) under one new lease."""
        token = uuid.uuid4().hex
        expires = now + request.lease_seconds
        members = [self._tasks[c.id] for c in unit]
        for i, m in enumerate(members):
            self._stamp.pop(m.id, None)
            self._count[m.status] -= 1
            self._count[State.RUNNING] += 1
            before = m.status
            m.status = State.RUNNING
            m.version += 1
            m.lease_token = token
            m.lease_expires_at = expires
            m.worker_id = worker_id
            if i == 0 and not request.prefetch:
                m.attempt += 1
                m.started_at = now
            else:
                m.started_at = None
            self._running.add(m.id)
            self._task_event(m, before, now)
        head = members[0]
        limits = head.limits if len(unit) == 1 else tuple(sorted(frozenset().union(*(c.limits for c in unit))))
        self._leases[token] = _Lease({m.id for m in members}, limits)
        for name in limits:
            self._usage[name] = self._usage.get(name, 0) + 1
        g = self._groups.get(head.group) if head.group is not None else None
        if g is not None:
            g.running += len(members)
            g.last_claimed_at = now
        return Claim(token, [replace(m) for m in members], head.group)

    def record_starts(self, starts: Sequence[Start]) -> int:
        applied = 0
        with self._lock:
            for st in starts:
                t = self._tasks.get(st.task_id)
                if t is None or t.status is not State.RUNNING or t.lease_token != st.token or t.started_at is not None:
                    continue
                t.started_at = st.started_at
                t.attempt = st.attempt
                applied += 1
        return applied

    def backlog(self, at_most: int) -> int | None:
        with self._lock:
            return min(at_most, self._count[State.PENDING] + self._count[State.RETRYING])

    def heartbeat(self, tokens: Collection[str], lease_seconds: float) -> HeartbeatReply:
        reply = HeartbeatReply()
        with self._lock:
            expires = self.now() + lease_seconds
            for token in tokens:
                lease = self._leases.get(token)
                if lease is None:
                    reply.lost_tokens.add(token)
                    continue
                for tid in lease.remaining:
                    t = self._tasks[tid]
                    t.lease_expires_at = expires
                    if t.cancel_requested:
                        reply.cancel_requested.add(tid)
        return reply

    def complete(self, outcomes: Sequence[Outcome]) -> list[bool]:
        applied: list[bool] = []
        outcomes = texts.safe_outcomes(outcomes)
        with self._lock:
            now = self.now()
            for o in outcomes:
                t = self._tasks.get(o.task_id)
                if t is None or t.status is not State.RUNNING or t.lease_token != o.token or t.version != o.version:
                    applied.append(False)
                    continue
                check_transition(State.RUNNING, o.status)
                self._release(t, now)
                fields: dict = {}
                if o.started_at is not None and t.started_at is None:
                    fields["started_at"] = o.started_at
                if o.status in FINAL:
                    fields["finished_at"] = o.finished_at or now
                if o.result is not None:  # small results repeat a lot ("null", "true")
                    fields["result"] = sys.intern(o.result) if len(o.result) <= 16 else o.result
                if o.error is not None or o.status is State.SUCCESS:
                    fields["error"] = o.error
                    fields["traceback"] = o.traceback
                reason = self._cancel_reasons.pop(t.id, None)
                if reason is not None and o.status is State.CANCELED and t.cancel_requested:
                    fields["error"] = reason  # why it was asked to stop (a newer submit)
                if o.attempt is not None:
                    fields["attempt"] = o.attempt
                elif not o.burn_attempt or o.snooze:
                    fields["attempt"] = max(0, t.attempt - 1)
                if o.snooze:
                    fields["snoozes"] = t.snoozes + 1
                if o.pause_limits is not None:
                    for name in t.limits:
                        lim = self._limits.get(name)
                        if lim is not None:
                            until = now + o.pause_limits
                            lim.spec.paused_until = max(lim.spec.paused_until or 0.0, until)
                if self._breakers and (t.name in self._breakers or any(n in self._breakers for n in t.limits)):
                    changed, events = record_outcomes(self._breakers, [((t.name, *t.limits), o.breaker_failure)], now)
                    for name, state in changed.items():
                        self._breakers[name].state = state
                    for bev in events:
                        self._breaker_event(bev)
                if o.status in QUEUED:
                    fields["run_at"] = o.run_at if o.run_at is not None else now
                    fields["worker_id"] = None
                self._set(t, o.status, **fields)
                if o.status in QUEUED:
                    if t.group is not None:
                        self._group_advance(t.group, now)
                    else:
                        self._enqueue(t, now)
                else:
                    self._finish_effects(t, now)
                applied.append(True)
            self._wake.notify_all()
        return applied

    def wait_for_work(self, timeout: float, queues: Collection[str] | None = None) -> None:
        with self._lock:
            seen = self._changes
            self._wake.wait_for(lambda: self._changes != seen, self._gate_timeout(timeout))

    def wake_waiters(self) -> None:
        with self._lock:
            self._changes += 1
            self._wake.notify_all()

    def set_progress(self, task_id, token, fraction, message) -> bool:
        message = texts.progress_message(message)
        with self._lock:
            t = self._tasks.get(task_id)
            if t is None or t.status is not State.RUNNING or t.lease_token != token:
                return False
            t.progress = fraction
            t.progress_message = message
            data = {"id": t.id, "name": t.name, "fraction": fraction, "message": message}
            self._add_event(self._clock.time(), ev.PROGRESS, ev.task_subject(t.id), data)
            return True

    def save_checkpoint(self, task_id, token, stage, data_json) -> bool:
        with self._lock:
            t = self._tasks.get(task_id)
            if t is None or t.status is not State.RUNNING or t.lease_token != token:
                return False
            cp = loads(t.checkpoint) or {}
            cp.pop(stage, None)
            cp[stage] = loads(data_json)
            t.checkpoint = dumps(cp)
            return True

    # ---- operators --------------------------------------------------------
    def get(self, task_id: int) -> TaskRecord | None:
        with self._lock:
            t = self._tasks.get(task_id)
            return _shown(t) if t is not None else None

    def list_tasks(self, flt: TaskFilter) -> list[TaskRecord]:
        with self._lock:
            rows = [
                t
                for t in self._tasks.values()
                if (flt.status is None or shown(t.status, t.started_at) is State(flt.status))
                and (flt.queue is None or t.queue == flt.queue)
                and (flt.batch is None or t.batch == flt.batch)
                and (flt.group is None or t.group == flt.group)
                and (flt.name is None or t.name == flt.name)
                and (flt.error_prefix is None or (t.error or "").startswith(flt.error_prefix))
                and (flt.trace_id is None or t.trace_id == flt.trace_id)
                and (flt.key is None or t.key == flt.key)
                and (flt.after_id is None or (t.id < flt.after_id if flt.newest_first else t.id > flt.after_id))
            ]
            if flt.min_id is not None or flt.max_id is not None:
                lo, hi = flt.min_id, flt.max_id
                rows = [t for t in rows if (lo is None or t.id >= lo) and (hi is None or t.id <= hi)]
            rows.sort(key=lambda t: t.id, reverse=flt.newest_first)
            return [_shown(t) for t in rows[flt.offset : flt.offset + flt.limit]]

    def finished_runs(self, start: float, end: float, limit: int) -> list[FinishedRun]:
        with self._lock:
            rows = [
                FinishedRun(t.id, t.name, t.queue, t.status.value, t.run_at, t.started_at, t.finished_at)
                for t in self._tasks.values()
                if t.finished_at is not None and start <= t.finished_at < end
            ]
        rows.sort(key=lambda r: (r.finished_at, r.id))
        return rows[: max(0, limit)]

    def save_minute_stats(self, rows: Sequence[MinuteStat], before: float) -> None:
        with self._lock:
            for r in rows:
                self._minutes[(r.minute, r.queue, r.name)] = r
            for k in [k for k in self._minutes if k[0] < before]:
                del self._minutes[k]

    def minute_stats(self, since: float) -> list[MinuteStat]:
        with self._lock:
            return sorted((r for r in self._minutes.values() if r.minute >= since), key=lambda r: r.minute)

    def line_head(self, group: str) -> TaskRecord | None:
        with self._lock:
            for tid in self._groups[group].ids if group in self._groups else ():
                t = self._tasks[tid]
                if t.status in ACTIVE or (t.status is State.FAILED and t.halt_group_on_failure):
                    return _shown(t)
            return None

    def held_tasks(
        self, worker: str | None = None, limit: int = 1000, after: tuple[str, int] | None = None
    ) -> list[TaskRecord]:
        with self._lock:
            held = [
                t
                for t in (self._tasks[i] for i in self._running)
                if (worker is None or t.worker_id == worker)
                and (after is None or (t.worker_id or "", t.id) > (after[0], after[1]))
            ]
            held.sort(key=lambda t: (t.worker_id or "", t.id))
            return [_shown(t) for t in held[: max(0, limit)]]

    def counts(self, queue: str | None = None) -> dict[str, int]:
        out: dict[str, int] = {}
        with self._lock:
            if queue is None:
                out = {s.value: n for s, n in self._count.items() if n}
                reserved = sum(1 for tid in self._running if self._tasks[tid].started_at is None)
                if reserved:
                    out[State.RUNNING.value] -= reserved
                    out[RESERVED.value] = reserved
                    if not out[State.RUNNING.value]:
                        del out[State.RUNNING.value]
                return out
            for t in self._tasks.values():
                if t.queue == queue:
                    st = shown(t.status, t.started_at).value
                    out[st] = out.get(st, 0) + 1
        return out

    def queue_counts(self) -> dict[str, dict[str, int]]:
        out: dict[str, dict[str, int]] = {}
        with self._lock:
            for t in self._tasks.values():
                if t.status in ACTIVE:
                    per = out.setdefault(t.queue, {})
                    st = shown(t.status, t.started_at).value
                    per[st] = per.get(st, 0) + 1
        return out

    def group_lines(self, limit: int = 50, offset: int = 0) -> list[GroupLine]:
        lines: dict[str, list[TaskRecord]] = {}
        with self._lock:
            for t in self._tasks.values():
                if t.group is not None and (
                    t.status in ACTIVE or (t.status is State.FAILED and t.halt_group_on_failure)
                ):
                    lines.setdefault(t.group, []).append(t)
            out = []
            for g, ts in lines.items():
                head = min(ts, key=lambda t: t.id)
                status = shown(head.status, head.started_at).value
                out.append(GroupLine(g, len(ts), head.id, head.name, status, head.worker_id, head.error))
        out.sort(key=lambda gl: (not gl.blocked, gl.group))
        return out[offset : offset + limit]

    def batch_list(self, after: str | None = None, limit: int = 20) -> list[tuple[str, dict[str, int]]]:
        per: dict[str, dict[str, int]] = {}
        with self._lock:
            for t in self._tasks.values():
                if t.batch is not None and (after is None or t.batch > after):
                    c = per.setdefault(t.batch, {})
                    st = shown(t.status, t.started_at).value
                    c[st] = c.get(st, 0) + 1
        return [(b, per[b]) for b in sorted(per)[:limit]]

    def recent_finished(self, since: float, limit: int, *, newest_first: bool = False) -> list[FinishedTask]:
        with self._lock:
            rows = [
                FinishedTask(t.id, t.name, t.queue, t.status.value, t.started_at, t.finished_at)
                for t in self._tasks.values()
                if t.finished_at is not None and t.finished_at >= since
            ]
        rows.sort(key=lambda r: (r.finished_at, r.id), reverse=newest_first)
        return rows[:limit]

    def cancel(self, task_id: int) -> TaskRecord | None:
        with self._lock:
            now = self.now()
            t = self._tasks.get(task_id)
            if t is None:
                return None
            if t.status is State.RUNNING:
                t.cancel_requested = True
                self._cancel_reasons.pop(t.id, None)  # an operator's cancel says "canceled"
            elif t.status in (State.PENDING, State.RETRYING, State.WAITING):
                self._stamp.pop(t.id, None)
                self._waiting_on.pop(t.id, None)
                self._set(t, State.CANCELED, finished_at=now, error="canceled")
                self._finish_effects(t, now)
                self._wake.notify_all()
            return _shown(t)

    def retry(self, task_id: int) -> bool:
        with self._lock:
            now = self.now()
            t = self._tasks.get(task_id)
            if t is None or t.status not in (State.FAILED, State.TIMEOUT, State.CANCELED):
                return False
            self._retry(t, now)
            self._wake.notify_all()
            return True

    def _retry(self, t: TaskRecord, now: float) -> None:
        self._set(
            t, State.PENDING, attempt=0, snoozes=0, crashes=0, run_at=now, finished_at=None, cancel_requested=False
        )
        self._requeue(t, now)

    def _dead(self, batch: str | None) -> list[TaskRecord]:
        return [
            t
            for t in sorted(self._tasks.values(), key=lambda t: t.id)
            if t.status in DEAD and (batch is None or t.batch == batch)
        ]

    def dead_letters(
        self, batch: str | None = None, limit: int = 100, offset: int = 0, *, after_id: int | None = None
    ) -> list[TaskRecord]:
        with self._lock:
            dead = [t for t in self._dead(batch) if after_id is None or t.id > after_id]
            return [replace(t) for t in dead[max(0, offset) : max(0, offset) + max(0, limit)]]

    def retry_dead(self, batch: str | None = None, limit: int = 10_000) -> list[int]:
        with self._lock:
            now = self.now()
            dead = self._dead(batch)[: max(0, limit)]
            # every task back in its group's line first, then the heads recomputed
            for t in dead:
                self._set(t, State.PENDING, attempt=0, run_at=now, finished_at=None, cancel_requested=False)
                if t.group is not None:
                    self._group_insert(t)
            for t in dead:
                if t.group is not None:
                    self._group_advance(t.group, now)
                else:
                    self._enqueue(t, now)
            if dead:
                self._wake.notify_all()
            return [t.id for t in dead]

    # ---- worker processes ---------------------------------------------------
    def report_worker(self, info: WorkerInfo) -> None:
        with self._lock:
            now = self.now()
            old = self._workers.get(info.id)
            started = old.started_at if old is not None else now
            self._workers[info.id] = replace(info, started_at=started, heartbeat_at=now)

    def remove_worker(self, worker_id: str) -> None:
        with self._lock:
            self._workers.pop(worker_id, None)

    def workers(self) -> list[WorkerInfo]:
        with self._lock:
            return sorted(self._workers.values(), key=lambda w: (w.started_at, w.id))

    def forget_workers(self, before: float) -> int:
        with self._lock:
            holding = {self._tasks[i].worker_id for i in self._running}
            gone = [w for w, info in self._workers.items() if info.heartbeat_at < before and w not in holding]
            for w in gone:
                del self._workers[w]
            return len(gone)

    # ---- fleet control ------------------------------------------------------
    def fleet_level(self) -> FleetLevel:
        with self._lock:
            return self._level

    def set_fleet_level(self, new: FleetLevel, *, auto: bool, event: str | None = None) -> bool:
        with self._lock:
            cur = self._level
            if auto and cur.manual:
                return False
            now = self.now()
            changed_at = now if new.level != cur.level or cur.changed_at is None else cur.changed_at
            self._level = replace(new, changed_at=changed_at)
            if event is not None:
                self._add_event(now, "level", "fleet", event)
            self._changes += 1
            self._wake.notify_all()
            return True

    # ---- the event stream (lock held by the callers of _add_event) ---------
    def _add_event(self, at: float, kind: str, subject: str, data: str | dict) -> int:
        eid = next(self._event_ids)
        self._events.append(_EventRow(eid, at, kind, subject, data))
        if len(self._events) > MEMORY_EVENTS_KEEP + MEMORY_EVENTS_KEEP // 8:
            del self._events[: len(self._events) - MEMORY_EVENTS_KEEP]
        self._event_added.notify_all()
        return eid

    def _task_event(self, t: TaskRecord, before: State | None, now: float) -> None:
        kind = ev.SUBMITTED if before is None else ev.state_kind(t.status.value)
        data = ev.task_event_fields(t, None if before is None else before.value)
        self._add_event(now, kind, ev.task_subject(t.id), data)

    def _breaker_event(self, bev: BreakerEvent) -> None:
        self._breaker_events.append(bev)
        data = {"name": bev.name, "from": bev.before, "to": bev.after, "reason": bev.reason}
        self._add_event(bev.at, ev.BREAKER, f"breaker:{bev.name}", data)

    @staticmethod
    def _event(row: _EventRow) -> Event:
        data = row.data if isinstance(row.data, str) else dumps(row.data)
        return Event(row.id, row.at, row.kind, row.subject, data)

    def add_event(self, kind: str, subject: str, data: str) -> int:
        with self._lock:
            return self._add_event(self.now(), kind, subject, data)

    def events(self, kind: str | None = None, limit: int = 100) -> list[Event]:
        with self._lock:
            rows = (e for e in reversed(self._events) if kind is None or e.kind == kind)
            return [self._event(r) for r in itertools.islice(rows, max(0, limit))]

    def read_events(self, cursor: Any, limit: int = 500) -> tuple[list[Event], Any]:
        with self._lock:
            start = bisect.bisect_right(self._events, int(cursor), key=lambda r: r.id)
            rows = self._events[start : start + max(0, limit)]
        out = [self._event(r) for r in rows]
        return out, (out[-1].id if out else cursor)

    def wait_for_events(self, timeout: float) -> None:
        with self._lock:
            last = self._events[-1].id if self._events else 0
            self._event_added.wait_for(lambda: (self._events[-1].id if self._events else 0) != last, max(0.0, timeout))

    def trim_events(self, keep: int, before: float, limit: int | None = None) -> int:
        with self._lock:
            n = len(self._events)
            kept = [e for e in self._events[-keep:] if e.at >= before] if keep > 0 else []
            gone = n - len(kept)
            if limit is not None and gone > limit:  # the oldest ``limit`` go
                gone = max(0, limit)
                kept = self._events[gone:]
            self._events = kept
            return gone

    def failing_kinds(self, since: float, in_a_row: int, scan: int = 500) -> list[str]:
        with self._lock:
            bad = [t for t in self._tasks.values() if t.status in DEAD and (t.finished_at or 0) >= since]
            bad.sort(key=lambda t: t.id, reverse=True)
            seen: dict[str, list[int]] = {}
            for t in bad[: max(0, scan)]:
                seen.setdefault(t.name, []).append(t.id)
            out = []
            for name, ids in seen.items():
                if len(ids) < in_a_row:
                    continue
                oldest = ids[in_a_row - 1]
                if not any(
                    t.name == name and t.id > oldest and t.status is State.SUCCESS for t in self._tasks.values()
                ):
                    out.append(name)
            return sorted(out)

    def prune(self, before: Mapping[str, float], limit: int) -> int:
        cut = {State(k): float(v) for k, v in before.items()}
        with self._lock:
            old = sorted(
                (t for t in self._tasks.values() if t.status in cut and (t.finished_at or 0.0) < cut[t.status]),
                key=lambda t: (t.finished_at or 0.0, t.id),
            )
            if not old or limit <= 0:
                return 0
            needed: set[int] = set()  # upstreams of unfinished tasks and of dead letters
            busy_batches: set[str] = set()
            for t in self._tasks.values():
                if t.depends_on and (t.status in ACTIVE or t.status in DEAD):
                    needed.update(t.depends_on)
                if t.batch is not None and t.status in ACTIVE:
                    busy_batches.add(t.batch)
            busy_batches.update(
                name for name, b in self._batches.items() if b.on_complete is not None and not b.settled
            )
            gone = 0
            for t in old:
                if gone >= limit:
                    break
                if t.id in needed or (t.batch is not None and t.batch in busy_batches):
                    continue
                g = self._groups.get(t.group) if t.group is not None else None
                if g is not None and t.id in g.ids:
                    halting = t.status is State.FAILED and t.halt_group_on_failure
                    if halting and any(i > t.id and self._tasks[i].status in ACTIVE for i in g.ids):
                        continue  # a halting failure with tasks behind it
                    g.ids.remove(t.id)
                    self._group_advance(t.group, self.now())  # type: ignore[arg-type]
                del self._tasks[t.id]
                self._count[t.status] -= 1
                self._stamp.pop(t.id, None)
                self._dependents.pop(t.id, None)
                self._waiting_on.pop(t.id, None)
                if t.key is not None and self._keys.get(t.key) == t.id:
                    del self._keys[t.key]
                gone += 1
            return gone

    def set_batch(self, batch: str, on_complete: str | None) -> None:
        with self._lock:
            self._batches.setdefault(batch, _Batch()).on_complete = on_complete

    def settle_batches(self, batches: Collection[str] | None = None, limit: int = 100) -> list[int]:
        due = []
        with self._lock:
            names = self._batches if batches is None else [b for b in batches if b in self._batches]
            for name in names:
                entry = self._batches[name]
                if entry.on_complete is None or entry.settled:
                    continue
                summary = self._batch_summary([t for t in self._tasks.values() if t.batch == name], name)
                if summary.status in FINAL_BATCH:
                    entry.settled = True  # marked under the lock: one caller submits it
                    due.append(callback_task(name, entry.on_complete, summary.as_dict()))
                    if len(due) >= limit:
                        break
        return [r.id for r in self.submit(due)] if due else []

    def finished_history(
        self, *, name: str | None = None, batch: str | None = None, limit: int = 10_000
    ) -> list[HistoryRow]:
        ended = (State.SUCCESS, State.FAILED, State.TIMEOUT)
        out: list[HistoryRow] = []
        with self._lock:
            for t in itertools.islice(reversed(self._tasks.values()), max(0, limit) * HISTORY_SCAN):
                if len(out) >= limit:
                    break
                if t.status in ended and (name is None or t.name == name) and (batch is None or t.batch == batch):
                    out.append(HistoryRow(t.status.value, t.started_at, t.finished_at, t.attempt))
        return out

    def batch_summary(self, batch: str) -> BatchSummary:
        with self._lock:
            rows = [t for t in self._tasks.values() if t.batch == batch]
        return self._batch_summary(rows, batch)

    @staticmethod
    def _batch_summary(rows: list[TaskRecord], batch: str) -> BatchSummary:
        counts: dict[str, int] = {}
        for t in rows:
            st = shown(t.status, t.started_at).value
            counts[st] = counts.get(st, 0) + 1
        durations = sorted(
            t.finished_at - t.started_at for t in rows if t.finished_at is not None and t.started_at is not None
        )
        return BatchSummary(
            batch=batch,
            counts=counts,
            status=base.batch_status(counts),
            total=len(rows),
            avg_duration=sum(durations) / len(durations) if durations else None,
            p99_duration=percentile(durations, 0.99, presorted=True),
            first_created_at=min((t.created_at for t in rows), default=None),
            last_finished_at=max((t.finished_at for t in rows if t.finished_at), default=None),
        )

    # ---- limits -----------------------------------------------------------
    # ---- periodic schedules -------------------------------------------------
    def save_schedules(self, schedules: Sequence[Schedule], now: float | None = None) -> None:
        with self._lock:
            now = self.now() if now is None else first_stamp(now, self.now())
            for sch in schedules:
                row = self._schedules.get(sch.name)
                params = base.schedule_params(sch, now)
                if row is None:
                    row = dict(params, created_at=now, last_tick=None, last_outcome=None, last_task_id=None)
                    self._schedules[sch.name] = row
                row.update({k: v for k, v in params.items() if k != "now"})

    def schedules(self) -> list[ScheduleState]:
        with self._lock:
            out = []
            for name in sorted(self._schedules):
                r = self._schedules[name]
                last = self._tasks.get(r["last_task_id"]) if r["last_task_id"] is not None else None
                out.append(base.schedule_state({**r, "last_task_status": last.status.value if last else None}))
            return out

    def fire_tick(self, schedule: Schedule, tick: int) -> TickResult:
        with self._lock:
            row = self._schedules.get(schedule.name)
            if row is None:
                raise ConfigError(f"schedule {schedule.name!r} was never saved in this store")
            now = self.now()
            if too_early(tick, now):
                return TickResult(EARLY)
            ticks = self._ticks.setdefault(schedule.name, {})
            if tick in ticks:
                return TickResult(TAKEN)
            task_id = None
            outcome = ENQUEUED
            last = self._tasks.get(row["last_task_id"]) if row["last_task_id"] is not None else None
            if not schedule.overlap and last is not None and last.status.value in base.STILL_GOING:
                outcome = SKIPPED
            else:
                (res,) = self._submit_locked([schedule.new_task(tick)], None)
                task_id = res.id
            ticks[tick] = TickRecord(schedule.name, tick, outcome, task_id, now)
            if row["last_tick"] is None or row["last_tick"] <= tick:
                row["last_tick"], row["last_outcome"] = tick, outcome
                if task_id is not None:
                    row["last_task_id"] = task_id
            if len(ticks) % 1024 == 0:  # now and then: the rows no tick can come back to
                for old in [t for t in ticks if t < tick - base.TICKS_KEPT_SECONDS]:
                    del ticks[old]
            return TickResult(outcome, task_id)

    def schedule_ticks(self, schedule: str, limit: int = 100) -> list[TickRecord]:
        with self._lock:
            rows = sorted(self._ticks.get(schedule, {}).values(), key=lambda r: -r.tick)
            return rows[: max(0, limit)]

    def set_limit(self, spec: LimitSpec) -> LimitSpec:
        with self._lock:
            old = self._limits.get(spec.name)
            before = None if old is None else old.spec
            return self._write_limit(old, limit_rules.declare(before, spec), "declare", "app")

    def change_limit(self, name: str, changes: Mapping[str, Any], *, by: str, reset: bool = False) -> LimitSpec:
        with self._lock:
            old = self._limits.get(name) if KEY_SEP not in name else None
            if old is None:
                raise limit_rules.unknown(name, (k for k in self._limits if KEY_SEP not in k))
            after = limit_rules.change(old.spec, changes, by, reset=reset)
            return self._write_limit(old, after, "reset" if reset else "set", by)

    def _write_limit(self, old: LimitState | None, spec: LimitSpec, action: str, by: str) -> LimitSpec:
        """Write a limit's row (lock held): a changed rate starts a full
        bucket; the log of starts is kept; an event if anything changed."""
        now = self.now()
        data = limit_rules.event_data(action, by, None if old is None else old.spec, spec)
        if old is None or old.spec.settings() != spec.settings():
            spec = replace(spec, changed_at=now)
        new = LimitState(spec)
        if old is not None and old.spec.rate == spec.rate:  # the bucket is kept
            new.tokens, new.counted_at = old.tokens, old.counted_at
        if old is not None:  # starts made are starts made, whatever the new rate
            new.starts = old.starts
        self._limits[spec.name] = new
        self._adaptive.pop(spec.name, None)  # fixed values: no controller sets it any more
        prefix = keyed_name(spec.name, "")
        for key in [n for n in self._key_controllers if n.startswith(prefix)]:  # nor its keys
            del self._key_controllers[key]
            self._limits[key] = LimitState(LimitSpec(key, paused_until=self._limits[key].spec.paused_until))
        if data is not None:
            self._add_event(now, ev.LIMIT, limit_rules.subject(spec.name), data)
        self._changes += 1
        self._wake.notify_all()
        return replace(spec)

    def forget_keys(self, limit: int = 1000) -> int:
        with self._lock:
            now = self.now()
            gone: list[str] = []
            for name, lim in self._limits.items():
                if len(gone) >= limit:
                    break
                if KEY_SEP in name:
                    base = self._limits.get(name.partition(KEY_SEP)[0])
                    if key_at_rest(base.spec if base else None, lim, now) and not adp.key_live(
                        self._key_controllers.get(name), now
                    ):
                        gone.append(name)
            for name in gone:
                del self._limits[name]
                self._key_controllers.pop(name, None)
            return len(gone)

    def _set_effective(
        self, name: str, concurrency: int | None, rate: str | None, burst: int | None, per_key: bool | None = None
    ) -> None:
        """A limit's values as set_limit writes them, its bucket kept while its rate is (lock held)."""
        old = self._limits.get(name)
        keyed = per_key if per_key is not None else bool(old and old.spec.per_key)
        spec = LimitSpec(name, concurrency, rate, burst, old.spec.paused_until if old else None, per_key=keyed)
        new = LimitState(spec)
        if old is not None:
            if old.spec.rate == rate:
                new.tokens, new.counted_at = old.tokens, old.counted_at
            new.starts = old.starts
        self._limits[name] = new
        self._changes += 1
        self._wake.notify_all()

    def _adaptive_rows(self) -> dict[str, adp.AdaptiveRow]:
        rows = {}
        for name, (spec, state) in self._adaptive.items():
            lim = self._limits[name].spec
            st = None if state is None else adp.ControllerState.from_dict(loads(state))
            rows[name] = adp.AdaptiveRow(name, adp.AdaptiveSpec.from_json(spec), lim.concurrency, lim.rate, st)
        return rows

    def declare_adaptive(self, limit: LimitSpec, spec: adp.AdaptiveSpec) -> None:
        with self._lock:
            old = self._adaptive_rows().get(limit.name)
            conc, rate = adp.declared(old, spec, limit.concurrency, limit.rate)
            self._set_effective(limit.name, conc, rate, limit.burst, limit.per_key)
            self._adaptive[limit.name] = (spec.to_json(), None if old is None else self._adaptive[limit.name][1])

    def adaptive_limits(self) -> dict[str, adp.AdaptiveRow]:
        with self._lock:
            return self._adaptive_rows()

    def save_adaptive(
        self,
        name: str,
        holder: str,
        role: str,
        state: str,
        concurrency: int | None,
        rate: str | None,
        event: str | None,
    ) -> bool:
        with self._lock:
            now = self.now()
            leader, until = self._leaders.get(role, ("", 0.0))
            if leader != holder or until < now or name not in self._adaptive:
                return False
            lim = self._limits[name].spec
            conc = lim.concurrency if concurrency is None else concurrency
            new_rate = lim.rate if rate is None else rate
            if (conc, new_rate) != (lim.concurrency, lim.rate):
                self._set_effective(name, conc, new_rate, lim.burst)
            self._adaptive[name] = (self._adaptive[name][0], state)
            if event is not None:
                self._add_event(now, ev.LIMIT_ADAPTED, f"limit:{name}", event)
            return True

    def adaptive_keys(self, limit: str) -> dict[str, str]:
        prefix = keyed_name(limit, "")
        with self._lock:
            return {n[len(prefix) :]: c for n, c in self._key_controllers.items() if n.startswith(prefix)}

    def save_adaptive_keys(
        self,
        limit: str,
        holder: str,
        role: str,
        keys: Mapping[str, tuple[str | None, int | None, str | None]],
        events: Mapping[str, str] | None = None,
    ) -> bool:
        with self._lock:
            now = self.now()
            leader, until = self._leaders.get(role, ("", 0.0))
            if leader != holder or until < now or limit not in self._adaptive:
                return False
            for key, data in (events or {}).items():
                self._add_event(now, ev.LIMIT_KEY_ADAPTED, ev.limit_key_subject(limit, key), data)
            for key, (state, conc, rate) in keys.items():
                name = keyed_name(limit, key)
                old = self._limits.get(name)
                new = LimitState(LimitSpec(name, conc, rate, paused_until=old.spec.paused_until if old else None))
                if old is not None:
                    if old.spec.rate == rate:
                        new.tokens, new.counted_at = old.tokens, old.counted_at
                    new.starts = old.starts
                self._limits[name] = new
                if state is None:
                    self._key_controllers.pop(name, None)
                else:
                    self._key_controllers[name] = state
            self._changes += 1
            self._wake.notify_all()
            return True

    def report_limits(self, worker_id: str, reports: str) -> None:
        with self._lock:
            now = self.now()
            self._limit_reports = [
                r for r in self._limit_reports if r[0] != worker_id or r[1] >= now - adp.REPORTS_KEPT
            ]
            self._limit_reports.append((worker_id, now, reports))

    def take_limit_reports(self) -> list[tuple[str, str]]:
        with self._lock:
            taken, self._limit_reports = self._limit_reports, []
            return [(w, r) for w, _, r in taken]

    def limits_waiting(self, names: Collection[str]) -> set[str]:
        wanted = set(names)
        found: set[str] = set()
        with self._lock:
            now = self.now()
            for t in self._tasks.values():
                if t.status in QUEUED and t.limits and t.run_at <= now:
                    found.update(wanted.intersection(t.limits))
                    if found == wanted:
                        break
        return found

    def limits(self) -> dict[str, LimitSpec]:
        with self._lock:
            return {k: replace(v.spec) for k, v in self._limits.items() if KEY_SEP not in k}

    def limit_tokens(self) -> dict[str, float]:
        with self._lock:
            now = self.now()
            levels = {k: v.tokens_now(now) for k, v in self._limits.items() if KEY_SEP not in k}
        return {k: t for k, t in levels.items() if t is not None}

    def limit_frees_at(self) -> dict[str, float]:
        with self._lock:
            now = self.now()
            at = {k: v.frees_at(now) for k, v in self._limits.items()}
        return {k: t for k, t in at.items() if t is not None}

    # ---- pauses by hand -----------------------------------------------------
    def pause(self, kind: str, name: str, by: str = "") -> bool:
        with self._lock:
            if (kind, name) in self._pauses:
                return False
            now = self.now()
            self._pauses[(kind, name)] = Pause(kind, name, now, by)
            self._paused = Paused.of(self._pauses)
            self._add_event(now, *pause_event(kind, name, True, by))
            return True

    def resume(self, kind: str, name: str, by: str = "") -> bool:
        with self._lock:
            if self._pauses.pop((kind, name), None) is None:
                return False
            self._paused = Paused.of(self._pauses)
            self._add_event(self.now(), *pause_event(kind, name, False, by))
            self._changes += 1
            self._wake.notify_all()
            return True

    def pauses(self) -> list[Pause]:
        with self._lock:
            return sorted(self._pauses.values(), key=pause_order)

    # ---- circuit breakers -------------------------------------------------
    def set_breaker(self, name: str, config: brk.BreakerConfig) -> None:
        with self._lock:
            old = self._breakers.get(name)
            self._breakers[name] = BreakerRow(name, config, old.state if old else brk.Breaker())
            self._changes += 1

    def breakers(self) -> dict[str, tuple[brk.BreakerConfig, brk.Breaker]]:
        with self._lock:
            return {n: (r.config, r.state) for n, r in self._breakers.items()}

    def force_breaker(self, name: str, state: brk.BreakerState, reason: str) -> BreakerEvent:
        with self._lock:
            row = self._breakers.get(name)
            if row is None:
                raise ConfigError(f"no breaker named {name!r}")
            now = self.now()
            row.state, change = brk.force(row.state, row.config, now, state, reason)
            ev = BreakerEvent(now, name, change.before.value, change.after.value, reason, change.calls, change.failures)
            self._breaker_event(ev)
            self._changes += 1
            self._wake.notify_all()
            return ev

    def breaker_events(self, name: str | None = None, limit: int = 20) -> list[BreakerEvent]:
        with self._lock:
            evs = [e for e in self._breaker_events if name is None or e.name == name]
        return evs[::-1][: max(0, limit)]

    def gate_rows(self, names: Collection[str]) -> Gates:
        with self._lock:
            wanted = {n for name in names for n in (name, split_key(name)[0])}
            limits = {n: replace(lim) for n in wanted if (lim := self._limits.get(n)) is not None}
            breakers = {n: replace(b) for n, b in self._breakers.items()}
            return Gates(self.now(), limits, dict(self._usage), breakers)

    def limit_usage(self) -> dict[str, int]:
        with self._lock:
            return fold_keys(self._usage.items())

    def busiest_keys(self, top: int = 5) -> dict[str, list[tuple[str, int]]]:
        with self._lock:
            return busiest_keys(self._usage.items(), top)

    # ---- maintenance ------------------------------------------------------
    @staticmethod
    def _sweep_row(t: TaskRecord) -> SweepRow:
        return SweepRow(
            t.id, t.version, t.attempt, t.max_retries, t.started_at, t.timeout, t.lease_expires_at, t.crashes
        )

    def find_stuck(self, now: float, limit: int) -> list[SweepRow]:
        with self._lock:
            stuck = [
                t
                for t in map(self._tasks.__getitem__, sorted(self._running))
                if t.lease_expires_at is not None and t.lease_expires_at < now
            ]
            return [self._sweep_row(t) for t in stuck[: max(0, limit)]]

    def find_stale_pending(self, before: float, limit: int) -> list[SweepRow]:
        with self._lock:
            stale = (
                t
                for t in self._tasks.values()
                if t.status is State.PENDING and t.run_at < before and self._idle_head(t, before)
            )
            return [self._sweep_row(t) for t in itertools.islice(stale, max(0, limit))]

    def find_expired(self, now: float, limit: int) -> list[SweepRow]:
        with self._lock:
            out: list[SweepRow] = []
            for tid in sorted(self._deadlines):
                t = self._tasks.get(tid)
                if t is None or t.status in FINAL or t.attempt or t.snoozes:
                    del self._deadlines[tid]  # ended, or started once: its deadline is spent
                elif t.status is State.PENDING and expired(t.expires_at, t.attempt, t.snoozes, now):
                    out.append(self._sweep_row(t))
                    if len(out) >= limit:
                        break
            return out

    def _idle_head(self, t: TaskRecord, before: float) -> bool:
        """Ungrouped, or its group's head with nothing of the group running
        and no claim of it since ``before`` (a task waiting its turn is not stale)."""
        if t.group is None:
            return True
        g = self._groups.get(t.group)
        return g is not None and not g.running and bool(g.ids) and g.ids[0] == t.id and g.last_claimed_at < before

    def rescue(self, rescues: Sequence[Rescue]) -> list[bool]:
        applied: list[bool] = []
        with self._lock:
            now = self.now()
            for r in rescues:
                t = self._tasks.get(r.task_id)
                expected = State.PENDING if r.to is State.CANCELED else State.RUNNING
                if (
                    t is None
                    or t.status is not expected
                    or t.version != r.version
                    or (t.lease_expires_at or 0) >= now  # renewed since the sweep read it
                ):
                    applied.append(False)
                    continue
                if expected is State.RUNNING:
                    self._release(t, now)
                else:
                    self._stamp.pop(t.id, None)
                error = t.error if r.error is None else r.error
                if r.crashed:
                    t.crashes += 1
                if r.give_back:
                    t.attempt = max(0, t.attempt - 1)
                if r.to in QUEUED:
                    self._set(t, r.to, run_at=now, error=error, worker_id=None)
                    if t.group is not None:
                        self._group_advance(t.group, now)
                    else:
                        self._enqueue(t, now)
                else:
                    self._set(t, r.to, error=error, finished_at=now)
                    self._finish_effects(t, now)
                applied.append(True)
            if any(applied):
                self._wake.notify_all()
        return applied

    def try_lead(self, role: str, holder: str, ttl: float) -> bool:
        with self._lock:
            now = self.now()
            leader, until = self._leaders.get(role, (holder, now))
            if leader == holder or until < now:
                self._leaders[role] = (holder, now + ttl)
                return True
            return False


def _candidate(t: TaskRecord, now: float) -> Candidate:
    """A task as the claim planner reads it."""
    return Candidate(
        t.id,
        t.name,
        t.queue,
        t.group,
        frozenset(t.limits) if t.limits else NO_LIMITS,
        t.status is State.RETRYING,
        t.run_at <= now,
        t.status in QUEUED,
    )


def _shown(t: TaskRecord) -> TaskRecord:
    """A copy of ``t`` as a reader sees it (RESERVED while held, not started)."""
    return replace(t, status=shown(t.status, t.started_at))
