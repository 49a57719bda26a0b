"""Capacity planning: the sizing formulas as pure functions.

Nothing here touches a store or a clock; ``corral plan`` prints what these
return, and the numbers are unit-tested against worked examples.

- :func:`concurrency_limit`: how many requests may be in flight
  against a downstream service, ``QPS limit x latency (s) x safety factor``.
  100 QPS at 200 ms allows 20 in flight; with a 0.7 safety factor, 14.
- :func:`littles_law`: ``concurrency = throughput x mean duration``,
  units aligned. 392 tasks in 48 h with 4 workers is 8.17 tasks/h, so a task
  takes 4 / 8.17 h, about 29 minutes; 720 tasks in 48 h (15/h) then need
  15 x 0.49 = 7.3, so 8 concurrent workers.
- :func:`workers_per_process`: ``1 + io_wait / cpu_time``, capped
  (more threads than that only fill the database pool and memory).
  25 min of I/O per 4 min of CPU gives 1 + 6.25, so 7.
- :func:`process_layout`: processes x workers per process covers
  the target concurrency; lanes (partitions in a log broker, sub-groups here)
  are at least the concurrency, with head-room, because a lane is served by
  one worker at a time and cannot be split later without breaking order.
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass

from corral.core.stats import percentile

#: Keep 30% in reserve for retries and latency spikes; the usual range is 0.6-0.8.
DEFAULT_SAFETY = 0.7
#: Never more than 4-8 workers per process: more only fill the database pool and memory.
DEFAULT_WORKER_CAP = 8
#: 10 lanes for 8 workers: 2 spare for scaling out.
DEFAULT_LANE_HEADROOM = 0.25

_EPS = 1e-9  # so 100 x 0.2 x 0.7 = 13.999999999999998 still floors to 14

_UNITS = {
    "ms": 0.001,
    "s": 1.0,
    "sec": 1.0,
    "secs": 1.0,
    "second": 1.0,
    "seconds": 1.0,
    "m": 60.0,
    "min": 60.0,
    "mins": 60.0,
    "minute": 60.0,
    "minutes": 60.0,
    "h": 3600.0,
    "hr": 3600.0,
    "hrs": 3600.0,
    "hour": 3600.0,
    "hours": 3600.0,
    "d": 86400.0,
    "day": 86400.0,
    "days": 86400.0,
}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([a-z]*)\s*$", re.IGNORECASE)


def parse_duration(text: str | float | int, default_unit: str = "s") -> float:
    """Seconds in ``text``: ``"90"``, ``"90s"``, ``"200ms"``, ``"29m"``, ``"48h"``, ``"2d"``.

    A bare number is in ``default_unit``. Raises ValueError on anything else.
    """
    if isinstance(text, (int, float)):
        value, unit = float(text), default_unit
    else:
        m = _DURATION.match(str(text))
        if not m:
            raise ValueError(
                f"cannot parse duration {text!r}: expected a number with an optional unit (ms, s, m, h, d)"
            )
        value, unit = float(m.group(1)), (m.group(2).lower() or default_unit)
    if unit not in _UNITS:
        raise ValueError(f"unknown duration unit {unit!r} in {text!r}: use ms, s, m, h or d")
    if value < 0 or not math.isfinite(value):
        raise ValueError(f"duration must be a finite number >= 0, not {text!r}")
    return value * _UNITS[unit]


def format_age(seconds: float) -> str:
    """An age in whole units, for lists of things waiting or held: ``4s``,
    ``3m 20s``, ``2h 05m``, ``3d 04h``."""
    s = max(0, int(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m {s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h {s % 3600 // 60:02d}m"
    return f"{s // 86400}d {s % 86400 // 3600:02d}h"


def format_duration(seconds: float) -> str:
    """A short human form: ``450ms``, ``12.5s``, ``29.4 min``, ``2.5 h``, ``3.0 d``."""
    if seconds < 1:
        return f"{seconds * 1000:.0f}ms"
    if seconds < 120:
        return f"{seconds:.1f}s"
    if seconds < 2 * 3600:
        return f"{seconds / 60:.1f} min"
    if seconds < 2 * 86400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"


def _positive(name: str, value: float) -> None:
    if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be a number > 0, not {value!r}")


# ---- (a) downstream concurrency limit ---------------------------------------------------
@dataclass(frozen=True, slots=True)
class ConcurrencyLimit:
    qps: float
    latency_s: float
    safety: float
    per_request_qps: float  # what one in-flight request achieves: 1 / latency
    theoretical: float  # qps x latency: in flight at exactly the downstream cap
    limit: int  # floor(theoretical x safety), at least 1

    def as_dict(self) -> dict:
        return asdict(self)


def concurrency_limit(qps: float, latency_s: float, safety: float = DEFAULT_SAFETY) -> ConcurrencyLimit:
    """Concurrency limit = downstream QPS cap x latency (s) x safety factor."""
    _positive("qps", qps)
    _positive("latency", latency_s)
    if not (0 < safety <= 1):
        raise ValueError(f"safety factor must be in (0, 1], not {safety!r}")
    theoretical = qps * latency_s
    limit = max(1, math.floor(theoretical * safety + _EPS))
    return ConcurrencyLimit(qps, latency_s, safety, 1.0 / latency_s, theoretical, limit)


@dataclass(frozen=True, slots=True)
class LimitAdvice:
    """A limit that holds a downstream's QPS cap.

    The safety margin goes into the rate (``qps x safety`` a second). No
    ``burst=``: the default rate already lets at most that many start in any
    sliding second, and the margin is room for calls that reach the
    downstream later than their start was counted (a worker that stalls
    between its claim and its call delivers them on top of the next
    second's; measured about a tenth over the rate in the busiest second at
    the downstream). A burst would let up to ``burst - 1`` more through in a
    second. The concurrency is twice what is in
    flight at the cap (``2 x qps x latency``): a task holds its place from
    its claim to its written outcome, longer than the call itself (measured
    with ``corral bench limits``: about 1.3x the call at the median and 2x at
    p90), and a concurrency that binds first would hold the rate below its
    setting. The rate, not the concurrency, protects the downstream."""

    concurrency: int
    rate_per_s: int

    def line(self, name: str = "downstream") -> str:
        return f'app.limit("{name}", concurrency={self.concurrency}, rate="{self.rate_per_s}/s")'


def limit_advice(qps: float, latency_s: float, safety: float = DEFAULT_SAFETY) -> LimitAdvice:
    """The ``app.limit(...)`` to declare for a downstream capped at ``qps``."""
    _positive("qps", qps)
    _positive("latency", latency_s)
    rate = max(1, math.floor(qps * safety + _EPS))
    concurrency = max(1, math.ceil(2 * qps * latency_s - _EPS))
    return LimitAdvice(concurrency, rate)


# ---- (b) Little's law ------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class LittlesLaw:
    done: int
    window_s: float
    workers: float
    throughput_per_h: float  # measured: done / window
    mean_duration_s: float  # workers / throughput
    target: int | None = None
    target_window_s: float | None = None
    target_throughput_per_h: float | None = None
    required_concurrency: float | None = None  # target throughput x mean duration
    required_workers: int | None = None  # rounded up

    def as_dict(self) -> dict:
        return asdict(self)


def mean_duration(done: int, window_s: float, workers: float) -> float:
    """Little's law solved for the duration: ``workers / (done / window)``, in seconds."""
    _positive("done", done)
    _positive("window", window_s)
    _positive("workers", workers)
    return workers * window_s / done


