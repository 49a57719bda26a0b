"""Plain data that crosses the store boundary.

Stores take and give these objects only; no store sees a Python callable, and
no engine code sees a row. Payloads are JSON text in every store.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from corral.core.states import State

#: One encoder for every call: ``json.dumps`` with any option builds a new one each time.
_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)


def dumps(value: Any) -> str:
    return _ENCODER.encode(value)


def loads(text: str | None) -> Any:
    return None if text is None else json.loads(text)


@dataclass(slots=True)
class NewTask:
    """What ``submit`` hands a store. ``args`` is already JSON text."""

    name: str
    args: str
    queue: str = "default"
    priority: int = 0
    max_retries: int = 0
    timeout: float | None = None
    group: str | None = None
    batch: str | None = None
    key: str | None = None
    trace_id: str | None = None
    run_at: float | None = None  # epoch seconds; None = now (store clock)
    depends_on: tuple[int, ...] = ()
    limits: tuple[str, ...] = ()
    halt_group_on_failure: bool = False
    #: positions of earlier tasks of the same submit this one depends on (a graph
    #: submitted in one call: their ids exist only once the store assigns them)
    after: tuple[int, ...] = ()
    #: the task's local name in the graph it was submitted with
    ref: str | None = None
    #: "cancel" (default) or "run": what an upstream's FAILED, TIMEOUT or CANCELED does
    on_upstream_failure: str = "cancel"
    #: submits of one task name with one debounce key collapse into the one
    #: PENDING task of that key (docs/keys.md): its arguments become these, its
    #: run_at ``now + debounce``, never past its ``created_at + debounce_max``
    debounce_key: str | None = None
    debounce: float | None = None
    debounce_max: float | None = None
    #: a newer submit of one task name with one supersede key cancels the
    #: queued ones ("superseded") and asks a running one to stop
    supersede_key: str | None = None
    #: the deadline of its first start, epoch seconds on the store's clock:
    #: not started by then, it ends CANCELED with the error :data:`EXPIRED`
    expires_at: float | None = None
    #: False while ``expires_at`` is still seconds from now (the app adds the
    #: store's clock before the store is given the task)
    expires_absolute: bool = True


#: The error of a task canceled by a newer submit with its supersede key.
SUPERSEDED = "superseded"
#: The error of a task not started by its deadline (``expires=``).
EXPIRED = "expired"


def expired(expires_at: float | None, attempt: int, snoozes: int, now: float) -> bool:
    """Is a queued or held task past the deadline of its first start at
    ``now``? A task that started once (an attempt counted, or a snooze
    given back) is never expired: the deadline binds its first start only."""
    return expires_at is not None and expires_at <= now and attempt == 0 and snoozes == 0


@dataclass(slots=True)
class TaskRecord:
    """A task as a store reports it."""

    id: int
    name: str
    args: str
    status: State
    queue: str = "default"
    priority: int = 0
    attempt: int = 0  # runs started so far
    max_retries: int = 0
    timeout: float | None = None
    group: str | None = None
    batch: str | None = None
    key: str | None = None
    trace_id: str | None = None
    limits: tuple[str, ...] = ()
    depends_on: tuple[int, ...] = ()
    halt_group_on_failure: bool = False
    created_at: float = 0.0
    run_at: float = 0.0
    started_at: float | None = None
    finished_at: float | None = None
    result: str | None = None  # JSON text
    error: str | None = None
    version: int = 0
    lease_token: str | None = None
    lease_expires_at: float | None = None
    worker_id: str | None = None
    progress: float | None = None
    progress_message: str | None = None
    checkpoint: str | None = None  # JSON object {stage: data}, last stage last
    cancel_requested: bool = False
    snoozes: int = 0  # times the task asked to run later (Retry), attempts given back
    crashes: int = 0  # runs lost with their worker (lease expired after the start)
    ref: str | None = None  # local name in the graph it was submitted with
    on_upstream_failure: str = "cancel"
    #: the traceback of the failed attempt its error is from (bounded; see corral.core.texts)
    traceback: str | None = None
    #: the deadline of its first start (store clock), if submitted with ``expires=``
    expires_at: float | None = None
    #: the debounce key it was submitted with: its ``run_at`` is the end of the window
    debounce_key: str | None = None

    @property
    def result_value(self) -> Any:
        return loads(self.result)

    @property
    def arguments(self) -> tuple[list, dict]:
        data = loads(self.args) or {}
        return list(data.get("args", ())), dict(data.get("kwargs", {}))

    def as_dict(self) -> dict[str, Any]:
        out = {f: getattr(self, f) for f in self.__dataclass_fields__}
        out["status"] = self.status.value
        out["limits"] = list(self.limits)
        out["depends_on"] = list(self.depends_on)
        return out


@dataclass(slots=True)
class Claim:
    """One unit of work handed to a worker: a single task, or a chunk of one
    group's queued tasks to run in order. All tasks share one lease token."""

    token: str
    tasks: list[TaskRecord]
    group: str | None = None


