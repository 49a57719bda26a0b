"""Periodic (cron) schedules: which ticks are due, decided without threads or a store.

A schedule is a five-field cron expression read in its own time zone (or an
alias such as ``@hourly``). A *tick* is an instant the expression names, in
whole epoch seconds; one tick enqueues at most one task across the fleet
(the store guards that with a unique (schedule, tick) row).

Which ticks a check enqueues (:func:`due_ticks`) depends on ``catch_up``, for
ticks that passed while no worker ran:

- ``"latest"`` (default): only the newest tick not yet handled, so a fleet
  back from downtime runs the job once, not once per missed tick;
- ``"all"``: every tick not yet handled, oldest first;
- ``"none"``: only ticks that came while this process was checking; missed
  ones are dropped.

In every mode a tick older than ``max_delay`` seconds is dropped (None: no
bound), so a daily report does not start at noon because the fleet was down
at its hour.

Daylight saving time: a tick that falls in a skipped hour (spring forward)
runs at the first instant after it (croniter's rule); in a repeated hour (fall
back) a schedule that names its hours runs once, at the first occurrence, and
one that runs every hour (``*`` in the hour field) runs in both, as cron does.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from corral.core.model import NewTask
from corral.core.validation import seconds
from corral.errors import ConfigError

CATCH_UPS = ("none", "latest", "all")
ALIASES = frozenset({"@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight", "@hourly"})
#: At most this many ticks are enqueued by one check; a longer backlog (``catch_up="all"``)
#: continues on the next check.
MAX_TICKS_PER_CHECK = 1000
#: An expression that names no instant within this many years never fires.
NEVER_YEARS = 5

#: Outcomes of one tick, as stored and shown.
ENQUEUED = "enqueued"
SKIPPED = "skipped"  # overlap=False and the previous run was still queued or running
TAKEN = "taken"  # another worker handled this tick first (not stored: its own outcome is)
EARLY = "early"  # the tick has not come yet by the store's clock (not stored: nothing was written)

#: Seconds a tick may lie ahead of the store's clock and still be taken. Tick
#: ownership follows the store's time: a worker whose clock runs ahead cannot
#: take (and so silence) ticks that have not come for the rest of the fleet,
#: nor stamp a new schedule in the future.
MAX_CLOCK_AHEAD = 5.0


def too_early(tick: float, store_now: float) -> bool:
    """Whether ``tick`` is further ahead of the store's clock than a worker may take it."""
    return tick > store_now + MAX_CLOCK_AHEAD


def first_stamp(worker_now: float, store_now: float) -> float:
    """When a new schedule counts from: the worker's time (its ticks are read
    on that clock), never ahead of the store's. No tick at or before the stamp
    is ever due, for any worker: a stamp ahead of the store's clock, even
    within the :data:`MAX_CLOCK_AHEAD` a tick is allowed, would drop the ticks
    between the store's time and it (a schedule stored at 12:00:58 by a clock
    4 s ahead would never run 12:01:00)."""
    return min(worker_now, store_now)


def zone(name: str) -> ZoneInfo:
    """The time zone named ``name`` (IANA, e.g. ``"Europe/Paris"``), or a one-line ConfigError."""
    if not isinstance(name, str) or not name.strip():
        raise ConfigError(f"timezone must be an IANA name such as 'UTC' or 'Europe/Paris', not {name!r}")
    try:
        return ZoneInfo(name.strip())
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise ConfigError(f"unknown timezone {name!r}: use an IANA name such as 'UTC' or 'Europe/Paris'") from None


def check_expression(expr: str, timezone: str = "UTC", *, now: float | None = None) -> str:
    """``expr`` normalised, or a one-line ConfigError if it is not a five-field
    cron expression (or alias) or names no instant within five years."""
    if not isinstance(expr, str) or not expr.strip():
        raise ConfigError(f"a cron expression is five fields like '*/5 * * * *', not {expr!r}")
    text = " ".join(expr.split())
    if text.startswith("@"):
        if text.lower() not in ALIASES:
            raise ConfigError(f"unknown cron alias {text!r}; known: {', '.join(sorted(ALIASES))}")
        text = text.lower()
    elif len(text.split()) != 5:
        raise ConfigError(
            f"cron expression {text!r} has {len(text.split())} field(s); it needs five: minute hour day month weekday"
        )
    tz = zone(timezone)
    from croniter import CroniterError, croniter  # imported when a schedule is declared: it takes ~60 ms

    if not croniter.is_valid(text):
        raise ConfigError(f"invalid cron expression {text!r}: expected minute hour day month weekday")
    start = datetime.fromtimestamp(now if now is not None else 1_700_000_000.0, tz)
    try:
        first = croniter(text, start).get_next(float)
    except (CroniterError, ValueError):
        raise ConfigError(f"cron expression {text!r} never fires (no such date)") from None
    if first - start.timestamp() > NEVER_YEARS * 366 * 86400:
        raise ConfigError(f"cron expression {text!r} never fires within {NEVER_YEARS} years")
    return text


def _names_hours(expr: str) -> bool:
    """True when the expression fires at named hours (not every hour)."""
    if expr.startswith("@"):
        return expr != "@hourly"
    return expr.split()[1] != "*"