def required_concurrency(target: int, window_s: float, mean_duration_s: float) -> float:
    """Little's law solved for the concurrency: ``(target / window) x mean duration``."""
    _positive("target", target)
    _positive("window", window_s)
    _positive("mean duration", mean_duration_s)
    return target * mean_duration_s / window_s


def littles_law(
    done: int,
    window_s: float,
    workers: float,
    target: int | None = None,
    target_window_s: float | None = None,
) -> LittlesLaw:
    """From a measured run (``done`` tasks in ``window_s`` with
    ``workers`` busy) find the mean task duration, and optionally the workers
    needed to finish ``target`` tasks in ``target_window_s`` (default: the same window)."""
    mean = mean_duration(done, window_s, workers)
    throughput_h = done / (window_s / 3600.0)
    if target is None:
        return LittlesLaw(done, window_s, workers, throughput_h, mean)
    twindow = window_s if target_window_s is None else target_window_s
    need = required_concurrency(target, twindow, mean)
    return LittlesLaw(
        done,
        window_s,
        workers,
        throughput_h,
        mean,
        target,
        twindow,
        target / (twindow / 3600.0),
        need,
        _workers(need),
    )


# ---- (c) workers per process ----------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class WorkersPerProcess:
    io_wait: float
    cpu_time: float
    raw: float  # 1 + io / cpu
    workers: int  # floor(raw), capped
    cap: int
    capped: bool

    def as_dict(self) -> dict:
        return asdict(self)