@dataclass(slots=True)
class Outcome:
    """A guarded write a worker (or watchdog) asks the store to make.

    Applied only if the task is still RUNNING with ``token`` and ``version``;
    otherwise the store changes nothing and reports the write as lost.
    """

    task_id: int
    token: str
    version: int
    status: State  # SUCCESS, FAILED, TIMEOUT, CANCELED, RETRYING or PENDING (hand back)
    result: str | None = None
    error: str | None = None
    run_at: float | None = None  # for RETRYING: when it may run again
    burn_attempt: bool = True  # False for hand-back: the attempt is given back
    attempt: int | None = None  # when set, the stored attempt count becomes this (wins over burn_attempt)
    started_at: float | None = None
    finished_at: float | None = None
    #: RETRYING that gives the attempt back and counts a snooze instead (``Retry``)
    snooze: bool = False
    #: pause every limit of the task for this many seconds (a 429 with Retry-After)
    pause_limits: float | None = None
    #: for breakers on the task's name or limits: True a failure, False a success,
    #: None no verdict (canceled, snoozed, handed back)
    breaker_failure: bool | None = None
    #: the failed attempt's traceback, kept with its error (None: none to keep)
    traceback: str | None = None


@dataclass(frozen=True, slots=True)
class Start:
    """A held task's body started (a chunk member, a prefetched or relayed
    task, whose claim recorded no start): the worker records its start and
    attempt while it runs, so readers see it RUNNING rather than RESERVED.

    Applied only while the task is RUNNING under ``token`` with no start
    recorded; its version is left alone, so the outcome still applies."""

    task_id: int
    token: str
    attempt: int
    started_at: float


@dataclass(slots=True)
class SubmitResult:
    id: int
    created: bool  # False when an idempotency key matched an existing task


@dataclass(frozen=True, slots=True)
class LimitSettings:
    """What an operator may change of a limit while it runs (see :mod:`corral.core.limits`)."""

    concurrency: int | None = None
    rate: str | None = None
    burst: int | None = None


@dataclass(slots=True)
class LimitSpec:
    name: str
    concurrency: int | None = None
    rate: str | None = None  # "100/s", "6000/m", "20/h": at most N starts in any sliding period, fleet-wide
    burst: int | None = None  # set: a token bucket of this many tokens instead (opt-in bursts)
    paused_until: float | None = None  # read only: set by a 429 with Retry-After
    per_key: bool = False  # a keyed limit: these settings are each key's own budget
    #: read only: who changed the settings in force while it ran ("cli",
    #: "dashboard", "app"); None: they are the ones ``app.limit`` declared
    set_by: str | None = None
    #: read only: the declared settings, kept aside while ``set_by``'s are in force
    declared: LimitSettings | None = None
    changed_at: float | None = None  # read only: when the settings in force last changed (store time)

    def settings(self) -> LimitSettings:
        return LimitSettings(self.concurrency, self.rate, self.burst)


@dataclass(frozen=True, slots=True)
class BreakerEvent:
    """One change of a breaker's state, with why and the counts behind it."""

    at: float
    name: str
    before: str
    after: str
    reason: str
    calls: int
    failures: int


@dataclass(frozen=True, slots=True)
class WorkerInfo:
    """A worker process as it tells the store every few seconds (its row in
    the workers table): who it is, what it serves, how busy it is. The store
    stamps ``started_at`` (at the first report) and ``heartbeat_at`` (at each)
    with its own clock; the values given here for them are ignored."""

    id: str
    host: str
    pid: int
    queues: tuple[str, ...]
    #: its slots, and how many hold a unit now
    slots: int
    in_use: int
    version: str
    #: how often it reports: a row this much older, three times over, is a dead worker's
    beat_every: float
    started_at: float = 0.0
    heartbeat_at: float = 0.0


@dataclass(slots=True)
class TaskFilter:
    status: State | None = None
    queue: str | None = None
    batch: str | None = None
    group: str | None = None
    name: str | None = None
    #: Only tasks whose error starts with this (e.g. the sweeper's stale-pending reason).
    error_prefix: str | None = None
    trace_id: str | None = None
    #: the idempotency key given at submit
    key: str | None = None
    limit: int = 100
    offset: int = 0
    newest_first: bool = True
    #: keyset paging: only ids below this one (with ``newest_first``), above it otherwise;
    #: a page costs the same however deep it is
    after_id: int | None = None
    #: only ids in this range (both ends kept): an age bound turned into ids
    #: (ids follow submit order), so a page never reads past it
    min_id: int | None = None
    max_id: int | None = None


@dataclass(slots=True)
class SweepReport:
    """Ids of the tasks one sweep recovered, by rule (see corral.maintenance.recovery).

    ``lost_leases_retried`` also holds chunk members whose lease was lost
    before they started: they go back to PENDING with their attempt intact.
    """

    lost_leases_retried: list[int] = field(default_factory=list)
    lost_leases_failed: list[int] = field(default_factory=list)
    overdue_failed: list[int] = field(default_factory=list)
    stale_pending_canceled: list[int] = field(default_factory=list)
    exhausted_failed: list[int] = field(default_factory=list)
    #: queued tasks past the deadline of their first start, ended CANCELED "expired"
    expired_canceled: list[int] = field(default_factory=list)

    @property
    def total(self) -> int:
        return sum(len(getattr(self, f)) for f in self.__dataclass_fields__)


#: How long a claim is held before the sweeper may take it back, unless renewed.
DEFAULT_LEASE_SECONDS = 30.0


def new_holder_id() -> str:
    """``host:pid:random``: names a worker or a sweeper in leases and leadership rows."""
    import os
    import socket
    import uuid

    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