@dataclass(frozen=True, slots=True)
class Schedule:
    """One periodic task: when it fires and what each tick enqueues.

    The first fields are stored (``corral periodic`` lists them without the
    app); the task fields after them build each tick's task."""

    name: str
    task: str
    expr: str
    timezone: str = "UTC"
    queue: str = "default"
    group: str | None = None
    overlap: bool = True
    catch_up: str = "latest"
    max_delay: float | None = None
    # what each tick's task carries besides the above
    args: str = '{"args":[],"kwargs":{}}'
    priority: int = 0
    max_retries: int = 0
    timeout: float | None = None
    limits: tuple[str, ...] = ()
    halt_group_on_failure: bool = False
    _tz: ZoneInfo | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.catch_up not in CATCH_UPS:
            raise ConfigError(f"catch_up must be one of {', '.join(CATCH_UPS)}, not {self.catch_up!r}")
        if self.max_delay is not None:  # NaN would drop every tick, or none, unsaid
            object.__setattr__(self, "max_delay", seconds(self.max_delay, "max_delay"))
        if not isinstance(self.overlap, bool):
            raise ConfigError(f"overlap must be True or False, not {self.overlap!r}")
        object.__setattr__(self, "expr", check_expression(self.expr, self.timezone))
        object.__setattr__(self, "_tz", zone(self.timezone))

    @property
    def tz(self) -> ZoneInfo:
        assert self._tz is not None
        return self._tz

    def _skip(self, tick: float) -> bool:
        """A repeat of a wall-clock time in a fall-back hour, for a schedule naming its hours."""
        return datetime.fromtimestamp(tick, self.tz).fold == 1 and _names_hours(self.expr)

    def iter_after(self, after: float) -> Iterator[int]:
        """Ticks strictly after ``after`` (epoch seconds), ascending, forever."""
        from croniter import croniter

        it = croniter(self.expr, datetime.fromtimestamp(after, self.tz))
        while True:
            tick = it.get_next(float)
            if tick <= after:  # croniter starts at the minute of ``after``
                continue
            if not self._skip(tick):
                yield int(tick)

    def next_after(self, after: float) -> int:
        """The first tick strictly after ``after``."""
        return next(self.iter_after(after))

    def latest(self, until: float) -> int | None:
        """The newest tick at or before ``until`` (None if there is none in five years back)."""
        from croniter import CroniterError, croniter

        it = croniter(self.expr, datetime.fromtimestamp(until + 1, self.tz))
        floor = until - NEVER_YEARS * 366 * 86400
        while True:
            try:
                tick = it.get_prev(float)
            except CroniterError:
                return None
            if tick < floor:
                return None
            if tick <= until and not self._skip(tick):
                return int(tick)

    def ticks(self, after: float, until: float, limit: int = MAX_TICKS_PER_CHECK) -> list[int]:
        """Ticks in ``(after, until]``, oldest first, at most ``limit``."""
        out: list[int] = []
        for tick in self.iter_after(after):
            if tick > until or len(out) >= limit:
                break
            out.append(tick)
        return out

    def new_task(self, tick: int) -> NewTask:
        """The task one tick enqueues (a fresh trace id each)."""
        return NewTask(
            name=self.task,
            args=self.args,
            queue=self.queue,
            priority=self.priority,
            max_retries=self.max_retries,
            timeout=self.timeout,
            group=self.group,
            trace_id=os.urandom(16).hex(),
            limits=self.limits,
            halt_group_on_failure=self.halt_group_on_failure,
        )


def due_ticks(
    schedule: Schedule, since: float, now: float, *, last_check: float, limit: int = MAX_TICKS_PER_CHECK
) -> list[int]:
    """The ticks one check should try to enqueue, oldest first.

    ``since``: the newest tick already handled (by any worker), or when the
    schedule was first stored: nothing at or before it is due. ``last_check``:
    when this process checked before (its start, on the first check); ticks
    after it came while the process was watching, the others were missed.
    """
    floor = since
    if schedule.max_delay is not None:
        # ticks are whole seconds: "tick >= now - max_delay" is "tick > ceil(now - max_delay) - 1"
        floor = max(floor, math.ceil(now - schedule.max_delay) - 1)
    if schedule.catch_up == "all":
        return schedule.ticks(floor, now, limit)
    newest = schedule.latest(now)
    if newest is None or newest <= floor:
        return []
    if schedule.catch_up == "none" and newest <= last_check:
        return []
    return [newest]


@dataclass(frozen=True, slots=True)
class ScheduleState:
    """A stored schedule and what its last tick did (``corral periodic``)."""

    name: str
    task: str
    expr: str
    timezone: str
    queue: str
    group: str | None
    overlap: bool
    catch_up: str
    max_delay: float | None
    created_at: float
    last_tick: float | None = None
    last_outcome: str | None = None  # ENQUEUED or SKIPPED
    last_task_id: int | None = None
    last_task_status: str | None = None  # the state of the last enqueued task, if it still exists

    def next_tick(self, now: float) -> int | None:
        """The next tick after ``now`` (None if the stored expression no longer parses)."""
        try:
            return Schedule(name=self.name, task=self.task, expr=self.expr, timezone=self.timezone).next_after(now)
        except (ConfigError, StopIteration, ValueError):
            return None


@dataclass(frozen=True, slots=True)
class TickResult:
    """What one attempt at a tick did: ENQUEUED (``task_id`` set), SKIPPED, or TAKEN."""

    outcome: str
    task_id: int | None = None


@dataclass(frozen=True, slots=True)
class TickRecord:
    """One stored tick of a schedule."""

    schedule: str
    tick: int
    outcome: str
    task_id: int | None
    at: float