def workers_per_process(io_wait: float, cpu_time: float, cap: int = DEFAULT_WORKER_CAP) -> WorkersPerProcess:
    """Workers (threads) per process = 1 + I/O wait / CPU time, capped.

    ``io_wait`` and ``cpu_time`` are in the same unit (any). The raw value is
    rounded down: a fraction of a thread cannot be waiting, and rounding up
    only adds contention.
    """
    if not (io_wait >= 0 and math.isfinite(io_wait)):
        raise ValueError(f"io wait must be a number >= 0, not {io_wait!r}")
    _positive("cpu time", cpu_time)
    if cap < 1:
        raise ValueError("the worker cap must be at least 1")
    raw = 1.0 + io_wait / cpu_time
    n = max(1, math.floor(raw + _EPS))
    return WorkersPerProcess(io_wait, cpu_time, raw, min(n, cap), cap, n > cap)


# ---- (d) processes and lanes ------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class ProcessLayout:
    concurrency: int
    max_per_process: int  # the most workers one process should run (from (c))
    processes: int  # ceil(concurrency / max per process)
    per_process: int  # the concurrency spread evenly: ceil(concurrency / processes)
    total_slots: int  # processes x per process
    lanes: int  # sub-groups / partitions: concurrency plus head-room

    def as_dict(self) -> dict:
        return asdict(self)


def process_layout(concurrency: int, max_per_process: int, headroom: float = DEFAULT_LANE_HEADROOM) -> ProcessLayout:
    """Total concurrency = processes x workers per process, with at
    most ``max_per_process`` workers in one process, spread evenly (8 with at
    most 7 a process: 2 processes of 4). Lanes (partitions; sub-groups
    of a hot group here) are at least the concurrency, with head-room, since
    lanes cannot be re-cut later without breaking order (8 workers -> 10 lanes)."""
    if concurrency < 1 or max_per_process < 1:
        raise ValueError("concurrency and workers per process must be at least 1")
    if headroom < 0:
        raise ValueError("head-room must be >= 0")
    processes = math.ceil(concurrency / max_per_process)
    per = math.ceil(concurrency / processes)
    lanes = max(concurrency, math.ceil(concurrency * (1 + headroom) - _EPS))
    return ProcessLayout(concurrency, max_per_process, processes, per, processes * per, lanes)


# ---- the whole plan, as ``corral plan`` shows it -----------------------------------------------
#: The worked examples ``corral plan`` shows when given no input: a partner API
#: of 100 QPS at 200 ms; 392 tasks done in 48 h by 4 workers, 720 wanted; 25
#: minutes of I/O wait per 4 of CPU.
WORKED_EXAMPLE = {
    "qps": 100,
    "latency_s": 0.2,
    "done": 392,
    "window_s": 48 * 3600.0,
    "workers": 4,
    "target": 720,
    "io_wait": 25,
    "cpu_time": 4,
}


@dataclass(frozen=True, slots=True)
class RequiredConcurrency:
    """Little's law from a known mean duration: ``(target / window) x mean duration``."""

    target: int
    window_s: float
    mean_duration_s: float
    required_concurrency: float
    required_workers: int  # rounded up

    def as_dict(self) -> dict:
        return asdict(self)


def required_workers(target: int, window_s: float, mean_duration_s: float) -> RequiredConcurrency:
    """The concurrency needed to finish ``target`` tasks in ``window_s`` when a task takes
    ``mean_duration_s``, and that rounded up to whole workers (an exact integer stays)."""
    need = required_concurrency(target, window_s, mean_duration_s)
    return RequiredConcurrency(target, window_s, mean_duration_s, need, _workers(need))


def _workers(need: float) -> int:
    return max(1, math.ceil(need - _EPS))


