"""The one interface between the engine and task state.

Every store (``memory://``, ``sqlite:///path``, ``postgresql://...``) implements
:class:`Store` with the same semantics, checked by one conformance suite
(``tests/conformance``). The engine never touches a task except through these
methods, and every method that changes a task is a guarded write: it applies
only if the task is still in the state (and lease/version) the caller saw, and
otherwise changes nothing and says so.

Claim rules (the heart; every store implements them the same way: the
memory and SQLite stores run the pure :class:`corral.core.claims.ClaimPlanner`
over the candidates they read, PostgreSQL decides them in one statement; a
claim's options are one :class:`corral.core.claims.ClaimRequest`):

1. Candidates are tasks in PENDING or RETRYING whose ``run_at`` has come, in
   one of the asked queues, whose name the worker knows.
2. A task with a ``group`` is a candidate only if it is its group's *head*: no
   task of the same group with a smaller id is ACTIVE (WAITING, PENDING,
   RETRYING, RUNNING) or FAILED with ``halt_group_on_failure`` set. So at most
   one task (or chunk) of a group is ever in flight, in submit order, and a
   retrying head blocks its group.
3. With ``chunk_size > 1`` the head and the following tasks of its group (up
   to ``chunk_size``, stopping at the first one that is not a ready candidate)
   form one :class:`Claim`, run in order by one worker.
4. Candidates are taken by their *rank*, ``eligible time - priority * 60 s``
   (lowest first; :mod:`corral.core.priorities`: higher priority first, with
   ageing, one level for each minute waited), then by id. For a group head the eligible time is
   ``max(run_at, group.last_claimed_at)``: a group served just now goes to the
   back, which is round robin between groups. A retry's ``run_at`` is the end
   of its backoff, so it queues behind fresh work submitted before then.
5. Named limits count *claims* (lease tokens) in RUNNING, across every worker
   sharing the store; a candidate whose limit is full is skipped, never taken.
   The same holds for a limit's ``rate`` (a sliding window's log of starts,
   or a token bucket, in the limit's row, charged with the store's clock in
   the claim's own transaction; a unit
   under a rate is one task), a limit paused by a 429's Retry-After, and a
   circuit breaker on one of the task's limits or on its name (OPEN: nothing
   passes; HALF_OPEN: exactly ``probes`` claims across the fleet), and a
   pause by hand (:meth:`Store.pause`) of the task's queue, its group or one
   of its limits, read in the claim's own transaction. A skipped task keeps
   its attempts and holds its group's place.
6. Never more than ``max_units`` claims. Claimed tasks become RUNNING with a
   new lease token, ``lease_expires_at = now + lease_seconds``, version + 1.
   The first task of each claim gets ``started_at = now`` and ``attempt + 1``;
   the others record theirs with their outcome (``Outcome.started_at`` and
   ``Outcome.attempt``), or, when they run longer than a moment, by
   :meth:`Store.record_starts` (one write for all the worker's starts due),
   so running a chunk of short tasks costs no write per task, and a crash
   hands back members whose start was never recorded without burning an
   attempt. A *prefetch* claim records no start at all (not even the
   head's) and takes no unit naming a limit or a name under a breaker.
   A RUNNING task whose start is not recorded reads as RESERVED.
7. With a ``retry_share`` the claim keeps retries on a path apart: still in
   the order of rule 4, but while fresh (PENDING) work is claimable at most
   ``ceil(max_units * retry_share)`` claims (at least one; or ``retry_cap``
   when given, 0 allowed) are headed by a RETRYING task; the retries past
   that wait for a later claim, unless fresh work runs short: then they take
   the rest. Rules 2, 3 and 5 hold on both.

Time: memory and SQLite read "now" from the :class:`~corral.core.clock.Clock`
they were opened with (tests pass a fake one); PostgreSQL uses the database
clock.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from corral.core.adaptive import AdaptiveRow, AdaptiveSpec
from corral.core.breaker import Breaker, BreakerConfig, BreakerState
from corral.core.claims import ClaimRequest
from corral.core.cron import Schedule, ScheduleState, TickRecord, TickResult
from corral.core.gates import Gates
from corral.core.minutes import FinishedRun, MinuteStat
from corral.core.model import (
    DEFAULT_LEASE_SECONDS,
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
)
from corral.core.pauses import Pause
from corral.core.planning import HistoryRow
from corral.core.states import ACTIVE, State
from corral.errors import QueueFull


def check_bound(counts: dict[str, int], adding: int, max_queued: int | None) -> None:
    """Raise QueueFull when ``adding`` more would put the queued tasks over ``max_queued``."""
    if max_queued is None:
        return
    queued = sum(counts.get(s, 0) for s in ("WAITING", "PENDING", "RETRYING"))
    if queued + adding > max_queued:
        raise QueueFull(f"queue bound reached: {queued} queued, {adding} more asked, bound {max_queued}")


@dataclass(frozen=True, slots=True)
class Offer:
    """An idle worker's free slots, offered while it waits for work: a store
    that supports it may hand a new plain task (no group, no limit, due now)
    straight to the worker in the submit's own commit, instead of the worker
    claiming it in a second one."""

    worker_id: str
    queues: tuple[str, ...]
    #: the task names the worker can run (None: any)
    names: frozenset[str] | None
    slots: int
    lease_seconds: float = DEFAULT_LEASE_SECONDS


@dataclass(slots=True)
class HeartbeatReply:
    lost_tokens: set[str] = field(default_factory=set)  # leases this worker no longer holds
    cancel_requested: set[int] = field(default_factory=set)  # running ids flagged for cancel


@dataclass(frozen=True, slots=True)
class SweepRow:
    """A task a sweep read: what the recovery policy decides on, and the
    version its write is guarded by."""

    id: int
    version: int
    attempt: int
    max_retries: int
    started_at: float | None
    timeout: float | None
    lease_expires_at: float | None
    crashes: int = 0


@dataclass(frozen=True, slots=True)
class Rescue:
    """One guarded write of a sweep (see :mod:`corral.maintenance.recovery`).

    Applies only while the task still has ``version`` and is RUNNING (PENDING
    for ``to`` CANCELED) with its lease over: a renewal that came after the
    sweep read the task wins (a renewal changes no version). ``to`` RETRYING or PENDING queues it again at once
    (attempt intact); FAILED or CANCELED ends it, with the usual effects on
    its dependents and group. ``error`` None keeps the task's error.
    ``crashed`` counts one more crash on the task (``TaskRecord.crashes``);
    ``give_back`` also gives its attempt back (a crash re-run).
    """

    task_id: int
    version: int
    to: State
    error: str | None
    crashed: bool = False
    give_back: bool = False


@dataclass(frozen=True, slots=True)
class FleetLevel:
    """The fleet-wide degradation level as stored (one row; see
    :mod:`corral.core.levels`). ``level`` is a :class:`~corral.core.levels.Level`
    value; ``manual`` means an operator set it and automatic steps leave it alone;
    ``calm_since`` is -inf right after a hand-back (the next evaluation goes
    straight to what the signals call for)."""

    level: int = 0
    manual: bool = False
    calm_since: float | None = None
    reason: str = ""
    changed_at: float | None = None


@dataclass(frozen=True, slots=True)
class Event:
    """One row of the store's event log: what changed, when, and why (``data`` is JSON)."""

    id: int
    at: float
    kind: str
    subject: str
    data: str

    @property
    def details(self) -> dict[str, Any]:
        """``data`` decoded (an empty dict when it is not a JSON object)."""
        import json

        try:
            value = json.loads(self.data)
        except ValueError:
            return {}
        return value if isinstance(value, dict) else {}


