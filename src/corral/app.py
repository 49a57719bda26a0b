"""The public face: ``App``, ``@app.task``, ``submit`` and handles."""

from __future__ import annotations

import datetime
import inspect
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from corral.core import dag
from corral.core import validation as check
from corral.core.breaker import BreakerConfig, BreakerState
from corral.core.clock import SYSTEM_CLOCK, Clock, poll_until
from corral.core.cron import Schedule, check_expression
from corral.core.dag import UPSTREAM_POLICIES
from corral.core.gates import keyed_name
from corral.core.levels import CALM_PERIOD, Level
from corral.core.limits import UNCHANGED, describe_settings
from corral.core.model import (
    BreakerEvent,
    LimitSettings,
    LimitSpec,
    NewTask,
    SubmitResult,
    TaskFilter,
    TaskRecord,
    dumps,
    new_holder_id,
)
from corral.core.pauses import Pause, check_target, who
from corral.core.rates import parse_rate
from corral.core.retention import DEFAULT_PRUNE_STATES, final_states
from corral.core.retention import age as retention_age
from corral.core.retention import policy as retention_policy
from corral.core.retries import DEFAULT_PERMANENT, Backoff
from corral.core.states import FINAL, State
from corral.engine import tracing
from corral.engine.context import current
from corral.engine.hooks import HookChain, Hooks
from corral.errors import (
    AppClosed,
    BadArguments,
    ConfigError,
    CorralError,
    GroupDeadlock,
    QueueFull,
    ResultTimeout,
    StoreError,
    TaskFailed,
    TaskNotFound,
    UnknownTask,
)
from corral.stores import Store, open_store
from corral.stores.base import Event


def _duration(value: float | str, option: str) -> float:
    """``"60s"``, ``"5m"``, ``"1h"`` or a number of seconds."""
    if isinstance(value, str):
        text = value.strip().lower()
        unit = {"s": 1.0, "m": 60.0, "h": 3600.0}.get(text[-1:], None)
        try:
            return float(text[:-1]) * unit if unit is not None else float(text)
        except ValueError:
            raise ValueError(f"{option} must be seconds or a duration like '60s', '5m', '1h', not {value!r}") from None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{option} must be seconds or a duration like '60s', '5m', '1h', not {value!r}")
    return float(value)


def _debounce_of(debounce: Any, debounce_max: Any) -> tuple[float | None, float | None]:
    """A task's debounce window and its bound, in seconds, checked once at ``@app.task``."""
    if debounce is None:
        if debounce_max is not None:
            raise ConfigError("debounce_max needs debounce: @app.task(debounce='5s', debounce_max='1m')")
        return None, None
    try:
        window = _duration(debounce, "debounce")
        bound = None if debounce_max is None else _duration(debounce_max, "debounce_max")
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    window = check.seconds(window, "debounce")
    if bound is not None:
        bound = check.seconds(bound, "debounce_max")
        if bound < window:
            raise ConfigError(f"debounce_max ({bound:g}s) must be at least debounce ({window:g}s)")
    return window, bound


def _expires_of(value: Any, err: type[CorralError] = ConfigError) -> float | datetime.datetime:
    """A deadline for a task's first start: seconds after its submit (a
    number, or ``"30s"``, ``"5m"``, ``"1h"``), more than 0 and finite; or,
    at submit only, a timezone-aware datetime (that moment)."""
    if isinstance(value, datetime.datetime):
        if err is ConfigError:
            raise ConfigError("@app.task(expires=) takes seconds or a duration like '30s': a datetime is per submit")
        if value.tzinfo is None or value.utcoffset() is None:
            raise err(f"expires must be a timezone-aware datetime, not the naive {value.isoformat()}")
        return value
    try:
        seconds = _duration(value, "expires")
    except ValueError as exc:
        raise err(str(exc)) from None
    return check.seconds(seconds, "expires", err)


def _needs_no_arguments(fn: Callable) -> None:
    """A periodic task is called with no arguments (``ctx`` aside): refuse one that needs some."""
    if not callable(fn):
        raise ConfigError(f"a task must be a function, not {check.shown(fn)}")
    params = list(inspect.signature(fn).parameters.values())
    if params and params[0].name == "ctx":
        params = params[1:]
    needed = [
        p.name
        for p in params
        if p.default is inspect.Parameter.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    ]
    if needed:
        raise ConfigError(
            f"a periodic task is called with no arguments, but {getattr(fn, '__name__', 'it')}() needs "
            f"{', '.join(needed)}: give them defaults"
        )


if TYPE_CHECKING:
    from corral.engine.worker import DrainReport, Worker
    from corral.stores.base import BatchSummary, FleetLevel

log = logging.getLogger("corral.app")

ISOLATIONS = ("thread", "process")
_SUBMIT_OPTIONS = frozenset(
    {
        "group",
        "batch",
        "depends_on",
        "key",
        "trace_id",
        "delay",
        "priority",
        "timeout",
        "retries",
        "queue",
        "debounce_key",
        "supersede_key",
        "limit_key",
        "expires",
    }
)
#: How long a submitter trusts "this batch has no limit" before it asks the store again.
BATCH_LIMIT_RECHECK = 5.0
_ITEM_KEYS = _SUBMIT_OPTIONS | {"args", "kwargs", "ref"}
#: the keys of an item of a graph (``submit_many`` given items only): each names its task
_GRAPH_KEYS = _ITEM_KEYS | {"task"}


class Node:
    """One task of a graph submitted by ``App.submit_many(nodes)``.

    ``Node(fetch, url, ref="fetch")`` and ``Node(parse, ref="parse",
    depends_on=["fetch"])``: positional arguments and keyword arguments that
    are not submit options go to the function, as with ``TaskDef.submit``.
    ``ref`` is the task's local name in the graph; ``depends_on`` lists refs
    of the same graph, task ids, or handles."""

    __slots__ = ("task", "ref", "item")

    def __init__(self, task: TaskDef | str, *args: Any, ref: str | None = None, **options: Any):
        self.task = task
        self.ref = ref
        opts = {k: options.pop(k) for k in list(options) if k in _SUBMIT_OPTIONS}
        #: the submit item: ``args``, ``kwargs`` and the submit options
        self.item: dict[str, Any] = dict(opts, args=args, kwargs=options, ref=ref)

    def __repr__(self) -> str:
        name = self.task.name if isinstance(self.task, TaskDef) else self.task
        return f"<Node {name} ref={self.ref!r}>"


def _submitter_traceparent() -> str | None:
    """The W3C traceparent of the submitter's current OpenTelemetry span, if
    any: a task submitted without a trace id takes it (its attempts' spans
    are then children of that span). Read once per submit call, since every
    task of one call shares the caller's context."""
    return tracing.current_traceparent() if tracing.ENABLED else None


def _new_trace_id(parent: str | None) -> str:
    """A task's trace id when the submitter gave none: ``parent`` (see
    :func:`_submitter_traceparent`), else 32 hex digits that begin with the
    time in milliseconds and end in 80 random bits, as a UUIDv7 does.

    Ids in time order land at the end of the trace-id index: wholly random
    ones land all over it, and at a million tasks every batch of a thousand
    rewrote a thousand of its pages, which slowed submits as the table grew.
    """
    if parent is not None:
        return parent
    return f"{time.time_ns() // 1_000_000 & 0xFFFFFFFFFFFF:012x}{os.urandom(10).hex()}"


def _key_argument(f: Callable, task_name: str, limit_key: str | None) -> tuple[int | None, Any]:
    """Where the argument ``limit_key`` of ``f`` is: its place among the
    positional arguments (ctx not counted; None: keyword only) and its default."""
    if limit_key is None:
        return None, None
    check.text(limit_key, "limit_key")
    params = list(inspect.signature(f).parameters.values())
    if params and params[0].name == "ctx":
        params = params[1:]
    for i, p in enumerate(params):
        if p.name == limit_key and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            at = i if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) else None
            return at, None if p.default is p.empty else p.default
    raise ConfigError(f"task {task_name!r}: limit_key {limit_key!r} is not an argument of the function")