@dataclass(frozen=True, slots=True)
class CapacityPlan:
    """Every part of a plan that its inputs allow; parts without inputs are None."""

    concurrency_limit: ConcurrencyLimit | None = None  # (a)
    littles_law: LittlesLaw | None = None  # (b) from a measured run
    required: RequiredConcurrency | None = None  # (b) from a known mean duration
    workers_per_process: WorkersPerProcess | None = None  # (c)
    layout: ProcessLayout | None = None  # (d)

    @property
    def empty(self) -> bool:
        return all(getattr(self, f) is None for f in self.__dataclass_fields__)

    def as_dict(self) -> dict:
        """The parts present, in order (a) to (d), each as a dict."""
        parts = ((f, getattr(self, f)) for f in self.__dataclass_fields__)
        return {f: part.as_dict() for f, part in parts if part is not None}


def capacity_plan(
    *,
    qps: float | None = None,
    latency_s: float | None = None,
    safety: float = DEFAULT_SAFETY,
    done: int | None = None,
    window_s: float | None = None,
    workers: float | None = None,
    mean_duration_s: float | None = None,
    target: int | None = None,
    target_window_s: float | None = None,
    io_wait: float | None = None,
    cpu_time: float | None = None,
    cap: int = DEFAULT_WORKER_CAP,
    concurrency: int | None = None,
    per_process: int | None = None,
) -> CapacityPlan:
    """Each part of the plan whose inputs are all given.

    (a) needs ``qps`` and ``latency_s``; (b) needs ``done``, ``window_s`` and
    ``workers`` (a measured run), or ``target`` and ``mean_duration_s`` (with
    ``target_window_s``, else ``window_s``); (c) needs ``io_wait`` and
    ``cpu_time``; (d) lays out ``concurrency`` (default: the workers (b)
    requires) over processes of at most ``per_process`` workers (default:
    (c)'s answer). A part whose inputs are only partly given is left out:
    callers that want to report that check first. Raises ValueError on a
    value out of range.
    """
    limit = concurrency_limit(qps, latency_s, safety) if qps is not None and latency_s is not None else None
    law = required = None
    if done is not None and window_s is not None and workers is not None:
        law = littles_law(done, window_s, workers, target, target_window_s)
    elif target is not None and mean_duration_s is not None:
        window = target_window_s or window_s
        if window is not None:
            required = required_workers(target, window, mean_duration_s)
    per_process_plan = (
        workers_per_process(io_wait, cpu_time, cap) if io_wait is not None and cpu_time is not None else None
    )
    if concurrency is None:
        if law is not None and law.required_workers:
            concurrency = law.required_workers
        elif required is not None:
            concurrency = required.required_workers
    if per_process is None and per_process_plan is not None:
        per_process = per_process_plan.workers
    layout = process_layout(concurrency, per_process) if concurrency is not None and per_process is not None else None
    return CapacityPlan(limit, law, required, per_process_plan, layout)


# ---- from history: the same formulas with measured numbers ---------------------------------
#: How many of the newest finished tasks ``corral plan --from-history`` reads at most.
DEFAULT_HISTORY_SAMPLE = 10_000
#: A task name's history is looked for among the newest ``sample x HISTORY_SCAN``
#: tasks of every name, so reading a rare name's history stays bounded too.
HISTORY_SCAN = 20


@dataclass(frozen=True, slots=True)
class HistoryRow:
    """One finished task as the planner reads it from a store."""

    status: str  # SUCCESS, FAILED or TIMEOUT
    started_at: float | None
    finished_at: float | None
    attempt: int


@dataclass(frozen=True, slots=True)
class History:
    """What a store's finished tasks measured: durations, success, throughput."""

    subject: str  # "task NAME" or "batch B"
    read: int  # finished tasks read (the newest, at most ``sample``)
    sample: int
    timed: int  # of those, with a start and an end (their duration is known)
    successes: int
    failures: int  # FAILED or TIMEOUT
    success_rate: float | None  # successes / read
    mean_attempts: float | None
    p50_s: float | None
    p99_s: float | None
    mean_s: float | None
    window_s: float | None  # first start to last finish of the tasks read
    throughput_per_s: float | None  # read / window

    def as_dict(self) -> dict:
        return asdict(self)