#: States of a periodic task's last run that make ``overlap=False`` skip a tick.
STILL_GOING = frozenset(s.value for s in ACTIVE)
#: How long a schedule's tick rows are kept behind its newest tick: far longer
#: than any tick can still be tried, so the unique row always sees a retry.
TICKS_KEPT_SECONDS = 30 * 86400


def prune_params(before: Mapping[str, float], limit: int) -> dict[str, Any] | None:
    """The named parameters of the SQL ``prune`` (a cut-off per final state,
    None where a state is not pruned), or None when nothing can go."""
    cut = {State(k).value: float(v) for k, v in before.items()}
    if not cut or limit <= 0:
        return None
    return {
        "success": cut.get("SUCCESS"),
        "canceled": cut.get("CANCELED"),
        "failed": cut.get("FAILED"),
        "timeout": cut.get("TIMEOUT"),
        "oldest": max(cut.values()),
        "max": int(limit),
    }


def schedule_params(s: Schedule, now: float) -> dict[str, Any]:
    """A schedule's stored columns, as named parameters of ``save_schedule``."""
    return {
        "name": s.name,
        "task": s.task,
        "expr": s.expr,
        "timezone": s.timezone,
        "queue": s.queue,
        "group_key": s.group,
        "overlap": bool(s.overlap),
        "catch_up": s.catch_up,
        "max_delay": s.max_delay,
        "now": now,
    }


def schedule_state(row: Mapping[str, Any]) -> ScheduleState:
    """A row of the ``schedules`` query, read by column name (the same
    columns on every SQL dialect; the memory store builds the same row)."""
    return ScheduleState(
        name=row["name"],
        task=row["task"],
        expr=row["expr"],
        timezone=row["timezone"],
        queue=row["queue"],
        group=row["group_key"],
        overlap=bool(row["overlap"]),
        catch_up=row["catch_up"],
        max_delay=row["max_delay"],
        created_at=row["created_at"],
        last_tick=row["last_tick"],
        last_outcome=row["last_outcome"],
        last_task_id=row["last_task_id"],
        last_task_status=row["last_task_status"],
    )


@dataclass(frozen=True, slots=True)
class FinishedTask:
    """A finished task as the dashboard's charts read it: what ran, how it ended, how long."""

    id: int
    name: str
    queue: str
    status: str
    started_at: float | None
    finished_at: float


@dataclass(frozen=True, slots=True)
class GroupLine:
    """A group with work still in its line: how much, and its head (who holds it)."""

    group: str
    backlog: int  # tasks still occupying the line (head included)
    head_id: int
    head_name: str
    head_status: str
    head_worker: str | None
    head_error: str | None

    @property
    def blocked(self) -> bool:
        """The head failed and halts its group, or waits to be retried: nothing behind it moves."""
        return self.head_status in (State.FAILED.value, State.RETRYING.value, State.TIMEOUT.value)


#: Final states that make a dead letter (CANCELED is an operator's choice, not a failure).
DEAD = (State.FAILED, State.TIMEOUT)


@dataclass(slots=True)
class BatchSummary:
    batch: str
    counts: dict[str, int]
    status: str  # RUNNING, PARTIAL_SUCCESS, ALL_SUCCESS, FAILED (or EMPTY)
    total: int
    avg_duration: float | None
    p99_duration: float | None
    first_created_at: float | None
    last_finished_at: float | None

    def as_dict(self) -> dict[str, Any]:
        """The summary as JSON-ready values (what a batch's callback is given)."""
        return {
            "batch": self.batch,
            "status": self.status,
            "total": self.total,
            "counts": dict(self.counts),
            "avg_duration": self.avg_duration,
            "p99_duration": self.p99_duration,
            "first_created_at": self.first_created_at,
            "last_finished_at": self.last_finished_at,
        }


def batch_status(counts: dict[str, int]) -> str:
    """A batch's aggregate status from its per-state counts."""
    total = sum(counts.values())
    if total == 0:
        return "EMPTY"
    final = sum(counts.get(s.value, 0) for s in (State.SUCCESS, State.FAILED, State.TIMEOUT, State.CANCELED))
    if final < total:
        return "RUNNING"
    ok = counts.get(State.SUCCESS.value, 0)
    if ok == total:
        return "ALL_SUCCESS"
    return "PARTIAL_SUCCESS" if ok else "FAILED"