@dataclass(frozen=True)
class TaskDef:
    """A registered task: the function and its options, validated once."""

    app: App
    fn: Callable
    name: str
    retries: int = 0
    timeout: float | None = None
    queue: str = "default"
    priority: int = 0
    limits: tuple[str, ...] = ()
    isolation: str = "thread"
    retry_on: tuple[type[BaseException], ...] | None = None
    permanent_on: tuple[type[BaseException], ...] = DEFAULT_PERMANENT
    backoff: Backoff = Backoff()
    halt_group_on_failure: bool = False
    takes_ctx: bool = False
    overlap_on_timeout: bool = False
    #: runs at the DEGRADED level, when only critical work does
    critical: bool = False
    #: "cancel" or "run": what an upstream task's FAILED, TIMEOUT or CANCELED does to a run of it
    on_upstream_failure: str = "cancel"
    #: seconds of quiet after the last submit with a debounce key before its one run (docs/keys.md)
    debounce: float | None = None
    #: the latest a debounced run waits, counted from the first submit of its key
    debounce_max: float | None = None
    #: the argument whose value is the key of the task's keyed limits (``per_key=True``)
    limit_key: str | None = None
    #: its place among the positional arguments (ctx not counted), and its default
    limit_key_at: int | None = None
    limit_key_default: Any = None
    #: seconds after its submit by which a run must have started, or it ends
    #: CANCELED "expired" (docs/keys.md); a submit's ``expires=`` overrides it
    expires: float | None = None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Calling the task runs the plain function here and now."""
        return self.fn(*args, **kwargs)

    def submit(self, *args: Any, **options: Any) -> Handle:
        """Queue one run. Keyword options are those of ``App.submit``
        (``connection=`` included); other keyword arguments go to the function."""
        opts = {k: options.pop(k) for k in list(options) if k in _SUBMIT_OPTIONS}
        connection = options.pop("connection", None)
        return self.app.submit(self, args=args, kwargs=options, connection=connection, **opts)

    def node(self, *args: Any, **options: Any) -> Node:
        """A node of a graph for ``App.submit_many``: ``fetch.node(url, ref="fetch")``."""
        return Node(self, *args, **options)

    def submit_many(self, calls: Iterable[Mapping[str, Any] | Sequence[Any]], **common: Any) -> list[Handle]:
        """Queue many runs in one store write. Each call is a tuple of
        positional arguments, or a mapping with ``args``/``kwargs`` and any
        submit option; ``common`` options apply to every call."""
        items = []
        for call in calls:
            if isinstance(call, Mapping):
                item = dict(common)
                item.update(call)
            else:
                item = dict(common, args=tuple(call))
            items.append(item)
        return self.app.submit_many(self, items)


class Handle:
    """A submitted task: its id, its status, and a way to wait for its result."""

    __slots__ = ("app", "id", "group", "created", "ref")

    def __init__(self, app: App, task_id: int, group: str | None = None, created: bool = True, ref: str | None = None):
        self.app = app
        self.id = task_id
        self.group = group
        self.created = created
        #: the task's local name in the graph it was submitted with
        self.ref = ref

    def __repr__(self) -> str:
        return f"<Handle {self.id}>"

    def get(self) -> TaskRecord:
        return self.app.get(self.id)

    def status(self) -> State:
        return self.get().status

    def result(self, timeout: float | None = None) -> Any:
        """Wait for the task to end; return its value or raise TaskFailed/ResultTimeout."""
        ctx = current()
        if ctx is not None and ctx.group is not None and ctx.group == self.group and self.id > ctx.task_id:
            raise GroupDeadlock(
                f"task {ctx.task_id} waits on task {self.id}, queued behind it in group {self.group!r}: "
                "it cannot start until the waiting task ends, since a group runs one task at a time in "
                "submit order. Submit it without waiting, or do the work inline."
            )
        rec = self.app.wait(self.id, timeout)
        if rec.status is State.SUCCESS:
            return rec.result_value
        raise TaskFailed(rec.id, rec.status.value, rec.error)


class App:
    """A set of tasks, the store they live in, and (optionally) an in-process worker."""

    def __init__(
        self,
        store: str | Store | None = None,
        *,
        max_queued: int | None = None,
        on_full: str = "raise",
        full_timeout: float = 30.0,
        hooks: Sequence[Hooks] = (),
        clock: Clock | None = None,
        max_payload_bytes: int = check.DEFAULT_MAX_PAYLOAD_BYTES,
        critical_queues: Sequence[str] = (),
        level_calm_period: float = CALM_PERIOD,
        retention: Mapping[str, float | str | None] | bool | None = True,
    ):
        if on_full not in ("raise", "block"):
            raise ConfigError("on_full must be 'raise' or 'block'")
        if max_queued is not None:
            check.integer(max_queued, "max_queued", (1, 2**63 - 1))
        check.seconds(full_timeout, "full_timeout", zero_ok=True)
        #: the largest a task's arguments or result may be, in bytes of JSON
        self.max_payload_bytes = check.max_payload_bytes(max_payload_bytes)
        #: the clock of the worker and of a store opened here (tests pass a FakeClock)
        self.clock: Clock = clock or SYSTEM_CLOCK
        self._owns_store = not isinstance(store, Store)
        if isinstance(store, Store):
            self.store: Store = store
        else:
            self.store = open_store(store, clock=clock) if clock is not None else open_store(store)
        self.store.migrate()
        self.registry: dict[str, TaskDef] = {}
        #: what steers and watches this app's workers (flow control, metrics, events)
        self.hooks = HookChain(*hooks)
        #: queues whose work still runs at the DEGRADED level (with tasks marked critical)
        self.critical_queues: tuple[str, ...] = check.names(critical_queues, "critical_queues")
        #: seconds the health signals must stay below the fleet's level before it steps down one
        self.level_calm_period = check.seconds(level_calm_period, "level_calm_period")
        self.max_queued = max_queued
        self.on_full = on_full
        self.full_timeout = full_timeout
        self._closed = False
        self._worker: Worker | None = None
        self._lock = threading.Lock()
        #: limit names known to exist: declared here, or found in the store
        self._known_limits: set[str] = set()
        #: the limits declared here with ``per_key=True``
        self._per_key: set[str] = set()
        #: batches found without a limit, and until when (monotonic) that is trusted
        self._no_batch_limit: dict[str, float] = {}
        #: periodic schedules by name (``@app.periodic``, ``@app.task(cron=...)``); workers enqueue their ticks
        self.schedules: dict[str, Schedule] = {}
        #: how long finished tasks are kept, per final state (seconds), applied by
        #: the sweeper's leader: see :mod:`corral.core.retention` (empty: kept for ever)
        self.retention: dict[State, float] = retention_policy(retention)

    # ---- declaring -------------------------------------------------------------
    def task(
        self,
        fn: Callable | None = None,
        *,
        name: str | None = None,
        retries: int = 0,
        timeout: float | None = None,
        queue: str = "default",
        priority: int = 0,
        limits: Sequence[str] = (),
        isolation: str = "thread",
        retry_on: Sequence[type[BaseException]] | None = None,
        permanent_on: Sequence[type[BaseException]] | None = None,
        backoff: Backoff | None = None,
        halt_group_on_failure: bool = False,
        overlap_on_timeout: bool = False,
        critical: bool = False,
        cron: str | None = None,
        on_upstream_failure: str = "cancel",
        debounce: float | str | None = None,
        debounce_max: float | str | None = None,
        limit_key: str | None = None,
        expires: float | str | None = None,
    ) -> Any:
        """Register a function as a task. Usable bare (``@app.task``) or with options.

        ``timeout`` (seconds) ends a run that takes longer. With
        ``isolation="process"`` the task's child process is killed: the way
        to a hard stop. A thread cannot be killed: a timed-out thread task is
        abandoned, and its task keeps its lease, its group and its limits
        until the thread really ends, so no retry and no next task of its
        group starts meanwhile (the timeout is written then). A worker with
        too many such threads stops claiming (``corral worker`` exits for its
        supervisor to restart it). ``overlap_on_timeout=True`` writes the
        timeout at once and frees the lane, letting a retry or the group's
        next task run beside the abandoned thread. ``critical=True`` keeps the
        task running at the DEGRADED level, when the fleet runs only critical
        work. ``cron="*/5 * * * *"`` also runs it periodically, as
        :meth:`periodic` with its defaults does. ``on_upstream_failure``
        says what happens to a run submitted with ``depends_on`` when an
        upstream task ends FAILED, TIMEOUT or CANCELED: ``"cancel"`` (the
        default) cancels it, and its own dependents, with the upstream named
        in its error; ``"run"`` runs it anyway once every upstream has ended
        (``ctx.upstream()`` shows None for those without a result).
        ``debounce="5s"`` collapses the submits given one ``debounce_key``
        into one run with the last submit's arguments, after that much quiet
        and never later than ``debounce_max`` after the first (docs/keys.md).
        ``limit_key="merchant"`` names the argument whose value is the key of
        the task's keyed limits (``app.limit(..., per_key=True)``); a submit's
        ``limit_key=`` overrides it. ``expires=30`` (or ``"5m"``): a run not
        started within that long after its submit never runs and ends
        CANCELED with the error "expired"; the deadline binds the first
        start only (a retry runs whenever it is due). A submit's
        ``expires=`` overrides it.
        """
        debounce_s, debounce_max_s = _debounce_of(debounce, debounce_max)
        expires_s = None if expires is None else _expires_of(expires)
        if cron is not None:
            check.text(cron, "cron")
            schedule_expr = check_expression(cron)  # a bad expression registers nothing

        def register(f: Callable) -> TaskDef:
            if not callable(f):
                raise ConfigError(f"a task must be a function, not {check.shown(f)}")
            if isolation not in ISOLATIONS:
                raise ConfigError(f"isolation must be one of {ISOLATIONS}, not {check.shown(isolation)}")
            task_name = check.text(name if name is not None else getattr(f, "__name__", None), "task name")
            if backoff is not None and not isinstance(backoff, Backoff):
                raise ConfigError(f"backoff must be a corral Backoff, not {check.shown(backoff)}")
            if not isinstance(halt_group_on_failure, bool):
                shown = check.shown(halt_group_on_failure)
                raise ConfigError(f"halt_group_on_failure must be True or False, not {shown}")
            if not isinstance(critical, bool):
                raise ConfigError(f"critical must be True or False, not {check.shown(critical)}")
            if not isinstance(on_upstream_failure, str) or on_upstream_failure not in UPSTREAM_POLICIES:
                shown = check.shown(on_upstream_failure)
                raise ConfigError(f"on_upstream_failure must be 'cancel' or 'run', not {shown}")
            if task_name in self.registry:
                raise ConfigError(f"a task named {task_name!r} is already registered")
            params = list(inspect.signature(f).parameters)
            key_at, key_default = _key_argument(f, task_name, limit_key)
            tdef = TaskDef(
                app=self,
                fn=f,
                name=task_name,
                retries=check.integer(retries, "retries", check.RETRIES_RANGE),
                timeout=None if timeout is None else check.seconds(timeout, "timeout"),
                queue=check.text(queue, "queue"),
                priority=check.integer(priority, "priority", check.PRIORITY_RANGE),
                limits=check.names(limits, "limits"),
                isolation=isolation,
                retry_on=check.exception_types(retry_on, "retry_on") if retry_on is not None else None,
                permanent_on=(
                    check.exception_types(permanent_on, "permanent_on")
                    if permanent_on is not None
                    else DEFAULT_PERMANENT
                ),
                backoff=backoff or Backoff(),
                halt_group_on_failure=halt_group_on_failure,
                takes_ctx=bool(params) and params[0] == "ctx",
                overlap_on_timeout=overlap_on_timeout,
                critical=critical,
                on_upstream_failure=on_upstream_failure,
                debounce=debounce_s,
                debounce_max=debounce_max_s,
                limit_key=limit_key,
                limit_key_at=key_at,
                limit_key_default=key_default,
                expires=expires_s,  # type: ignore[arg-type]
            )
            if cron is not None:
                _needs_no_arguments(f)
                schedule = self._schedule_of(tdef, schedule_expr, name=task_name)
            self.registry[task_name] = tdef
            if cron is not None:
                self.schedules[schedule.name] = schedule
            return tdef

        return register(fn) if fn is not None else register

    def periodic(
        self,
        cron: str,
        *,
        name: str | None = None,
        queue: str | None = None,
        group: str | None = None,
        timezone: str = "UTC",
        overlap: bool = True,
        catch_up: str = "latest",
        max_delay: float | str | None = None,
        **task_options: Any,
    ) -> Callable[[Callable | TaskDef], TaskDef]:
        """Run a function on a cron schedule: one run per tick across every worker.

        ``cron`` is five fields (minute hour day month weekday, e.g.
        ``"*/5 * * * *"``) or an alias (``"@hourly"``), read in ``timezone``.
        The function is registered as a task (``task_options`` are those of
        :meth:`task`) and called with no arguments (``ctx`` if it takes one).
        Decorating a registered task adds another schedule for it (give it a
        ``name``). Each tick's task goes to ``queue`` and ``group``.

        ``overlap=False`` skips a tick while the run of the previous one is
        still queued or running (the skip is recorded). After downtime,
        ``catch_up`` says what runs: ``"latest"`` (default) the newest missed
        tick, ``"all"`` every missed tick, ``"none"`` nothing missed; in every
        mode a tick older than ``max_delay`` (seconds or ``"1h"``; default no
        bound) is dropped. Workers (``corral worker``, ``app.start``) enqueue the
        ticks; an invalid expression, or one that never fires, raises
        ConfigError here."""
        expr = check_expression(cron, timezone)
        try:
            delay = None if max_delay is None else _duration(max_delay, "max_delay")
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        if delay is not None and delay <= 0:
            raise ConfigError(f"max_delay must be more than 0 seconds, not {max_delay!r}")
        # every option checked before anything is registered
        Schedule("check", "check", expr, timezone=timezone, overlap=overlap, catch_up=catch_up, max_delay=delay)
        if group is not None:
            check.text(group, "group")

        def register(f: Callable | TaskDef) -> TaskDef:
            if isinstance(f, TaskDef):
                if task_options:
                    raise ConfigError("task options go on the task's own @app.task, not on a second schedule")
                tdef = f
                sched_name = name if name is not None else f.name
            else:
                if queue is not None:
                    task_options["queue"] = queue
                _needs_no_arguments(f)
                sched_name = check.text(name if name is not None else getattr(f, "__name__", None), "task name")
                if sched_name in self.schedules:
                    raise ConfigError(f"a schedule named {sched_name!r} is already registered")
                tdef = self.task(f, name=name, **task_options)
            schedule = self._schedule_of(
                tdef,
                expr,
                name=sched_name,
                queue=queue,
                group=group,
                timezone=timezone,
                overlap=overlap,
                catch_up=catch_up,
                max_delay=delay,
            )
            self.schedules[schedule.name] = schedule
            return tdef

        return register

    def _schedule_of(
        self, tdef: TaskDef, expr: str, *, name: str, queue: str | None = None, group: str | None = None, **opts: Any
    ) -> Schedule:
        """A schedule running ``tdef``, checked before anything is registered."""
        sched_name = check.text(name, "schedule name")
        if sched_name in self.schedules:
            raise ConfigError(f"a schedule named {sched_name!r} is already registered")
        return Schedule(
            name=sched_name,
            task=tdef.name,
            expr=expr,
            queue=check.text(queue, "queue") if queue is not None else tdef.queue,
            group=None if group is None else check.text(group, "group"),
            priority=tdef.priority,
            max_retries=tdef.retries,
            timeout=tdef.timeout,
            limits=tdef.limits,
            halt_group_on_failure=tdef.halt_group_on_failure,
            **opts,
        )

    def limit(
        self,
        name: str,
        *,
        concurrency: int | str | None = None,
        rate: str | None = None,
        burst: int | None = None,
        per_key: bool = False,
        max_concurrency: int | None = None,
        min_concurrency: int | None = None,
        max_rate: str | None = None,
        min_rate: str | None = None,
    ) -> None:
        """Declare a named limit shared by every worker of this store.

        ``concurrency`` caps the claims running at once; ``rate`` ("100/s",
        "6000/m", "20/h") lets at most N tasks start in any sliding period
        (second, minute, hour), paced over it, fleet-wide. ``burst=B`` asks
        for a token bucket of B tokens instead: B may start at once, and up
        to B - 1 + N in one period (docs/flow-control.md).
        A task may name a limit in ``@app.task(limits=[...])`` before or
        after it is declared; submitting it needs the limit declared, here
        or by another app of the same store.

        ``per_key=True`` makes it a keyed limit: one budget (concurrency and
        rate) per key, the key being a task's ``limit_key`` argument (or a
        submit's ``limit_key=``); a key's budget is made on first use. The
        apps that submit such tasks declare the limit ``per_key`` too.

        ``concurrency="auto"`` or ``rate="auto"`` makes the knob adaptive
        (docs/adaptive-limits.md): the sweeper's leader sets it from what the
        workers report of the calls' outcomes, never outside
        ``[min_concurrency, max_concurrency]`` (min 1 by default) or
        ``[min_rate, max_rate]`` ("1/s" by default); the max is required.
        A new adaptive limit starts low (a twentieth of the max); declaring
        it again keeps what the fleet learned. Keyed and adaptive, each of
        its busiest keys learns its own values, starting from the limit's."""
        check.text(name, "limit name")
        if concurrency == "auto" or rate == "auto":
            self._adaptive_limit(
                name, concurrency, rate, burst, per_key, max_concurrency, min_concurrency, max_rate, min_rate
            )
            return
        given: dict[str, object] = {"max_concurrency": max_concurrency, "min_concurrency": min_concurrency}
        given.update(max_rate=max_rate, min_rate=min_rate)
        bound = next((k for k, v in given.items() if v is not None), None)
        if bound is not None:
            knob = "concurrency" if bound.endswith("concurrency") else "rate"
            raise ConfigError(f"limit {name!r}: {bound} bounds an adaptive limit; it needs {knob}='auto'")
        if isinstance(concurrency, str):
            raise ConfigError(
                f"a limit's concurrency must be an integer from 1 to {check.LIMIT_CONCURRENCY_RANGE[1]}"
                f" or 'auto', not {check.shown(concurrency)}"
            )
        if not isinstance(per_key, bool):
            raise ConfigError(f"per_key must be True or False, not {check.shown(per_key)}")
        if concurrency is not None:
            check.integer(concurrency, "a limit's concurrency", check.LIMIT_CONCURRENCY_RANGE)
        if rate is not None:
            check.text(rate, "a limit's rate")
        if burst is not None and rate is None:
            raise ConfigError("a limit's burst needs a rate: app.limit(name, rate='100/s', burst=20)")
        if rate is not None:
            try:
                parse_rate(rate, burst)
            except ValueError as exc:
                raise ConfigError(f"limit {name!r}: {exc}") from None
        now = self.store.set_limit(LimitSpec(name, concurrency, rate, burst, per_key=per_key))
        if now is not None and now.set_by is not None and now.settings() != LimitSettings(concurrency, rate, burst):
            # an operator's change stays in force over the declaration (core.limits)
            log.warning(
                "limit %r: %s set by %s stays in force, not the declared %s; `corral limit reset %s` hands it back",
                name,
                describe_settings(now.settings()),
                now.set_by,
                describe_settings(LimitSettings(concurrency, rate, burst)),
                name,
            )
        self._known_limits.add(name)
        if per_key:
            self._per_key.add(name)
        else:
            self._per_key.discard(name)

    def set_limit(
        self,
        name: str,
        *,
        concurrency: int | None | object = UNCHANGED,
        rate: str | None | object = UNCHANGED,
        burst: int | None | object = UNCHANGED,
    ) -> LimitSpec:
        """Change a declared limit while the fleet runs: every worker obeys
        at its next claim (within a second), without a restart.

        Only the settings named change (``set_limit("api", concurrency=3)``
        keeps the rate); None clears one (``rate=None``: no rate, and no
        burst). Raising a concurrency wakes waiting workers at once; lowering
        it below the places held lets running work finish and starts nothing
        new until under it. A keyed limit's keys all follow.

        The change stays in force over ``app.limit``'s declared settings,
        across restarts and new declarations, until :meth:`reset_limit`
        (docs/flow-control.md, "Changing a limit while running"). Recorded
        as a ``limit`` event. Returns the limit as it is now; ConfigError
        for a name no app declared or settings ``app.limit`` refuses."""
        changes = {
            f: v for f, v in (("concurrency", concurrency), ("rate", rate), ("burst", burst)) if v is not UNCHANGED
        }
        spec = self.store.change_limit(check.text(name, "limit name"), changes, by="app")
        self._known_limits.add(spec.name)
        return spec

    def reset_limit(self, name: str) -> LimitSpec:
        """Hand a limit back to its declared settings (undo :meth:`set_limit`'s
        changes, fleet-wide). Returns the limit as it is now."""
        return self.store.change_limit(check.text(name, "limit name"), {}, by="app", reset=True)

    def _adaptive_limit(
        self,
        name: str,
        concurrency: int | str | None,
        rate: str | None,
        burst: int | None,
        per_key: bool,
        max_concurrency: int | None,
        min_concurrency: int | None,
        max_rate: str | None,
        min_rate: str | None,
    ) -> None:
        """``app.limit`` with a knob set to "auto": checked whole, then stored in one write."""
        from corral.core.adaptive import AdaptiveSpec, Bounds

        def per_second(text: str | None, option: str) -> float | None:
            if text is None:
                return None
            check.text(text, f"a limit's {option}")
            try:
                return parse_rate(text).per_second
            except ValueError as exc:
                raise ConfigError(f"limit {name!r}: {option}: {exc}") from None

        if not isinstance(per_key, bool):
            raise ConfigError(f"per_key must be True or False, not {check.shown(per_key)}")
        auto_c, auto_r = concurrency == "auto", rate == "auto"
        if auto_c and max_concurrency is None:
            raise ConfigError(f"limit {name!r}: concurrency='auto' needs max_concurrency (its hard upper bound)")
        if auto_r and max_rate is None:
            raise ConfigError(f"limit {name!r}: rate='auto' needs max_rate (its hard upper bound, e.g. '200/s')")
        if not auto_c and (max_concurrency is not None or min_concurrency is not None):
            raise ConfigError(f"limit {name!r}: max_concurrency and min_concurrency need concurrency='auto'")
        if not auto_r and (max_rate is not None or min_rate is not None):
            raise ConfigError(f"limit {name!r}: max_rate and min_rate need rate='auto'")
        if auto_r and burst is not None:
            raise ConfigError(f"limit {name!r}: an adaptive rate takes no burst")
        fixed_c = None if auto_c else concurrency
        if isinstance(fixed_c, str):
            raise ConfigError(
                f"a limit's concurrency must be an integer from 1 to {check.LIMIT_CONCURRENCY_RANGE[1]}"
                f" or 'auto', not {check.shown(fixed_c)}"
            )
        if fixed_c is not None:
            check.integer(fixed_c, "a limit's concurrency", check.LIMIT_CONCURRENCY_RANGE)
        fixed_r = None if auto_r else rate
        if fixed_r is not None:
            per_second(fixed_r, "rate")
            if burst is not None:
                parse_rate(fixed_r, burst)
        hi_c = lo_c = 1
        if auto_c:
            hi_c = check.integer(max_concurrency, "a limit's max_concurrency", check.LIMIT_CONCURRENCY_RANGE)
            lo_c = 1 if min_concurrency is None else min_concurrency
            check.integer(lo_c, "a limit's min_concurrency", (1, hi_c))
        hi_r = lo_r = 1.0
        if auto_r:
            hi_r = per_second(max_rate, "max_rate") or 1.0
            lo_r = per_second(min_rate, "min_rate") or min(1.0, hi_r)
            if lo_r > hi_r:
                raise ConfigError(f"limit {name!r}: min_rate {min_rate!r} is above max_rate {max_rate!r}")
        spec = AdaptiveSpec(auto_c, auto_r, Bounds(lo_c, hi_c, lo_r, hi_r))
        # keyed: each key learns its own values (the keeper's per-key controller), from the limit's
        self.store.declare_adaptive(LimitSpec(name, fixed_c, fixed_r, burst, per_key=per_key), spec)
        self._known_limits.add(name)
        if per_key:
            self._per_key.add(name)
        else:
            self._per_key.discard(name)

    def batch(self, name: str, *, concurrency: int | None = None, on_complete: TaskDef | str | None = None) -> str:
        """Declare a batch: a per-batch limit and a callback, shared by the fleet.

        ``concurrency`` caps how many of the batch's tasks run at once across
        every worker of the store (a named limit ``batch:<name>``, counted in
        the claim); it applies to tasks submitted with ``batch=name`` after
        this call (here or in any process of the store). ``on_complete`` (a
        task, or a registered task's name) runs once when every task of the
        batch has ended, with the batch summary as its one argument: a dict
        with ``batch``, ``status`` (ALL_SUCCESS, PARTIAL_SUCCESS or FAILED),
        ``total``, ``counts`` per state and durations. Exactly once, however
        many workers finish the batch's last tasks together. Returns ``name``."""
        from corral.core.batches import Callback, limit_name

        name = check.text(name, "batch name")
        if concurrency is not None:
            check.integer(concurrency, "a batch's concurrency", check.LIMIT_CONCURRENCY_RANGE)
        template = None
        if on_complete is not None:
            if isinstance(on_complete, TaskDef):
                cb_def: TaskDef | None = on_complete
            elif isinstance(on_complete, str):
                cb_def = self.registry.get(check.text(on_complete, "on_complete"))
            else:
                raise ConfigError(f"on_complete must be a task or a task name, not {check.shown(on_complete)}")
            if cb_def is not None:
                cb = Callback(cb_def.name, cb_def.queue, cb_def.priority, cb_def.retries, cb_def.timeout, cb_def.limits)
            else:
                cb = Callback(str(on_complete))
            template = cb.to_json()
        lim = limit_name(name)
        if concurrency is not None or lim in self._known_limits or lim in self.store.limits():
            self.store.set_limit(LimitSpec(lim, concurrency, None, None))
            self._known_limits.add(lim)
            self._no_batch_limit.pop(name, None)
        self.store.set_batch(name, template)
        return name

    def _batch_limits(self, new: list[NewTask]) -> None:
        """Charge each task of a batch declared with a concurrency to the
        batch's limit. Looked up once per batch name, then remembered (a
        batch without one for a few seconds, so another process's later
        ``app.batch`` is seen)."""
        from corral.core.batches import limit_name

        batches = {nt.batch for nt in new if nt.batch is not None}
        now = time.monotonic()
        limited = set()
        for b in batches:
            lim = limit_name(b)
            if lim not in self._known_limits and self._no_batch_limit.get(b, 0.0) <= now:
                self._known_limits.update(self.store.limits())
                if lim not in self._known_limits:
                    if len(self._no_batch_limit) > 10_000:
                        self._no_batch_limit.clear()
                    self._no_batch_limit[b] = now + BATCH_LIMIT_RECHECK
            if lim in self._known_limits:
                limited.add(b)
        for nt in new:
            if nt.batch in limited:
                lim = limit_name(nt.batch)
                if lim not in nt.limits:
                    nt.limits = (*nt.limits, lim)

    def breaker(
        self,
        name: str,
        *,
        failure_ratio: float = 0.5,
        min_calls: int = 20,
        window: float | str = "60s",
        cooldown: float | str = "30s",
        probes: int = 3,
    ) -> None:
        """A circuit breaker on a limit or a task name, shared by the fleet.

        When at least ``failure_ratio`` of the last ``window``'s calls (and at
        least ``min_calls``) failed, it opens: its tasks are not claimed (no
        attempt burned) for ``cooldown``, then exactly ``probes`` run; if they
        all succeed it closes, else it opens again for twice as long."""
        check.text(name, "breaker name")
        try:
            cfg = BreakerConfig(
                failure_ratio=failure_ratio,
                min_calls=min_calls,
                window=_duration(window, "window"),
                cooldown=_duration(cooldown, "cooldown"),
                probes=probes,
            )
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"breaker {name!r}: {exc}") from None
        self.store.set_breaker(name, cfg)

    def breaker_force(self, name: str, state: str, reason: str) -> BreakerEvent:
        """Open (held until closed by hand) or close a breaker; logged with ``reason``."""
        wanted = str(state).upper()
        if wanted not in ("OPEN", "CLOSED", "CLOSE"):
            raise ConfigError(f"a breaker is forced 'open' or 'close', not {state!r}")
        target = BreakerState.OPEN if wanted == "OPEN" else BreakerState.CLOSED
        return self.store.force_breaker(name, target, check.text(reason, "reason"))

    # ---- pauses by hand -------------------------------------------------------------
    def pause(
        self, *, queue: str | None = None, group: str | None = None, limit: str | None = None, by: str | None = None
    ) -> bool:
        """Pause a queue, a group or a limit (exactly one) for the whole fleet.

        Stored, so it holds across restarts and every worker process: from
        its commit on no claim takes the paused work; a group's head waits and
        nothing after it starts; no attempt is burned. Tasks running finish
        normally; tasks a worker holds but has not started go back to the
        queue, attempts intact. A paused limit pauses every key of a keyed
        one. Something with no tasks may be paused before work arrives.
        ``by`` (default: user@host) is shown with the pause. True when it was
        not paused before."""
        kind, name = check_target(queue, group, limit)
        return self.store.pause(kind, name, who(by))

    def resume(
        self, *, queue: str | None = None, group: str | None = None, limit: str | None = None, by: str | None = None
    ) -> bool:
        """End a pause by hand (exactly one of ``queue``, ``group``,
        ``limit``); waiting workers look again at once. False when it was
        not paused (nothing changes). A limit's pause by a 429's
        ``Retry-After`` is its own and is not ended here."""
        kind, name = check_target(queue, group, limit)
        return self.store.resume(kind, name, who(by))

    def pauses(self) -> list[Pause]:
        """Every pause by hand in force: kind, name, since when, by whom."""
        return self.store.pauses()

    @property
    def task_names(self) -> frozenset[str]:
        return frozenset(self.registry)

    # ---- submitting ----------------------------------------------------------------
    def _resolve(self, task: TaskDef | str) -> TaskDef:
        if isinstance(task, TaskDef):
            return task
        tdef = self.registry.get(task) if isinstance(task, str) else None
        if tdef is None:
            registered = ", ".join(sorted(self.registry)) or "none"
            raise UnknownTask(f"unknown task {check.shown(task)}; registered: {registered}")
        return tdef

    def _check_limits(self, tdef: TaskDef) -> None:
        """Refuse a task whose limits were never declared: it would run unlimited.

        Checked at submit, not at ``@app.task``: the limit may be declared
        later in the module, or by another process in the store. The store is
        asked only about names not yet known here, so a submit costs no
        extra round trip once they are."""
        missing = [n for n in tdef.limits if n not in self._known_limits]
        if not missing:
            return
        self._known_limits.update(self.store.limits())
        missing = [n for n in missing if n not in self._known_limits]
        if missing:
            raise ConfigError(
                f"task {tdef.name!r} names limit {missing[0]!r}, declared neither in this app nor in its store: "
                f"declare it with app.limit({missing[0]!r}, concurrency=N)"
            )

    def _new_task(self, tdef: TaskDef, item: Mapping[str, Any], parent: str | None = None) -> NewTask:
        """One submit item as a NewTask; every option checked against the
        bounds of core.validation, so every store is given only what it holds.
        A delay is left relative in ``run_at``: the caller adds the store's now."""
        if not isinstance(item, Mapping):
            raise BadArguments(f"each submit item must be a mapping of options, not {check.shown(item)}")
        if not _GRAPH_KEYS.issuperset(item):  # the common case costs no set built per item
            unknown = set(item) - _GRAPH_KEYS
            raise BadArguments(f"unknown submit option(s): {', '.join(sorted(map(str, unknown)))}")
        args = item.get("args")
        kwargs = item.get("kwargs")
        if args is None:
            args = ()
        elif not isinstance(args, list | tuple):
            raise BadArguments(f"args of {tdef.name} must be a list or tuple, not {check.shown(args)}")
        if kwargs is None:
            kwargs = {}
        elif not isinstance(kwargs, Mapping) or not all(isinstance(k, str) for k in kwargs):
            raise BadArguments(f"kwargs of {tdef.name} must be a mapping with string keys, not {check.shown(kwargs)}")
        try:
            payload = dumps({"args": list(args), "kwargs": dict(kwargs)})
        except (TypeError, ValueError) as exc:
            raise BadArguments(f"arguments of {tdef.name} must be JSON-serialisable: {exc}") from None
        except RecursionError:
            raise BadArguments(f"arguments of {tdef.name} must be JSON-serialisable: nested too deep") from None
        problem = check.payload_problem(payload, self.max_payload_bytes, f"arguments of {tdef.name}")
        if problem is not None:
            raise BadArguments(problem)
        bad = BadArguments
        delay = item.get("delay")
        run_at = None
        if delay is not None:
            delay = check.seconds(delay, "delay", bad, zero_ok=True)
            if delay > 0:
                run_at = delay
        deps = item.get("depends_on")
        dep_ids: tuple[int, ...] = ()
        if deps:
            if isinstance(deps, str | bytes | Mapping | Handle | int) or not hasattr(deps, "__iter__"):
                raise bad(
                    f"depends_on must be a list of task ids, handles or refs of the same call, not {check.shown(deps)}"
                )
            dep_ids = tuple(
                check.integer(d.id if isinstance(d, Handle) else d, "each of depends_on", check.TASK_ID_RANGE, bad)
                for d in deps
                if not isinstance(d, str)  # refs of the same call: resolved by submit_many
            )
        retries, timeout, queue, priority = tdef.retries, tdef.timeout, tdef.queue, tdef.priority
        if "retries" in item:
            retries = check.integer(item["retries"], "retries", check.RETRIES_RANGE, bad)
        if "timeout" in item:  # an explicit None runs without a timeout
            timeout = None if item["timeout"] is None else check.seconds(item["timeout"], "timeout", bad)
        if item.get("queue") is not None:
            queue = check.text(item["queue"], "queue", bad)
        if item.get("priority") is not None:
            priority = check.integer(item["priority"], "priority", check.PRIORITY_RANGE, bad)
        group = item.get("group")
        if group is not None:
            group = sys.intern(check.text(group, "group", bad))
        batch = item.get("batch")
        key = item.get("key")
        trace_id = item.get("trace_id")
        debounce_key = item.get("debounce_key")
        if debounce_key is not None:
            if tdef.debounce is None:
                raise bad(f"debounce_key given, but task {tdef.name} has no debounce: @app.task(debounce='5s')")
            debounce_key = check.text(debounce_key, "debounce_key", bad)
            if run_at is not None:
                raise bad("a debounced submit takes no delay: its run waits for the debounce window")
            if dep_ids or item.get("depends_on"):
                raise bad("a debounced submit takes no depends_on: its one run stands for many submits")
        elif tdef.debounce is not None:
            raise bad(f"task {tdef.name} is debounced: submit it with debounce_key='...'")
        supersede_key = item.get("supersede_key")
        if supersede_key is not None:
            supersede_key = check.text(supersede_key, "supersede_key", bad)
        expires: float | datetime.datetime | None = tdef.expires
        if item.get("expires") is not None:
            expires = _expires_of(item["expires"], bad)
        if isinstance(expires, float) and run_at is not None and expires <= run_at:
            raise bad(f"expires ({expires:g}s) must be later than delay ({run_at:g}s): the task could never start")
        limits = tdef.limits
        if self._per_key and limits and not self._per_key.isdisjoint(limits):
            limit_key = self._limit_key(tdef, item, args, kwargs)
            limits = tuple(keyed_name(n, limit_key) if n in self._per_key else n for n in limits)
        elif item.get("limit_key") is not None:
            raise bad(f"limit_key given, but task {tdef.name} names no keyed limit (app.limit(..., per_key=True))")
        return NewTask(
            name=tdef.name,
            args=payload,
            queue=queue,
            priority=priority,
            max_retries=retries,
            timeout=timeout,
            group=group,
            batch=None if batch is None else check.text(batch, "batch", bad),
            key=None if key is None else check.text(key, "key", bad),
            trace_id=_new_trace_id(parent) if trace_id is None else check.text(trace_id, "trace_id", bad),
            run_at=run_at,
            depends_on=dep_ids,
            limits=limits,
            halt_group_on_failure=tdef.halt_group_on_failure,
            ref=None if item.get("ref") is None else check.text(item["ref"], "ref", bad),
            on_upstream_failure=tdef.on_upstream_failure,
            debounce_key=debounce_key,
            debounce=tdef.debounce if debounce_key is not None else None,
            debounce_max=tdef.debounce_max if debounce_key is not None else None,
            supersede_key=supersede_key,
            # relative until submit_many adds the store's now, as for run_at
            expires_at=expires.timestamp() if isinstance(expires, datetime.datetime) else expires,
            expires_absolute=isinstance(expires, datetime.datetime),
        )

    def _limit_key(self, tdef: TaskDef, item: Mapping[str, Any], args: Sequence[Any], kwargs: Mapping[str, Any]) -> str:
        """The key of a submit of ``tdef`` under its keyed limits: the
        submit's ``limit_key=``, else the value of the task's ``limit_key``
        argument (a string or an integer)."""
        keyed = next(n for n in tdef.limits if n in self._per_key)
        key = item.get("limit_key")
        if key is None:
            if tdef.limit_key is None:
                raise BadArguments(
                    f"task {tdef.name} names the keyed limit {keyed!r} but no key: "
                    f"@app.task(limit_key='<argument>') or submit(..., limit_key='...')"
                )
            if tdef.limit_key in kwargs:
                key = kwargs[tdef.limit_key]
            elif tdef.limit_key_at is not None and tdef.limit_key_at < len(args):
                key = args[tdef.limit_key_at]
            else:
                key = tdef.limit_key_default
            if isinstance(key, int) and not isinstance(key, bool):
                key = str(key)
            what = f"the limit key of {tdef.name} (its argument {tdef.limit_key!r})"
        else:
            what = "limit_key"
        return check.text(key, what, BadArguments)

    def submit(
        self,
        task: TaskDef | str,
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
        *,
        connection: Any = None,
        **options: Any,
    ) -> Handle:
        """Queue one run of ``task`` (a TaskDef or a registered name).

        ``connection`` enqueues inside your own database transaction: a
        psycopg (3) connection to the PostgreSQL store's database, or a
        :mod:`sqlite3` connection to the SQLite store's file. The task is
        written on it and not committed, so it exists if and only if your
        transaction commits (workers are woken at that commit)."""
        return self.submit_many(task, [dict(options, args=args, kwargs=kwargs or {})], connection=connection)[0]

    def submit_many(
        self,
        task: TaskDef | str | Sequence[Node | Mapping[str, Any]],
        items: Sequence[Mapping[str, Any]] | None = None,
        *,
        connection: Any = None,
    ) -> list[Handle]:
        """Queue many runs in one atomic store write: all are stored, or none
        (with ``connection``, in your own transaction: see :meth:`submit`).

        ``submit_many(task, items)`` runs one task with each item's options.
        ``submit_many(nodes)`` submits a graph of any tasks: each node is a
        :class:`Node` (or a mapping with ``task`` and the item keys). In both
        forms an item may have a ``ref`` (its local name in this call), and
        its ``depends_on`` may name refs of the same call beside task ids and
        handles. A cycle, a repeated ref or an unknown one raises
        BadArguments naming it, and nothing is stored. Handles come back in
        the order given, each with its ``ref``."""
        if self._closed:
            raise AppClosed("this app is closed; it accepts no new tasks")
        if items is None:
            pairs = self._graph_items(task)
        else:
            tdef = self._resolve(task)  # type: ignore[arg-type]
            if isinstance(items, str | bytes | Mapping) or not hasattr(items, "__iter__"):
                raise BadArguments(f"submit_many takes a list of items, not {check.shown(items)}")
            pairs = []
            for item in items:
                if isinstance(item, Mapping) and "task" in item:
                    raise BadArguments("an item names its task only in a graph: app.submit_many([Node(...), ...])")
                pairs.append((tdef, item))
        # every item is checked before anything is stored: one bad item stores none
        parent = _submitter_traceparent()
        new = [self._new_task(t, item, parent) for t, item in pairs]
        order = self._wire(new, [item for _, item in pairs])
        if any(nt.run_at is not None or nt.expires_at is not None for nt in new):
            # the store's clock, asked only when something is delayed or has a
            # deadline (a round trip on PostgreSQL)
            now = self.store.now()
            for nt in new:
                if nt.run_at is not None:
                    nt.run_at += now
                if nt.expires_at is not None and not nt.expires_absolute:
                    nt.expires_at += now
                    nt.expires_absolute = True
        for tdef in {id(t): t for t, _ in pairs if t.limits}.values():
            self._check_limits(tdef)
        if any(nt.batch is not None for nt in new):
            self._batch_limits(new)
        stored = new if order is None else [new[i] for i in order]
        if connection is not None:
            results = self.store.submit_in(connection, stored, max_queued=self.max_queued)
        else:
            results = self._store_bounded(stored)
        if order is not None:
            at = dict(zip(order, results))
            results = [at[i] for i in range(len(new))]
        return [Handle(self, r.id, nt.group, r.created, nt.ref) for r, nt in zip(results, new)]

    def _graph_items(self, nodes: Any) -> list[tuple[TaskDef, Mapping[str, Any]]]:
        if isinstance(nodes, TaskDef | str | bytes | Mapping) or not hasattr(nodes, "__iter__"):
            raise BadArguments(f"submit_many takes a task and its items, or a list of nodes, not {check.shown(nodes)}")
        pairs: list[tuple[TaskDef, Mapping[str, Any]]] = []
        for node in nodes:
            if isinstance(node, Node):
                pairs.append((self._resolve(node.task), node.item))
            elif isinstance(node, Mapping) and "task" in node:
                pairs.append((self._resolve(node["task"]), node))
            else:
                raise BadArguments(
                    f"each node of a graph is a corral.Node or a mapping with 'task', not {check.shown(node)}"
                )
        return pairs

    @staticmethod
    def _wire(new: list[NewTask], items: Sequence[Mapping[str, Any]]) -> list[int] | None:
        """Resolve refs named in ``depends_on`` to positions: sets each task's
        ``after`` (positions in the returned submit order, where every task
        comes after those it depends on). None when no item names a ref."""
        local = [[d for d in (item.get("depends_on") or ()) if isinstance(d, str)] for item in items]
        if not any(local):
            return None
        try:
            order = dag.order_refs([nt.ref for nt in new], local)
        except dag.CycleError as exc:
            raise BadArguments(f"{exc}; nothing was stored") from None
        except ValueError as exc:
            raise BadArguments(str(exc)) from None
        where = {new[i].ref: pos for pos, i in enumerate(order)}
        for nt, refs in zip(new, local):
            nt.after = tuple(where[r] for r in dict.fromkeys(refs))
        return order

    def _store_bounded(self, new: list[NewTask]) -> list[SubmitResult]:
        """Store ``new``, within ``max_queued`` when set (backpressure).

        The store counts the queue inside its own write, so several submitters
        never overshoot the bound together; ``on_full="block"`` tries again
        until there is room or ``full_timeout`` runs out."""
        bound = self.max_queued
        if bound is None:
            return self.store.submit(new)
        if len(new) > bound:
            raise QueueFull(f"{len(new)} tasks can never fit a queue bound of {bound}")
        outcome: dict[str, Any] = {}

        def stored() -> bool:
            try:
                outcome["results"] = self.store.submit(new, max_queued=bound)
                return True
            except QueueFull as exc:
                outcome["full"] = exc
                return False

        if poll_until(stored, 0.0 if self.on_full == "raise" else self.full_timeout, first=0.001):
            return outcome["results"]
        raise outcome["full"]

    # ---- reading and operating -------------------------------------------------------
    def get(self, task_id: int) -> TaskRecord:
        rec = self.store.get(int(task_id))
        if rec is None:
            raise TaskNotFound(f"no task with id {task_id}")
        return rec

    def wait(self, task_id: int, timeout: float | None = None) -> TaskRecord:
        """Wait for a task to reach a final state and return it."""
        last = [self.get(task_id)]

        def ended() -> bool:
            last[0] = self.get(task_id)
            return last[0].status in FINAL

        if not poll_until(ended, timeout):
            raise ResultTimeout(f"task {task_id} is still {last[0].status.value} after {timeout}s")
        return last[0]

    def cancel(self, task_id: int) -> TaskRecord:
        rec = self.store.cancel(int(task_id))
        if rec is None:
            raise TaskNotFound(f"no task with id {task_id}")
        if rec.status in (State.RUNNING, State.RESERVED) and self._worker is not None:
            self._worker.cancel_local(rec.id)
        if rec.batch is not None and rec.status in FINAL:
            self.store.settle_batches([rec.batch])  # the batch's last task may have been this one
        return rec

    def retry(self, task_id: int) -> bool:
        return self.store.retry(int(task_id))

    def tasks(self, **filters: Any) -> list[TaskRecord]:
        return self.store.list_tasks(TaskFilter(**filters))

    def dead(
        self, batch: str | None = None, limit: int = 100, offset: int = 0, *, after_id: int | None = None
    ) -> list[TaskRecord]:
        """The dead letters: tasks that ended FAILED or TIMEOUT (retries spent,
        a permanent error, arguments that cannot be decoded) and were not
        retried since, oldest first, each with its error, attempts and trace id.

        Page by ``after_id``, the last id of the page before: a deep page
        costs what the first does."""
        return self.store.dead_letters(batch, limit, offset, after_id=after_id)

    def prune(
        self,
        older_than: float | str,
        states: Iterable[str | State] | str | State = DEFAULT_PRUNE_STATES,
    ) -> int:
        """Delete the tasks that ended in one of ``states`` (default SUCCESS and
        CANCELED: a dead letter goes only when FAILED or TIMEOUT is named)
        more than ``older_than`` ago (``"7d"``, ``"12h"``, or seconds), in
        batches of bounded size; returns how many went.

        What is still needed stays whatever its age: an upstream of a task
        not ended (or of a dead letter, whose retry reads it), the tasks of a
        batch not finished or whose callback is not submitted yet, and a
        failure that halts its group with tasks behind it. The sweeper's
        leader does the same on its own by ``App(retention=)``."""
        from corral.maintenance.retention import prune

        ttl = retention_age(older_than, "older_than")
        chosen = final_states(states, "states")
        now = self.store.now()
        return prune(self.store, {s.value: now - ttl for s in chosen})

    def retry_dead(self, batch: str | None = None) -> list[int]:
        """Queue the dead letters (of ``batch``) again, all in one write, and
        return their ids. A group's re-queued tasks run in submit order,
        before its tasks still queued behind them."""
        return self.store.retry_dead(batch)

    # ---- the event stream ------------------------------------------------------------
    def events(
        self,
        follow: bool = False,
        kinds: Iterable[str] | str | None = None,
        since: int | None = None,
        *,
        stop: threading.Event | None = None,
        timeout: float | None = None,
    ) -> Iterator[Event]:
        """The store's events in the order they were written: tasks' state
        changes (``submitted``, ``started``, ``succeeded``, ``failed``,
        ``retrying``, ``timed_out``, ``canceled``, ``queued``, ``waiting``),
        ``progress``, ``breaker`` and ``level`` changes.

        ``since`` is the id of the last event already seen (0: from the oldest
        the store keeps); without it ``follow=True`` starts at the present and
        a plain read returns every event kept. ``follow`` waits for new events
        until ``stop`` is set or ``timeout`` seconds pass without one. Each
        :class:`Event` has ``kind``, ``subject`` (``task:<id>``,
        ``breaker:<name>``, ``fleet``), ``data`` (JSON; ``details`` decodes
        it), ``at`` and ``id``."""
        from corral.stores.stream import iter_events

        return iter_events(self.store, follow=follow, kinds=kinds, since=since, stop=stop, timeout=timeout)

    # ---- degradation levels ----------------------------------------------------------
    def level(self) -> Level:
        """The fleet's degradation level, NORMAL (L0) to EMERGENCY (L4)."""
        return Level(self.store.fleet_level().level)

    def level_state(self) -> FleetLevel:
        """The stored level with whether it was set by hand, why, and since when."""
        return self.store.fleet_level()

    def set_level(self, level: str | int | Level, *, reason: str = "") -> Level:
        """Set the fleet's level by hand (``"CIRCUIT_OPEN"``, ``"L3"``, ``3``),
        or hand it back to the automatic rules with ``"auto"``.

        A level set by hand stays until set again or handed back; workers
        follow it within about a second. Handed back, the level stays until
        the sweeper leader's next evaluation (one sweep interval), which sets
        what the signals call for at once, EMERGENCY included; from then on
        it steps up at once and down one level per ``level_calm_period``.
        Returns the level now in force."""
        from corral.engine.level_follower import set_level

        return set_level(self.store, level, reason=reason)

    def batch_status(self, batch: str) -> BatchSummary:
        return self.store.batch_summary(batch)

    def counts(self) -> dict[str, int]:
        return self.store.counts()

    # ---- running -----------------------------------------------------------------
    def worker(self, concurrency: int = 10, *, extra_hooks: Sequence[Hooks] = (), **options: Any) -> Worker:
        """Build (not start) a worker for this app's tasks: the one place a
        worker is assembled, for ``start``, ``run`` and ``corral worker``.

        Options are those of :class:`corral.engine.worker.Worker` (``queues``,
        ``chunk_size``, ``lease_seconds``, ``sweep_interval``, ...); bad ones
        raise ConfigError (concurrency is at most 1000 slots per process).
        Results over this app's ``max_payload_bytes`` fail their task.
        ``queues`` is a list of queue names sharing the slots, or a mapping
        of queue name to its own slots (``{"default": 8, "bulk": 2}``), so a
        flooded queue cannot take every slot; the worker's slots are then
        their sum and ``concurrency`` is not used.
        ``retry_share`` (default 0.25, a number in (0, 1], or None) keeps
        retries on a path apart: while fresh work waits, retries hold at most
        that share of the slots (at least one), so failing tasks cannot delay
        fresh work; when none waits they take every slot.
        ``extra_hooks`` watch this worker only, beside the app's own.
        With ``sweep_interval`` its sweeper also keeps the fleet's level and
        trims the event log while it leads (see :meth:`start`)."""
        from corral.core.slots import check_slots
        from corral.engine.batch_settler import BatchHooks
        from corral.engine.level_follower import LevelHooks
        from corral.engine.worker import Worker
        from corral.maintenance.level_keeper import LevelKeeper

        options.setdefault("max_payload_bytes", self.max_payload_bytes)
        options.setdefault("retention", self.retention)
        if options.get("sweep_interval"):
            options.setdefault(
                "levels", LevelKeeper(self.store, queue_bound=self.max_queued, calm_period=self.level_calm_period)
            )
        options.setdefault("schedules", tuple(self.schedules.values()))
        if isinstance(options.get("queues"), Mapping):
            concurrency = sum(check_slots(options["queues"]).values())
        levels = LevelHooks(
            self.store,
            concurrency,
            critical_names=[n for n, t in self.registry.items() if t.critical],
            critical_queues=self.critical_queues,
        )
        hooks = HookChain(self.hooks, *extra_hooks, levels, BatchHooks(self.store))
        return Worker(self.store, self.registry, hooks=hooks, clock=self.clock, concurrency=concurrency, **options)

    def _default_sweep_interval(self) -> float | None:
        """Sweep by default, unless the app runs on a clock of its own."""
        from corral.maintenance.sweeper import DEFAULT_SWEEP_INTERVAL

        return DEFAULT_SWEEP_INTERVAL if self.clock is SYSTEM_CLOCK else None

    def start(self, workers: int = 10, **options: Any) -> App:
        """Start an in-process worker with ``workers`` slots; returns at once.

        It runs the same maintenance as ``corral worker``: a sweeper every
        ``sweep_interval`` seconds (5 by default; None for none), which
        recovers the tasks of dead workers, and while it leads the fleet
        also keeps the fleet's level and trims the event log. An app on a
        clock of its own (a test's fake clock) runs none unless given
        ``sweep_interval``: its time moves only when the test moves it.

        If too many of its timed-out threads are still running
        (``max_abandoned_threads``), the worker logs an error and stops
        claiming: only ending the process ends a thread."""
        options.setdefault("sweep_interval", self._default_sweep_interval())
        with self._lock:
            if self._worker is None:
                self._worker = self.worker(workers, **options).start()
        return self

    def run(
        self,
        workers: int = 10,
        *,
        until_idle: bool = False,
        grace: float = 30.0,
        sweep_interval: float | Literal["default"] | None = "default",
        extra_hooks: Sequence[Hooks] = (),
        **options: Any,
    ) -> bool:
        """Run a worker in the foreground until SIGTERM/SIGINT (or, with
        ``until_idle``, until it has nothing left it can run: see :meth:`drain`).

        The first signal stops claiming and gives in-flight tasks ``grace``
        seconds; what does not finish is handed back to the queue. A second
        signal during the grace period exits at once with code 3. If too many
        timed-out threads are still running (``max_abandoned_threads``), it
        stops the same way and exits with code 4 for its supervisor to restart
        it. A sweeper runs beside it as with :meth:`start` (``sweep_interval``,
        5 s by default; None for none). ``extra_hooks`` watch this worker
        (metrics). Returns True if nothing had to be handed back."""
        from corral.engine.foreground import run_until_signal

        holder = options.pop("worker_id", None) or new_holder_id()
        if sweep_interval == "default":
            sweep_interval = self._default_sweep_interval()
        options["sweep_interval"] = sweep_interval
        worker = self.worker(workers, extra_hooks=extra_hooks, worker_id=holder, **options)
        with self._lock:
            if self._worker is not None:
                raise ConfigError("this app already runs a worker in this process")
            self._worker = worker
        try:
            return run_until_signal(
                worker, grace=grace, until=(lambda: worker.drain(timeout=0.2)) if until_idle else None
            )
        finally:
            self._worker = None

    def active_count(self) -> int:
        return sum(self.store.active_counts().values())

    def drain(self, timeout: float | None = None) -> bool:
        """Wait until the work this process can do is done; True if reached.

        With a worker here: nothing is in flight, and nothing of its queues
        and task names is due and free to start (nor a retry of those due
        before the deadline). Tasks of names it does not register, of other
        queues, delayed ones, and those held behind their group or a limit are
        not waited for, so a drain always ends. It keeps claiming: ``close``
        stops it. With no worker here: nothing in the store is queued, waiting
        or running (the work of other processes' workers)."""
        worker = self._worker
        if worker is not None:
            return worker.drain(timeout)
        return poll_until(lambda: self.active_count() == 0, timeout, first=0.001)

    def close(self, timeout: float | None = None) -> DrainReport:
        """Refuse new submits, drain (see :meth:`drain`), stop the worker here,
        and close the store if this app opened it.

        Returns a report, true when drained. At ``timeout`` what is in flight
        is handed back to the queue (never lost), and the report counts it;
        it also counts what was left in the store and why (other names or
        queues, delayed, waiting, blocked), and the close logs it. With no
        worker in this process, queued work stays in the store for other
        workers."""
        from corral.engine.worker import DrainReport

        if self._closed:
            return DrainReport()
        self._closed = True
        report = DrainReport()
        worker = self._worker
        if worker is not None:
            end = None if timeout is None else time.monotonic() + timeout
            try:
                drained = worker.drain(timeout)
            except CorralError as exc:
                if exc is not worker.fatal:
                    raise
                log.error("close: the worker here had stopped: %s", exc)  # a close still ends, and stops it
                drained = False
            grace = 0.0 if not drained else 30.0 if end is None else max(0.0, end - time.monotonic())
            clean = worker.stop(grace=grace)
            try:
                left = worker.leftovers()
            except StoreError as exc:
                log.warning("close: could not count the tasks left in the store: %s", exc)
                left = {}
            report = DrainReport(drained and clean, worker.handed_back, worker.abandoned_at_stop, left)
            self._worker = None
            log.log(logging.INFO if report.drained else logging.WARNING, "app closed: %s", report.summary())
        if self._owns_store:
            self.store.close()
        return report

    def __enter__(self) -> App:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