def history(subject: str, rows: list[HistoryRow], sample: int = DEFAULT_HISTORY_SAMPLE) -> History:
    """Measure ``rows`` (finished tasks): p50, p99 and mean duration (end
    minus start of the last attempt), success rate, and throughput over the
    span from the first start to the last end."""
    durations = sorted(
        r.finished_at - r.started_at
        for r in rows
        if r.started_at is not None and r.finished_at is not None and r.finished_at >= r.started_at
    )
    ok = sum(1 for r in rows if r.status == "SUCCESS")
    starts = [r.started_at for r in rows if r.started_at is not None]
    ends = [r.finished_at for r in rows if r.finished_at is not None]
    window = max(ends) - min(starts) if starts and ends and max(ends) > min(starts) else None
    n = len(rows)
    return History(
        subject=subject,
        read=n,
        sample=sample,
        timed=len(durations),
        successes=ok,
        failures=n - ok,
        success_rate=ok / n if n else None,
        mean_attempts=sum(max(1, r.attempt) for r in rows) / n if n else None,
        p50_s=percentile(durations, 0.5, presorted=True),
        p99_s=percentile(durations, 0.99, presorted=True),
        mean_s=sum(durations) / len(durations) if durations else None,
        window_s=window,
        throughput_per_s=n / window if window else None,
    )


@dataclass(frozen=True, slots=True)
class HistoryPlan:
    """The planning formulas filled in with a :class:`History`.

    Little's law: the tasks in flight on average were ``throughput x mean
    duration``; for a target, ``workers = target / window x mean duration /
    success rate`` (a failed run took a slot too, and its retry another).
    The limit: ``QPS x latency x safety``, the latency being the measured
    mean duration and the QPS the downstream's cap (or, when it is not
    given, the throughput measured)."""

    history: History
    in_flight: float | None  # throughput x mean duration: the concurrency the history ran at
    qps: float | None
    qps_measured: bool  # True when qps is the measured throughput, not a given cap
    limit: ConcurrencyLimit | None
    advice: LimitAdvice | None
    required: RequiredConcurrency | None
    attempts_per_success: float | None  # 1 / success rate
    required_with_retries: float | None
    workers_with_retries: int | None

    def as_dict(self) -> dict:
        d = asdict(self)
        d["history"] = self.history.as_dict()
        return d


def history_plan(
    h: History,
    *,
    qps: float | None = None,
    safety: float = DEFAULT_SAFETY,
    target: int | None = None,
    target_window_s: float | None = None,
) -> HistoryPlan:
    """Fill the formulas in with ``h``; ValueError when the history measured
    no duration (nothing finished with a start and an end)."""
    if h.mean_s is None or h.mean_s <= 0:
        raise ValueError(f"{h.subject} has no finished task with a measured duration to plan from")
    in_flight = h.throughput_per_s * h.mean_s if h.throughput_per_s else None
    measured = qps is None
    q = h.throughput_per_s if qps is None else qps
    limit = concurrency_limit(q, h.mean_s, safety) if q else None
    advice = limit_advice(q, h.mean_s, safety) if q else None
    required = per_success = need = workers = None
    if target is not None:
        window = target_window_s if target_window_s is not None else h.window_s
        if window is None:
            raise ValueError("a target needs a target window (the history spans no time)")
        required = required_workers(target, window, h.mean_s)
        if h.success_rate:
            per_success = 1.0 / h.success_rate
            need = required.required_concurrency * per_success
            workers = _workers(need)
    return HistoryPlan(h, in_flight, q, measured, limit, advice, required, per_success, need, workers)


__all__ = [
    "DEFAULT_HISTORY_SAMPLE",
    "HISTORY_SCAN",
    "HistoryRow",
    "History",
    "history",
    "HistoryPlan",
    "history_plan",
    "DEFAULT_SAFETY",
    "DEFAULT_WORKER_CAP",
    "DEFAULT_LANE_HEADROOM",
    "parse_duration",
    "format_age",
    "format_duration",
    "ConcurrencyLimit",
    "concurrency_limit",
    "LittlesLaw",
    "littles_law",
    "mean_duration",
    "required_concurrency",
    "WorkersPerProcess",
    "workers_per_process",
    "ProcessLayout",
    "process_layout",
    "WORKED_EXAMPLE",
    "RequiredConcurrency",
    "required_workers",
    "CapacityPlan",
    "capacity_plan",
]