class Store(abc.ABC):
    """Where tasks live. One instance may be shared by every thread of a process."""

    url: str = ""
    #: True when submit() in one process is seen by workers in another.
    shared: bool = True
    #: monotonic time when a task the last claim skipped for a rate, a pause or
    #: a cooldown may start; wait_for_work() waits no longer than that
    _gate_wake: float | None = None

    def last_outage(self) -> float | None:
        """The monotonic time when this process last found the store away
        (None: never, or a store with no server to lose). A sweeper waits a
        lease's length of good health after it before it takes leases that
        ran out meanwhile: their workers could not renew them."""
        return None

    def _note_gate_wait(self, seconds: float | None) -> None:
        """Remember (from a claim) how long until a skipped gate opens."""
        import time

        self._gate_wake = None if seconds is None else time.monotonic() + max(0.0005, seconds)

    def _gate_timeout(self, timeout: float) -> float:
        """``timeout`` capped at the time left until a gate opens."""
        import time

        wake = self._gate_wake
        if wake is None:
            return timeout
        return max(0.0, min(timeout, wake - time.monotonic()))

    # ---- life cycle -------------------------------------------------------
    def migrate(self) -> None:
        """Create or upgrade the schema; safe when several processes do it at once."""

    def close(self) -> None:
        """Release connections. The store is unusable afterwards."""

    def has_schema(self) -> bool:
        """Whether corral's tables exist here (before any :meth:`migrate`)."""
        return True

    @abc.abstractmethod
    def now(self) -> float:
        """The store's clock in epoch seconds (the database's, for PostgreSQL)."""

    # ---- producers --------------------------------------------------------
    @abc.abstractmethod
    def submit(self, tasks: Sequence[NewTask], *, max_queued: int | None = None) -> list[SubmitResult]:
        """Insert tasks atomically (all or none), in order, ids increasing.

        A task whose ``key`` already exists is not inserted; its result names
        the existing id with ``created=False``. A task with ``depends_on``
        (ids) or ``after`` (positions of earlier tasks of this call, whose ids
        this call assigns: a graph in one write) starts as
        :func:`corral.core.dag.initial_state` says: WAITING while an upstream
        is unfinished, PENDING once they all succeeded (or all ended, under
        ``on_upstream_failure="run"``), CANCELED at once when one ended badly
        under ``"cancel"``. An unknown dependency id raises
        :class:`~corral.errors.SubmitError` and nothing is stored.

        With ``max_queued``, the tasks queued (WAITING, PENDING, RETRYING)
        plus these must not exceed it, counted inside the same write, so
        several submitters together never overshoot the bound: else
        :class:`~corral.errors.QueueFull` and nothing is stored.
        """

    def submit_in(
        self, connection: Any, tasks: Sequence[NewTask], *, max_queued: int | None = None
    ) -> list[SubmitResult]:
        """Insert tasks as :meth:`submit` does, inside the caller's own open
        transaction on ``connection``, never committing it: the tasks exist if
        and only if the caller commits (transactional enqueue)."""
        from corral.errors import ConfigError

        raise ConfigError(
            f"connection= is not supported by the {self.url or 'memory://'} store: it keeps no transactions "
            "to share; use a SQLite or PostgreSQL store"
        )

    # ---- workers ----------------------------------------------------------
    @abc.abstractmethod
    def claim(self, worker_id: str, request: ClaimRequest) -> list[Claim]:
        """Take up to ``request.max_units`` claims by the module's claim rules,
        from ``request.queues``, of the task names in ``request.names`` (None:
        any), chunked up to ``request.chunk_size``, under a lease of
        ``request.lease_seconds``. The request's other fields:

        ``prefetch`` claims units a worker will hold before a slot is free
        for them: none of their tasks names a limit or a task name under a
        breaker (an idle unit must not hold a limit's place, a rate's token
        or a probe), and no start is recorded, the head included (as for a
        chunk member: the outcome records it), so a crash or a hand-back
        before the unit started costs no attempt.

        ``only_retries`` takes only RETRYING tasks (chunk members included):
        the CIRCUIT_OPEN level lets retries drain while fresh work waits.

        ``retry_share`` keeps retries on a path apart, so a flood of failing
        tasks cannot delay fresh work: claim order decides as usual, but while
        fresh (PENDING) work is claimable at most ``ceil(max_units *
        retry_share)`` units (at least one, so retries keep moving) are headed
        by a RETRYING task; units fresh work leaves go to retries. Group
        order, limits, pauses and breakers apply to both paths.

        ``retry_cap`` (with ``retry_share``) gives that bound outright, 0
        allowed: a worker bounds the retries it *holds* to its share of its
        slots, so it passes what is left of that share (retries still take
        every unit fresh work leaves).

        ``retry_max`` (with ``retry_share``) bounds the retry units of the
        claim even when fresh work runs short: a worker that saw fresh work
        arrive a moment ago keeps room free for the next arrivals instead of
        filling every idle slot with retries.

        ``tail`` (``(short, long)``, see :func:`corral.core.pacing.tail_split`)
        shortens chunks near the end of the queued work: a group whose line
        (its head included) has fewer than ``long`` tasks is chunked at most
        ``short`` (the reach then follows ``short``); a longer one keeps
        ``chunk_size``."""

    def backlog(self, at_most: int) -> int | None:
        """Queued tasks (PENDING or RETRYING, of any queue), counted up to
        ``at_most``: how near the end of the queued work a worker is, for
        sizing its chunks (:func:`corral.core.pacing.tail_split`). A hint,
        read often: a store answers from an index or a counter, never by
        reading every task. None: not known (chunks stay as they are)."""
        return None

    @abc.abstractmethod
    def heartbeat(self, tokens: Collection[str], lease_seconds: float) -> HeartbeatReply:
        """Extend the leases of RUNNING tasks holding ``tokens``."""

    def cancel_requested(self, task_ids: Collection[int]) -> set[int]:
        """Which of these tasks an operator asked to cancel (a read, no lease
        change): a worker asks it every second for all it runs, in one call."""
        out = set()
        for tid in task_ids:
            rec = self.get(tid)
            if rec is not None and rec.cancel_requested:
                out.add(tid)
        return out

    @abc.abstractmethod
    def complete(self, outcomes: Sequence[Outcome]) -> list[bool]:
        """Apply guarded outcomes; True for each that applied, False if stale.

        Besides the state: clear the lease, set ``finished_at`` for final
        states, ``run_at`` for RETRYING, ``started_at`` when given and the task has
        none (a chunk member; a start the claim recorded is kept), ``attempt``
        when given (a chunk member records its start with its outcome, so
        running a chunk costs no extra write per task), else ``attempt - 1``
        when ``burn_attempt`` is False. A final state settles WAITING
        dependents: one that ended FAILED, TIMEOUT or CANCELED cancels those
        under ``on_upstream_failure="cancel"`` (and theirs, down the graph)
        with the error "upstream <id> ended <STATE>"; a dependent runs
        (PENDING) once every upstream succeeded, or under ``"run"`` once every
        upstream ended.
        """

    def record_starts(self, starts: Sequence[Start]) -> int:
        """Record the starts of held tasks whose bodies run now (``started_at``
        and ``attempt``), in one write; returns how many applied. Guarded: a
        task applies only while RUNNING under its token with no start
        recorded. The version is kept, so the task's outcome still applies."""
        raise NotImplementedError

    #: True when :meth:`complete_and_claim` writes and claims in one
    #: transaction; a worker hands places over only to such a store (two
    #: transactions on the completer's thread cost it more than they save).
    hands_over: bool = False
    #: False when a key's place (a keyed limit's) never passes over in
    #: :meth:`complete_and_claim`: a unit naming a key then frees its slot as
    #: soon as it ends, as unlimited work does, and its dispatcher claims
    #: while the outcome is written (the claim counts the key's places from
    #: the store, so an outcome not yet written only leaves it looking busier).
    keys_hand_over: bool = True

    def complete_and_claim(
        self,
        outcomes: Sequence[Outcome],
        places: Sequence[Collection[str]],
        worker_id: str,
        request: ClaimRequest,
        *,
        relays: Sequence[tuple[str, Collection[str]]] = (),
    ) -> tuple[list[bool], list[Claim]]:
        """Apply ``outcomes`` and claim, in the same transaction, at most one
        unit for each unit that ended with them (``places``: the limits each
        ended unit named). The place an ended unit held under a capped limit
        passes to its successor without the limit's lock: the count of
        running units does not change, so no other claim can see it over the
        cap. A successor may name only limits its place covers that have no
        rate, no pause and no breaker, and only while the limit is not over
        its cap (lowered meanwhile); anything else waits for an ordinary
        claim. ``request`` is as for :meth:`claim`, but for its
        ``max_units``: one unit at most for each place.

        A place passes over only when the first work waiting under each of
        its limits is work of the request's queues (and of the task names claimed);
        otherwise it is freed for every worker, so a worker of other queues
        under the same limit is not shut out.

        ``relays`` are units still running their last task, each as its
        lease token and the limits it names: for each, at most one successor
        is claimed under that same token, so the limits count one place for
        both and none is free a moment between them. It records no start
        (the worker runs it once its predecessor ended, in that place), and
        names only limits of its predecessor that have no rate, no pause and
        no breaker. A relay's successor comes back with its predecessor's
        token.

        Returns :meth:`complete`'s answer and the claims. This default
        hands nothing over: it writes the outcomes, and their places are
        free for the next claim of any worker."""
        return self.complete(outcomes), []

    def wait_for_work(self, timeout: float, queues: Collection[str] | None = None) -> None:
        """Block up to ``timeout`` seconds, returning early when new work may
        have arrived (a submit, a completion freeing a group or limit).

        ``queues`` (the caller's) lets a store that hears of every change,
        not only of new work, wait on through changes after which nothing in
        them is due: each early return costs the caller a claim."""
        import time

        time.sleep(timeout)

    def wait_offering(
        self, timeout: float, queues: Collection[str], offer: Offer, take: Callable[[list[Claim]], None]
    ) -> None:
        """:meth:`wait_for_work`, with ``offer`` open meanwhile: each task a
        submit hands to the worker during the wait, claimed for it like a
        prefetch (RUNNING under a new lease, no start recorded), is passed to
        ``take`` as it comes (on this thread), and the wait goes on while the
        offer has a slot left: a steady stream of submits is handed over
        without the offer closing between two of them. Withdrawn (or spent)
        before this returns, so nothing is handed to a worker that is not
        waiting; ``take`` may run once more just before, with what was handed
        over in the wait's last moment. This default offers nothing."""
        self.wait_for_work(timeout, queues)

    def wake_waiters(self) -> None:
        """End this store's waits in :meth:`wait_for_work` now (each caller
        then claims once): a stopping worker must not wait out its poll
        interval. This default cannot: its wait is a plain sleep."""

    def set_progress(self, task_id: int, token: str, fraction: float, message: str | None) -> bool:
        """Record progress of a RUNNING task (guarded by its lease token)."""
        raise NotImplementedError

    def save_checkpoint(self, task_id: int, token: str, stage: str, data_json: str) -> bool:
        """Merge ``{stage: data}`` into the task's checkpoint (guarded by lease)."""
        raise NotImplementedError

    # ---- operators --------------------------------------------------------
    @abc.abstractmethod
    def get(self, task_id: int) -> TaskRecord | None:
        """The task as a reader sees it (RESERVED while held but not started)."""

    @abc.abstractmethod
    def list_tasks(self, flt: TaskFilter) -> list[TaskRecord]:
        """Tasks matching ``flt``, shown as :meth:`get` shows them (a status
        of RUNNING matches started tasks only, RESERVED the others)."""

    def task_ids(self, flt: TaskFilter) -> list[int]:
        """The ids :meth:`list_tasks` would answer, in its order: the durable
        stores read the ids alone (a bulk action's count of ten thousand
        tasks builds no record)."""
        return [rec.id for rec in self.list_tasks(flt)]

    def finished_runs(self, start: float, end: float, limit: int) -> list[FinishedRun]:
        """Tasks that finished in ``[start, end)``, in finish order, at most
        ``limit`` (read from the index of finish times)."""
        raise NotImplementedError

    def save_minute_stats(self, rows: Sequence[MinuteStat], before: float) -> None:
        """Write a minute's rows (replacing rows of the same minute, queue and
        name) and delete every row of a minute before ``before``: one write."""
        raise NotImplementedError

    def minute_stats(self, since: float) -> list[MinuteStat]:
        """Every row of a minute at or after ``since``, by minute."""
        raise NotImplementedError

    def held_tasks(
        self, worker: str | None = None, limit: int = 1000, after: tuple[str, int] | None = None
    ) -> list[TaskRecord]:
        """Tasks held by workers now (shown RUNNING or RESERVED), by worker id
        then task id, those after ``after`` (a ``(worker id, task id)``
        position), at most ``limit``; only ``worker``'s when given.

        One read of an index of held rows: its cost follows the running
        work, never the history of finished tasks."""
        raise NotImplementedError

    @abc.abstractmethod
    def counts(self, queue: str | None = None) -> dict[str, int]:
        """Number of tasks per state name (states with no task may be absent),
        RESERVED apart from RUNNING."""

    def active_counts(self) -> dict[str, int]:
        """Tasks per unfinished state (WAITING, PENDING, RETRYING, RUNNING).

        What backpressure and ``App.drain()`` ask, often: a durable store
        answers it from partial indexes, so its cost follows the live work,
        never the history of finished tasks."""
        counts = self.counts()
        return {s.value: counts[s.value] for s in ACTIVE if counts.get(s.value)}

    def queue_counts(self) -> dict[str, dict[str, int]]:
        """Unfinished tasks per queue and state (read from a partial index of live rows)."""
        raise NotImplementedError

    def group_lines(self, limit: int = 50, offset: int = 0) -> list[GroupLine]:
        """Groups with tasks still in their line, blocked ones first, then by name.

        Read from the index of live group lines: the cost follows live groups,
        never finished history."""
        raise NotImplementedError

    def line_head(self, group: str) -> TaskRecord | None:
        """The head of ``group``'s line, shown as :meth:`get` shows it: its
        smallest id still ACTIVE or FAILED halting the group (what every task
        behind it waits for); None when the line is empty.

        One seek of the index of live group lines, whatever the group's history."""
        raise NotImplementedError

    def batch_list(self, after: str | None = None, limit: int = 20) -> list[tuple[str, dict[str, int]]]:
        """Batches by name (those after ``after``), each with its tasks per state.

        Keyset paging by name; each batch is counted from the batch index alone."""
        raise NotImplementedError

    def recent_finished(self, since: float, limit: int, *, newest_first: bool = False) -> list[FinishedTask]:
        """Up to ``limit`` tasks finished at or after ``since``, by (finished_at, id).

        Read from an index on ``finished_at``, so looking at the last minutes
        costs the same on a store with a million finished tasks."""
        raise NotImplementedError

    def finished_counts(self, since: float, until: float) -> list[tuple[float, str, int]]:
        """Tasks finished in ``[since, until)``, counted by minute and state:
        (the minute's start, state, how many) each. Read from the index on
        ``finished_at`` in the store, so no row comes out: what the
        dashboard's sampler counts once a minute keeps no more durations."""
        raise NotImplementedError

    @abc.abstractmethod
    def cancel(self, task_id: int) -> TaskRecord | None:
        """WAITING/PENDING/RETRYING -> CANCELED at once; RUNNING -> cancel flag set.

        Returns the task as it is afterwards (None if unknown). WAITING
        dependents of a task canceled here are settled like after any bad end.
        """

    @abc.abstractmethod
    def retry(self, task_id: int) -> bool:
        """FAILED/TIMEOUT/CANCELED -> PENDING now, attempts reset. False otherwise."""

    def upstream(self, task_id: int) -> list[TaskRecord]:
        """The tasks ``task_id`` depends on, in its ``depends_on`` order (fan-in)."""
        rec = self.get(task_id)
        if rec is None:
            return []
        ups = (self.get(d) for d in rec.depends_on)
        return [u for u in ups if u is not None]

    @abc.abstractmethod
    def batch_summary(self, batch: str) -> BatchSummary: ...

    # ---- batch settings ---------------------------------------------------
    def set_batch(self, batch: str, on_complete: str | None) -> None:
        """Create or change a batch's callback (a
        :meth:`corral.core.batches.Callback.to_json` template, or None for
        none). A batch already settled keeps its mark: its callback ran."""
        raise NotImplementedError

    def settle_batches(self, batches: Collection[str] | None = None, limit: int = 100) -> list[int]:
        """Submit the ``on_complete`` task of each batch (of ``batches``, or
        up to ``limit`` of all) that has one, is not settled yet, and has
        reached a final status; returns the ids submitted.

        The mark and the callback task are one transaction, guarded so that
        workers racing here submit it exactly once; the task gets the batch's
        summary (:meth:`BatchSummary.as_dict`) as its one argument."""
        raise NotImplementedError

    def finished_history(
        self, *, name: str | None = None, batch: str | None = None, limit: int = 10_000
    ) -> list[HistoryRow]:
        """The newest ``limit`` tasks (of task ``name``, or of ``batch``) that
        ended SUCCESS, FAILED or TIMEOUT, newest first: what the capacity
        planner measures. Bounded, so asking costs the same on a long history."""
        raise NotImplementedError

    # ---- dead letters -----------------------------------------------------
    def dead_letters(
        self, batch: str | None = None, limit: int = 100, offset: int = 0, *, after_id: int | None = None
    ) -> list[TaskRecord]:
        """Tasks that ended FAILED or TIMEOUT and were not retried since, by id.

        Paged by keyset: ``after_id`` (the last id of the page before) starts
        the page past it, so a deep page costs what the first does and a dead
        letter retried or deleted between two reads moves no other one
        across a page's edge. ``offset`` skips rows past that (a scan).

        A durable store reads them from a partial index holding only those
        rows, so a healthy history costs nothing."""
        raise NotImplementedError

    def retry_dead(self, batch: str | None = None, limit: int = 10_000) -> list[int]:
        """Queue up to ``limit`` dead letters again (as :meth:`retry`), in one
        transaction, lowest id first; returns their ids.

        All at once, so a group's re-queued tasks are back in its line in
        their submit order before any of them can be claimed."""
        raise NotImplementedError

    # ---- worker processes -------------------------------------------------
    def report_worker(self, info: WorkerInfo) -> None:
        """Write a worker process's row (insert or replace), stamping
        ``heartbeat_at`` now, and ``started_at`` now at its first report."""
        raise NotImplementedError

    def remove_worker(self, worker_id: str) -> None:
        """Delete a worker's row: it stopped cleanly."""
        raise NotImplementedError

    def workers(self) -> list[WorkerInfo]:
        """Every worker row, oldest start first: live ones, and dead ones the
        sweeper has not cleared yet."""
        raise NotImplementedError

    def forget_workers(self, before: float) -> int:
        """Delete the rows of workers silent since before ``before`` that hold
        no RUNNING task any more (the sweeper took their leases back); returns
        how many. A dead worker that still holds tasks stays listed with them."""
        raise NotImplementedError

    def forget_keys(self, limit: int = 1000) -> int:
        """Delete up to ``limit`` rows of keyed limits' keys that hold nothing
        a missing row would not (:func:`corral.core.gates.key_at_rest`: no
        pause, bucket full, window empty); returns how many. A key with no
        row has its whole budget, so none is kept for ever: the leader calls
        this in bounded batches."""
        raise NotImplementedError

    # ---- fleet control ----------------------------------------------------
    def fleet_level(self) -> FleetLevel:
        """The stored degradation level (NORMAL, automatic, when never set)."""
        raise NotImplementedError

    def set_fleet_level(self, new: FleetLevel, *, auto: bool, event: str | None = None) -> bool:
        """Store ``new`` (its ``changed_at`` is ignored: the store stamps now
        when the level differs from the stored one); True if written.

        ``auto`` marks an automatic step: it applies only while the stored
        level is not manual, so an operator's setting always wins a race.
        ``event`` (JSON) is added as a ``level`` event in the same
        transaction when the write applies."""
        raise NotImplementedError

    def add_event(self, kind: str, subject: str, data: str) -> int:
        """Append one event (``data`` is JSON); returns its id."""
        raise NotImplementedError

    def events(self, kind: str | None = None, limit: int = 100) -> list[Event]:
        """The newest ``limit`` events (of ``kind``), newest first."""
        raise NotImplementedError

    def event_cursor(self, since: int | None) -> Any:
        """Where a reader of the stream starts: after the event with id
        ``since`` (0: at the oldest kept), or, with None, after every event
        committed so far. The cursor is opaque: pass it to :meth:`read_events`."""
        if since is None:
            newest = self.events(limit=1)
            return newest[0].id if newest else 0
        return int(since)

    def read_events(self, cursor: Any, limit: int = 500) -> tuple[list[Event], Any]:
        """Up to ``limit`` events after ``cursor``, in stream order, and the
        cursor after them.

        A reader that keeps passing the cursor back sees every event exactly
        once, in the order their writes committed, whatever the number of
        writers: the cursor is a position in the stream, never a time."""
        raise NotImplementedError

    def wait_for_events(self, timeout: float) -> None:
        """Block up to ``timeout`` seconds, returning early when an event may
        have been added."""
        import time

        time.sleep(timeout)

    def trim_events(self, keep: int, before: float, limit: int | None = None) -> int:
        """Delete events older than ``before`` and all but the newest ``keep``,
        oldest first, at most ``limit`` of them; returns how many went."""
        raise NotImplementedError

    def failing_kinds(self, since: float, in_a_row: int, scan: int = 500) -> list[str]:
        """Task names whose last ``in_a_row`` outcomes since ``since`` are all
        FAILED or TIMEOUT, with no success of the name after them.

        Reads at most the ``scan`` newest failures (the dead-letter index),
        so its cost is bounded however busy the fleet."""
        raise NotImplementedError

    # ---- periodic schedules ---------------------------------------------
    # What ticks are due is decided in corral.core.cron; a store keeps the
    # definitions and makes each tick enqueue at most once, fleet-wide.
    def save_schedules(self, schedules: Sequence[Schedule], now: float | None = None) -> None:
        """Store (or update) schedule definitions, keeping when each was first
        stored and what its last tick did: every worker does it when it starts.

        ``now`` (the worker's clock, which the ticks are read on) stamps a new
        schedule, but never ahead of the store's clock
        (:func:`~corral.core.cron.first_stamp`); no tick at or before it is
        ever due. None: the store's clock."""
        raise NotImplementedError

    def schedules(self) -> list[ScheduleState]:
        """Every stored schedule with its last tick and its last run's state, by name."""
        raise NotImplementedError

    def fire_tick(self, schedule: Schedule, tick: int) -> TickResult:
        """Enqueue ``schedule``'s task for ``tick`` unless that tick was handled.

        One transaction: a unique (schedule, tick) row is inserted if absent
        (else TAKEN: another caller won, nothing written); then, with
        ``overlap=False`` and the schedule's last enqueued task still WAITING,
        PENDING, RETRYING or RUNNING, the tick is recorded SKIPPED; else the
        task is inserted (ENQUEUED, its id). The schedule's last tick, outcome
        and task move with it. The schedule must have been saved.

        A tick more than :data:`~corral.core.cron.MAX_CLOCK_AHEAD` seconds
        ahead of the store's clock is refused (EARLY, nothing written): a
        worker whose clock runs ahead must not take ticks that have not come."""
        raise NotImplementedError

    def schedule_ticks(self, schedule: str, limit: int = 100) -> list[TickRecord]:
        """The newest ``limit`` tick rows of a schedule, newest first."""
        raise NotImplementedError

    # ---- limits -----------------------------------------------------------
    @abc.abstractmethod
    def set_limit(self, spec: LimitSpec) -> LimitSpec:
        """Declare a named limit (``app.limit``), visible to every worker of
        the store: its settings, unless an operator's change is in force,
        which stays (:func:`corral.core.limits.declare`). Returns the limit
        as it is now. A change of what is declared records a ``limit`` event."""

    @abc.abstractmethod
    def change_limit(self, name: str, changes: Mapping[str, Any], *, by: str, reset: bool = False) -> LimitSpec:
        """An operator's change of a declared limit while it runs, in one
        transaction (:func:`corral.core.limits.change`: the fields named
        change, the others stay; ``reset`` puts the declared settings back).
        A keyed limit's keys follow at once; waiting workers are woken; a
        ``limit`` event records it (``by``: cli, dashboard or app). Returns
        the limit as it is now. ConfigError (one line) for a name that is no
        limit, or settings ``app.limit`` would refuse; nothing is written then."""

    @abc.abstractmethod
    def limits(self) -> dict[str, LimitSpec]: ...

    @abc.abstractmethod
    def limit_tokens(self) -> dict[str, float]:
        """Starts each limit with a rate allows now: tokens in its bucket,
        or room left in its sliding window."""

    @abc.abstractmethod
    def busiest_keys(self, top: int = 5) -> dict[str, list[tuple[str, int]]]:
        """Per keyed limit (``per_key=True``), the ``top`` keys holding the
        most claims RUNNING, most first; limits with none are absent."""

    @abc.abstractmethod
    def limit_usage(self) -> dict[str, int]:
        """Claims currently RUNNING per limit name (a keyed limit's keys
        summed under its name); limits with none are absent."""

    def gate_rows(self, names: Collection[str]) -> Gates:
        """The gates a claim would read now for these gate names (limits, a
        keyed limit's keys as :func:`~corral.core.gates.keyed_name`, task
        names under a breaker): the rows of those limits and of their keyed
        limits, the places held, and every breaker. A read: nothing is
        charged, so :meth:`Gates.room` answers what a claim would find.

        This default composes the public reads (a key's own bucket is not
        among them: it counts full); the stores here read the rows a claim reads."""
        from corral.core.gates import BreakerRow, LimitState, keyed_name, split_key

        now = self.now()
        specs = self.limits()
        wanted = {n for name in names for n in (name, split_key(name)[0])}
        limits = {n: LimitState(specs[n]) for n in wanted if n in specs}
        usage = dict(self.limit_usage())
        for limit, keys in self.busiest_keys(top=1 << 30).items():
            for key, used in keys:
                usage[keyed_name(limit, key)] = used
        breakers = {n: BreakerRow(n, cfg, st) for n, (cfg, st) in self.breakers().items()}
        return Gates(now, limits, usage, breakers)

    # ---- adaptive limits (corral.core.adaptive) --------------------------------
    def declare_adaptive(self, limit: LimitSpec, spec: AdaptiveSpec) -> None:
        """Create or re-declare an adaptive limit in one write: ``limit`` has
        the fixed values of the knobs that are not adaptive (and the burst).

        A new limit (or one that was not adaptive) starts at
        :meth:`AdaptiveSpec.start`'s values; a re-declared one keeps its
        effective values and the controller's state, clamped into the new
        bounds (:func:`corral.core.adaptive.declared`), so a worker starting
        up does not undo what the fleet learned."""
        raise NotImplementedError

    def adaptive_limits(self) -> dict[str, AdaptiveRow]:
        """The adaptive limits: spec, effective values and controller state."""
        raise NotImplementedError

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
        """Write a controller's decision for the adaptive limit ``name``: its
        state (JSON), the effective values of its adaptive knobs (None: the
        knob is not adaptive, left alone) and, if given, an event
        (``limit_adapted``, subject ``limit:<name>``, ``event`` its data), in
        one write fenced by the leadership ``role``: nothing is written unless
        ``holder`` holds it now (a leader that lost it must not overwrite its
        successor's decisions). False when fenced out or the limit is no
        longer adaptive. A changed rate starts with a full bucket."""
        raise NotImplementedError

    def adaptive_keys(self, limit: str) -> dict[str, str]:
        """The controller states of the keys of the keyed adaptive limit
        ``limit``: key to its row's ``controller`` JSON
        (:func:`corral.core.adaptive.key_state_json`), for the keys that have one."""
        raise NotImplementedError

    def save_adaptive_keys(
        self,
        limit: str,
        holder: str,
        role: str,
        keys: Mapping[str, tuple[str | None, int | None, str | None]],
        events: Mapping[str, str] | None = None,
    ) -> bool:
        """Write the controller's decisions for keys of the keyed adaptive
        limit ``limit``: per key, its state (JSON) and its effective
        concurrency and rate, upserted into the key's row (made if the key
        has none), in one write fenced by the leadership ``role`` as
        :meth:`save_adaptive` is. A key given ``(None, None, None)`` loses its
        state and its own values (it runs under the limit's again). A changed
        rate starts the key with a full bucket. ``events`` (key to JSON data)
        go in the same write, each a ``limit_key_adapted`` event with subject
        :func:`corral.core.events.limit_key_subject` (the caller bounds how
        many). False when fenced out or ``limit`` is not adaptive."""
        raise NotImplementedError

    def report_limits(self, worker_id: str, reports: str) -> None:
        """Store one worker's reports of its adaptive limits (JSON: limit name
        to :meth:`LimitReport.to_dict`), one row a call (about once a second,
        never a write per task). The worker's own rows older than a minute
        go in the same write: with no leader to take them, they stay few."""
        raise NotImplementedError

    def take_limit_reports(self) -> list[tuple[str, str]]:
        """The reports stored since the last take, (worker id, JSON) oldest
        first, removed as they are read (the sweeper's leader takes them)."""
        raise NotImplementedError

    def limits_waiting(self, names: Collection[str]) -> set[str]:
        """Those of the limits ``names`` that queued work due now is waiting
        under (a task naming the limit, PENDING or RETRYING, due): whether a
        limit that let every call it could through was the bottleneck."""
        raise NotImplementedError

    def limit_frees_at(self) -> dict[str, float]:
        """For each limit that lets nothing start now for its rate (or a
        pause), when it lets the next task start (store time, epoch
        seconds). A fake clock moved there frees the next start.

        This default reads :meth:`limits` and :meth:`limit_tokens` and asks
        the bucket (:meth:`corral.core.rates.Bucket.wait`) how long one more
        token takes; the stores here override it with the sliding window's
        own answer (``LimitState.frees_at``)."""
        from corral.core.rates import Bucket, parse_rate

        now = self.now()
        tokens = self.limit_tokens()
        out: dict[str, float] = {}
        for name, spec in self.limits().items():
            at = None
            if spec.rate is not None and name in tokens:
                rate = parse_rate(spec.rate, spec.burst)
                wait = Bucket(tokens[name], now).wait(rate, now)
                if wait > 0:
                    at = now + wait
            if spec.paused_until is not None and spec.paused_until > now:
                at = spec.paused_until if at is None else max(at, spec.paused_until)
            if at is not None:
                out[name] = at
        return out

    # ---- pauses by hand ---------------------------------------------------
    def pause(self, kind: str, name: str, by: str = "") -> bool:
        """Pause the queue, group or limit ``name`` (``kind`` one of
        :data:`corral.core.pauses.KINDS`) for every worker of the store: from
        this commit on no claim takes its work (claim rule 5). True when it
        was not paused before; a ``pause`` event is added in the same
        transaction then. Pausing what has no tasks is allowed."""
        raise NotImplementedError

    def resume(self, kind: str, name: str, by: str = "") -> bool:
        """End a pause by hand (a limit's pause by a 429 is not touched);
        True when it was paused (a ``pause`` event with ``paused: false`` is
        added in the same transaction), False when it was not. Waiting
        workers are woken."""
        raise NotImplementedError

    def pauses(self) -> list[Pause]:
        """Every pause by hand in force, by kind (queue, group, limit), then name."""
        raise NotImplementedError

    # ---- circuit breakers -------------------------------------------------
    @abc.abstractmethod
    def set_breaker(self, name: str, config: BreakerConfig) -> None:
        """Create or change the breaker on a limit or a task name (its state is kept)."""

    @abc.abstractmethod
    def breakers(self) -> dict[str, tuple[BreakerConfig, Breaker]]:
        """Every breaker with its config and current state."""

    @abc.abstractmethod
    def force_breaker(self, name: str, state: BreakerState, reason: str) -> BreakerEvent:
        """Open (held until closed by hand) or close a breaker; the change is logged.
        Raises :class:`~corral.errors.ConfigError` for an unknown breaker."""

    @abc.abstractmethod
    def breaker_events(self, name: str | None = None, limit: int = 20) -> list[BreakerEvent]:
        """The last changes of breakers (of ``name``, or all), newest first."""

    # ---- maintenance ------------------------------------------------------
    # The sweep's rules live in corral.maintenance.recovery; a store reads
    # candidates and applies guarded decisions.
    @abc.abstractmethod
    def find_stuck(self, now: float, limit: int) -> list[SweepRow]:
        """Up to ``limit`` RUNNING tasks, by id, whose lease expired before
        ``now``: only a lost lease is recovered (a live one is its worker's)."""

    @abc.abstractmethod
    def find_stale_pending(self, before: float, limit: int) -> list[SweepRow]:
        """Up to ``limit`` PENDING tasks, by id, whose ``run_at`` is before ``before``."""

    @abc.abstractmethod
    def find_expired(self, now: float, limit: int) -> list[SweepRow]:
        """Up to ``limit`` PENDING tasks, by id, never started, whose deadline
        (``expires=``) is at or before ``now`` (see :func:`corral.core.model.expired`):
        those no claim met, ended by the sweeper's leader."""

    @abc.abstractmethod
    def rescue(self, rescues: Sequence[Rescue]) -> list[bool]:
        """Apply the decisions as guarded writes in one transaction; True for
        each that applied. Times written are the store's now."""

    def prune(self, before: Mapping[str, float], limit: int) -> int:
        """Delete up to ``limit`` finished tasks, oldest finish first, in one
        transaction; returns how many went.

        ``before`` maps a final state's name to a time: a task in that state
        that finished before it may go. Kept whatever their age (the rule of
        :mod:`corral.core.retention`, the same on every store):

        - an upstream still needed by a task depending on it that has not
          ended, or that ended FAILED or TIMEOUT (a dead letter, which a
          retry runs again with its upstream's results);
        - every task of a batch with an unfinished task, or whose
          ``on_complete`` callback was not submitted yet (its summary counts
          them all);
        - a FAILED task that halts its group while tasks of the group wait
          behind it.

        A task's dependency rows go with it; its events have their own
        retention (the leader trims them by age and count)."""
        raise NotImplementedError

    def repair(self, limit: int) -> None:
        """Finish up to ``limit`` effects an interrupted write left undone.

        Nothing to do where a write and its effects commit together; the
        PostgreSQL store settles dependents in a statement of their own."""

    @abc.abstractmethod
    def try_lead(self, role: str, holder: str, ttl: float) -> bool:
        """Hold (or renew) the named leadership for ``ttl`` seconds; True if held.

        Used so only one sweeper in the fleet works at a time."""
