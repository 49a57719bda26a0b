"""Limits that learn: the controller that sets a limit's effective concurrency
and rate from what the partner answered, and the reports it reads. Pure: no
thread, no store, time passed in.

Workers count, per limit, what happened between two reports
(:class:`ReportAccumulator`, about once a second, never a write per task);
the reports of every worker are merged (:meth:`LimitReport.merge`) and the
sweeper's leader feeds the merged one to :func:`decide` with the limit's
:class:`ControllerState`, which is a small JSON record kept in the limit's
row, so a new leader continues where the old one stopped. :func:`decide`
returns the new state, the effective concurrency and rate (always inside the
user's :class:`Bounds`) and an explanation: the inputs and the rule that
fired for each, to be written as an event.

Two controllers, one per knob, each reading the signal that belongs to it:

- **Rate** (CUBIC, as the AWS SDKs' adaptive retry): a throttle (429, 503,
  ``Retry(after=)``) cuts the rate to ``RATE_BETA`` of the rate that was
  *measured to succeed* in that interval (the partner's real capacity for
  us, not what we sent: the share of the calls that succeeded times the rate
  in force, which a report missing from the interval does not lower); nothing
  else cuts it. Where the rules read the rate that succeeded, it is the
  highest of the last few intervals' (a smoothed "measured tx rate"). It grows again only in
  intervals where the rate held work back (the limit was the bottleneck),
  along a cubic curve that comes back to the capacity where the cut happened
  slowly and then probes past it, and never above twice the rate measured to
  succeed. Before the first throttle it grows by ``RATE_START_GROWTH`` an
  interval (a slow start).
- **Concurrency** (a gradient on latency, as Vector's ARC and Envoy's
  adaptive concurrency): the median latency of successful calls against a
  baseline, the median seen when the partner was not loaded. Above
  ``LATENCY_CUT`` times the baseline the limit is cut in proportion to the
  excess; errors (timeouts, connection errors, 5xx that are not throttles)
  above ``ERROR_CUT`` of the calls cut it too; it grows by about
  ``CONCURRENCY_GROWTH`` only when the places were all in use and latency is
  within ``LATENCY_GROW`` of the baseline.

The pitfalls others met, and what avoids them here (docs/adaptive-limits.md):

- a latency controller against a rate-limited server (its 429s are fast and
  lower the measured latency): throttled calls never enter the latency
  histogram, an interval with throttles never grows the concurrency, and the
  rate has its own controller;
- a baseline that drifts up under steady overload: the baseline drops
  halfway to a lower median at once but rises only every ``BASELINE_PERIOD`` seconds, to
  the lowest median seen in that period and by at most ``BASELINE_RISE``;
- latency alone cannot tell "the dependency got slower" from "we send too
  much": after more than ``SLOWER_STREAK`` latency cuts in a row that brought the calls in
  flight down by a quarter without bringing the latency down, the dependency
  is taken to be slower and the baseline is measured again;
- a floor that never recovers: the same rule fires at ``min_concurrency``
  (cutting there cannot help), a limit of a few places needs only as many
  successful calls as it has places to judge its latency, and a rate cut to its floor grows again as
  soon as it is the bottleneck and succeeds;
- a first adaptive mode that lost its state between calls and cut far below
  the server's capacity: the whole state is the record, and a cut goes to a
  fraction of what succeeded, not of what was sent, at most once an interval
  unless throttles keep coming.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

#: latency histogram buckets: bucket i holds latencies in [BASE * R**i, BASE * R**(i+1)) milliseconds
HISTOGRAM_BASE_MS = 0.5
HISTOGRAM_RATIO = 2**0.25
HISTOGRAM_BUCKETS = 80

#: a throttle cuts the rate to this fraction of the rate measured to succeed
RATE_BETA = 0.9
#: the cubic's scale, relative to the rate at the last cut: the rate is
#: ``w_max * (1 + RATE_CUBIC_C * (t - K) ** 3)`` after ``t`` bottleneck seconds
RATE_CUBIC_C = 0.004
#: before the first throttle the rate grows by this factor an interval ...
RATE_START_GROWTH = 1.5
#: ... once this share of the rate succeeded in the interval (the last raise has shown)
RATE_START_CONFIRM = 0.8
#: the rate never grows above this multiple of the rate measured to succeed
RATE_SUCCESS_CAP = 2.0
#: past the rate of the last cut, the rate grows by at most this fraction of it an interval
RATE_PROBE_STEP = 0.02
#: ... growing by as much every interval, up to this many times as much
RATE_PROBE_STEPS = 6.0
#: this many bottleneck seconds past the last cut without a throttle, the rate grows as before the first
RATE_STALE_AFTER = 12.0
#: an interval says the partner's capacity only if the limit sent at least this share of its rate
RATE_BUSY_SHARE = 0.8
#: throttles in the interval right after a cut cut again only above this share of the calls ...
RATE_RECUT_SHARE = 0.25
#: ... and by at most this fraction of the rate
RATE_RECUT_DEPTH = 0.25

#: the smoothed success rate is the highest of this many intervals' (the newest included)
RATE_MEASURED_SPAN = 3

#: median latency above this multiple of the baseline cuts the concurrency
LATENCY_CUT = 1.3
#: the concurrency grows only with median latency within this multiple of the baseline
LATENCY_GROW = 1.15
#: a latency cut aims at this multiple of the baseline
LATENCY_TARGET = 1.1
#: errors above this share of the calls cut the concurrency ...
ERROR_CUT = 0.05
#: ... to this fraction of the calls that were in flight
ERROR_BETA = 0.75
#: a cut keeps at least this fraction of the calls in flight, an interval
MAX_CUT = 0.5
#: growth an interval, as a fraction of the limit (at least 1)
CONCURRENCY_GROWTH = 0.1
#: fewer successful calls than this in an interval say nothing about latency
MIN_SAMPLES = 5
#: the baseline rises at most every this many seconds ...
BASELINE_PERIOD = 30.0
#: ... by at most this factor
BASELINE_RISE = 1.25
#: latency cuts in a row without the latency falling before the baseline is measured again
SLOWER_STREAK = 3


@dataclass(frozen=True)
class Bounds:
    """The user's hard bounds; the controller's output always lies inside them."""

    min_concurrency: int = 1
    max_concurrency: int = 100
    min_rate: float = 1.0
    max_rate: float = 1000.0

    def __post_init__(self) -> None:
        if not 1 <= self.min_concurrency <= self.max_concurrency:
            raise ValueError("bounds need 1 <= min_concurrency <= max_concurrency")
        if not 0 < self.min_rate <= self.max_rate:
            raise ValueError("bounds need 0 < min_rate <= max_rate")

    def concurrency(self, value: float) -> float:
        return min(float(self.max_concurrency), max(float(self.min_concurrency), value))

    def rate(self, value: float) -> float:
        return min(self.max_rate, max(self.min_rate, value))


def bucket_of(latency_ms: float) -> int:
    """The histogram bucket of a latency (milliseconds)."""
    if latency_ms <= HISTOGRAM_BASE_MS:
        return 0
    return min(HISTOGRAM_BUCKETS - 1, int(math.log(latency_ms / HISTOGRAM_BASE_MS) / math.log(HISTOGRAM_RATIO)))


def quantile_ms(histogram: Mapping[int, int], q: float) -> float | None:
    """The ``q`` quantile of a histogram (interpolated geometrically inside its bucket), None if empty."""
    total = sum(histogram.values())
    if total <= 0:
        return None
    rank = q * total
    seen = 0.0
    for bucket in sorted(histogram):
        count = histogram[bucket]
        if count and seen + count >= rank:
            inside = (rank - seen) / count
            return HISTOGRAM_BASE_MS * HISTOGRAM_RATIO ** (bucket + inside)
        seen += count
    return HISTOGRAM_BASE_MS * HISTOGRAM_RATIO ** (max(histogram) + 1)


@dataclass(frozen=True)
class LimitReport:
    """What happened under one limit during ``seconds``: one worker's count, or the fleet's merged.

    ``throttles`` are calls the partner refused for load (429, 503,
    ``Retry(after=)``), ``errors`` calls that failed in a way load can cause
    (timeouts, connection errors, other 5xx); neither is in ``successes``.
    ``peak_in_flight`` is the most calls in flight under the limit across the
    fleet, as the claims saw it when they charged the limit. ``held_by_rate``
    and ``held_by_concurrency`` count claims the limit held back (the limit
    was the bottleneck). ``latency`` is a histogram of successful calls'
    latencies, bucket index (:func:`bucket_of`) to count.
    """

    seconds: float
    calls: int = 0
    successes: int = 0
    throttles: int = 0
    errors: int = 0
    peak_in_flight: int = 0
    held_by_rate: int = 0
    held_by_concurrency: int = 0
    latency: Mapping[int, int] = field(default_factory=dict)

    def merge(self, other: LimitReport) -> LimitReport:
        """Two reports of the same interval (two workers) as one: counts add, peaks and spans take the larger."""
        latency = dict(self.latency)
        for bucket, count in other.latency.items():
            latency[bucket] = latency.get(bucket, 0) + count
        return LimitReport(
            seconds=max(self.seconds, other.seconds),
            calls=self.calls + other.calls,
            successes=self.successes + other.successes,
            throttles=self.throttles + other.throttles,
            errors=self.errors + other.errors,
            peak_in_flight=max(self.peak_in_flight, other.peak_in_flight),
            held_by_rate=self.held_by_rate + other.held_by_rate,
            held_by_concurrency=self.held_by_concurrency + other.held_by_concurrency,
            latency=latency,
        )

    @staticmethod
    def merged(reports: Iterable[LimitReport], seconds: float) -> LimitReport:
        """The fleet's report over ``seconds`` from its workers' (an empty fleet reports nothing happened)."""
        total = LimitReport(seconds=seconds)
        for report in reports:
            total = total.merge(report)
        return replace(total, seconds=seconds)

    def p50_ms(self, min_samples: int = MIN_SAMPLES) -> float | None:
        """The median latency of successful calls, None with fewer than ``min_samples`` of them."""
        if sum(self.latency.values()) < max(1, min_samples):
            return None
        return quantile_ms(self.latency, 0.5)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["latency"] = {str(k): v for k, v in sorted(self.latency.items())}
        return data

    @staticmethod
    def from_dict(data: Mapping[str, Any]) -> LimitReport:
        fields = dict(data)
        fields["latency"] = {int(k): int(v) for k, v in dict(data.get("latency") or {}).items()}
        return LimitReport(**fields)


class ReportAccumulator:
    """One worker's counts for one limit between two reports: a few integers
    and a sparse histogram, updated in memory per call, taken once a second."""

    __slots__ = ("_since", "_calls", "_ok", "_throttles", "_errors", "_peak", "_held_rate", "_held_conc", "_hist")

    def __init__(self, now: float):
        self._since = now
        self._reset()

    def _reset(self) -> None:
        self._calls = self._ok = self._throttles = self._errors = self._peak = 0
        self._held_rate = self._held_conc = 0
        self._hist: dict[int, int] = {}

    def started(self, in_flight: int) -> None:
        """A call started; ``in_flight`` is the limit's count (fleet-wide) the claim saw, this call included."""
        self._calls += 1
        if in_flight > self._peak:
            self._peak = in_flight

    def held(self, by: str) -> None:
        """A claim was held back by the limit's ``"rate"`` or ``"concurrency"``."""
        if by == "rate":
            self._held_rate += 1
        elif by == "concurrency":
            self._held_conc += 1
        else:
            raise ValueError(f"held by 'rate' or 'concurrency', not {by!r}")

    def succeeded(self, latency_ms: float) -> None:
        self._ok += 1
        bucket = bucket_of(latency_ms)
        self._hist[bucket] = self._hist.get(bucket, 0) + 1

    def throttled(self) -> None:
        self._throttles += 1

    def failed(self) -> None:
        self._errors += 1

    def take(self, now: float) -> LimitReport:
        """The report since the last one; counting starts again from nothing."""
        report = LimitReport(
            seconds=max(0.0, now - self._since),
            calls=self._calls,
            successes=self._ok,
            throttles=self._throttles,
            errors=self._errors,
            peak_in_flight=self._peak,
            held_by_rate=self._held_rate,
            held_by_concurrency=self._held_conc,
            latency=self._hist,
        )
        self._since = now
        self._reset()
        return report


@dataclass(frozen=True)
class ControllerState:
    """Everything the controller remembers: a few numbers, kept as JSON in the limit's row.

    ``rate`` and ``concurrency`` are the unrounded effective values; ``w_max``
    the rate measured to succeed at the last cut (None before the first);
    ``since_cut`` the bottleneck seconds since then (the cubic's clock: idle
    time does not count); ``baseline_ms`` the unloaded median latency,
    ``probe_min_ms`` the lowest median since ``probe_start``; ``streak``,
    ``streak_p50_ms`` and ``streak_peak`` follow a run of latency cuts.
    """

    rate: float
    concurrency: float
    w_max: float | None = None
    since_cut: float = 0.0
    last_cut_at: float | None = None
    baseline_ms: float | None = None
    probe_min_ms: float | None = None
    probe_start: float = 0.0
    streak: int = 0
    streak_p50_ms: float = 0.0
    streak_peak: int = 0
    concurrency_cut_at: float | None = None
    #: the rates that succeeded in the last :data:`RATE_MEASURED_SPAN` intervals, newest last,
    #: and the rate in force in the last one (the measured success rate, smoothed: see ``_measured``)
    recent_ok: tuple[float, ...] = ()
    rate_before: float | None = None

    def to_dict(self) -> dict[str, Any]:
        # its fields are numbers and a tuple of numbers: read as they are (asdict copies deeply, a
        # cost a keyed limit's hundreds of keys pay each second)
        data = {f.name: getattr(self, f.name) for f in fields(self)}
        data["recent_ok"] = list(self.recent_ok)
        return data

    @staticmethod
    def from_dict(data: Mapping[str, Any]) -> ControllerState:
        fields = dict(data)
        fields["recent_ok"] = tuple(float(v) for v in fields.get("recent_ok") or ())
        return ControllerState(**fields)


def initial_state(
    bounds: Bounds, now: float, rate: float | None = None, concurrency: float | None = None
) -> ControllerState:
    """Where a new adaptive limit starts: the given values, else the lower bounds (clamped into the bounds)."""
    return ControllerState(
        rate=bounds.rate(rate if rate is not None else bounds.min_rate),
        concurrency=bounds.concurrency(concurrency if concurrency is not None else bounds.min_concurrency),
        probe_start=now,
    )


@dataclass(frozen=True)
class Decision:
    """The controller's answer for one interval."""

    state: ControllerState
    concurrency: int
    rate: float
    rate_rule: str
    concurrency_rule: str
    inputs: Mapping[str, Any]

    @property
    def explanation(self) -> dict[str, Any]:
        """What an event records: the inputs, each knob's rule and its new value."""
        return {
            "rate": round(self.rate, 3),
            "rate_rule": self.rate_rule,
            "concurrency": self.concurrency,
            "concurrency_rule": self.concurrency_rule,
            "inputs": dict(self.inputs),
        }


def effective_concurrency(state: ControllerState, bounds: Bounds) -> int:
    return int(bounds.concurrency(math.floor(state.concurrency + 1e-9)))


def _cubic_k() -> float:
    """Bottleneck seconds for the cubic to come back to the rate of the last cut."""
    return float(((1 - RATE_BETA) / RATE_CUBIC_C) ** (1 / 3))


def _cubic(w_max: float, t: float) -> float:
    return w_max * (1 + RATE_CUBIC_C * (t - _cubic_k()) ** 3)


def _samples_needed(state: ControllerState) -> int:
    return min(MIN_SAMPLES, math.floor(state.concurrency + 1e-9))


def _measured(state: ControllerState, ok_rate: float) -> float:
    """The rate measured to succeed, smoothed: the highest of the last few intervals'.

    One interval's figure is noisy: the workers' reports do not arrive in step with
    the leader (on a loaded machine one interval holds two of a worker's and the next
    none, and a missing report reads as calls that did not succeed). What succeeded is
    a floor of what the partner takes, so the highest of the last few is the better
    measure (the AWS SDKs' "measured tx rate" smooths the same way)."""
    return max((ok_rate, *state.recent_ok[-(RATE_MEASURED_SPAN - 1) :]))


def _capacity(state: ControllerState, report: LimitReport, ok_rate: float) -> float:
    """The partner's capacity for us, as a throttled interval measures it.

    When the rate held work back, the calls went out at the rate in force, and the
    share of them that succeeded times that rate is what the partner took: a ratio
    of two counts of the same reports, so a report that missed the interval does
    not lower it, as it lowers the count of successes alone."""
    in_force = state.rate if state.rate_before is None else min(state.rate, state.rate_before)
    share = report.successes / report.calls if report.calls else 0.0
    return max(ok_rate, share * in_force)


def _next_rate(state: ControllerState, report: LimitReport, bounds: Bounds, now: float) -> tuple[ControllerState, str]:
    seconds = max(report.seconds, 1e-6)
    ok_rate = report.successes / seconds
    measured = _measured(state, ok_rate)
    state = replace(
        state,
        recent_ok=(*state.recent_ok, round(ok_rate, 2))[-(RATE_MEASURED_SPAN - 1) :],
        rate_before=round(state.rate, 3),
    )
    if report.throttles:
        just_cut = state.last_cut_at is not None and now - state.last_cut_at < 1.5 * seconds
        share = report.throttles / max(1, report.calls)
        if just_cut and share <= RATE_RECUT_SHARE:
            return state, "throttled just after a cut: hold"
        if just_cut:
            # the interval right after a cut still carried calls sent at the old rate (and the
            # partner's window still held them): what succeeded in it understates the capacity,
            # so a re-cut takes at most RATE_RECUT_DEPTH off and keeps the capacity of the cut
            # what succeeded since the cut (``recent_ok`` starts again at each cut) is a floor
            capacity = max(_capacity(state, report, ok_rate), measured)
            rate = min(state.rate, bounds.rate(max(RATE_BETA * capacity, (1 - RATE_RECUT_DEPTH) * state.rate)))
            state = replace(state, rate=rate, since_cut=0.0, last_cut_at=now, recent_ok=(round(ok_rate, 2),))
            return state, "throttled again: re-cut"
        # what succeeded says the partner's capacity only if the limit was the bottleneck;
        # otherwise the app sent less than it may, and the rate is cut from where it is
        capacity = _capacity(state, report, ok_rate) if report.held_by_rate > 0 else max(ok_rate, state.rate)
        w_max = min(state.rate, capacity)
        rate = bounds.rate(min(state.rate, RATE_BETA * capacity))
        w_max = max(w_max, bounds.min_rate)
        # a cut starts the measure again: what succeeded before it says what the partner took then
        state = replace(state, rate=rate, w_max=w_max, since_cut=0.0, last_cut_at=now, recent_ok=(round(ok_rate, 2),))
        return state, "throttled: cut"
    if report.held_by_rate <= 0:
        return state, "not the bottleneck: hold"
    cap = RATE_SUCCESS_CAP * measured
    if state.w_max is None:
        grown, rule = state.rate * RATE_START_GROWTH, "bottleneck, never throttled: slow start"
        if measured < RATE_START_CONFIRM * state.rate:
            # the last raise has not shown in what succeeded yet (the reports lag a second or
            # two): raising again would overshoot a partner's cap by the lag's growth
            grown, rule = state.rate, "bottleneck, never throttled: slow start, the last raise not seen yet"
    else:
        since = state.since_cut + seconds
        grown, rule = max(state.rate, _cubic(state.w_max, since)), "bottleneck: cubic recovery"
        if grown > state.w_max:
            past = max(1.0, since - _cubic_k())  # the probe's step grows by one every interval past the cut
            if past > RATE_STALE_AFTER:  # long past the last cut without a throttle: it says nothing any more
                grown, rule = state.rate * RATE_START_GROWTH, "bottleneck, long past the last cut: slow start"
                if measured < RATE_START_CONFIRM * state.rate:
                    grown, rule = state.rate, rule + ", the last raise not seen yet"
            else:
                step = max(state.rate, state.w_max) + RATE_PROBE_STEP * state.w_max * min(past, RATE_PROBE_STEPS)
                grown, rule = min(grown, step), "bottleneck: probing past the last cut"
        state = replace(state, since_cut=since)
        if grown > state.rate * RATE_START_GROWTH:  # never faster than the slow start
            grown, rule = state.rate * RATE_START_GROWTH, rule + ", at the slow start's pace"
    if grown > cap:
        grown, rule = max(state.rate, cap), rule + ", held to twice the measured success"
    return replace(state, rate=bounds.rate(grown)), rule


def _next_concurrency(
    state: ControllerState, report: LimitReport, bounds: Bounds, now: float
) -> tuple[ControllerState, str]:
    # a limit of a few places cannot bring many samples: it must not be stuck for want of them
    p50 = report.p50_ms(_samples_needed(state))
    conc = state.concurrency
    if p50 is not None:  # the baseline: down at once, up slowly
        probe_min = p50 if state.probe_min_ms is None else min(state.probe_min_ms, p50)
        baseline = state.baseline_ms
        if baseline is None:
            baseline = p50
        elif p50 < baseline:  # halfway down at once: one lucky interval does not set it
            baseline = (baseline + p50) / 2
        state = replace(state, baseline_ms=baseline, probe_min_ms=probe_min)
        if now - state.probe_start >= BASELINE_PERIOD:
            risen = min(probe_min, baseline * BASELINE_RISE)
            state = replace(state, baseline_ms=max(baseline, risen), probe_min_ms=None, probe_start=now)
    in_flight = max(1, report.peak_in_flight)
    used = min(conc, float(in_flight))
    if report.calls and report.errors / report.calls > ERROR_CUT:
        cut = bounds.concurrency(min(conc, max(used * ERROR_BETA, conc * MAX_CUT)))
        return replace(state, concurrency=cut, streak=0, concurrency_cut_at=now), "errors above the threshold: cut"
    if p50 is None or state.baseline_ms is None:
        return replace(state, streak=0), "too few successful calls: hold"
    baseline = state.baseline_ms
    if p50 > LATENCY_CUT * baseline:
        if state.streak == 0:
            state = replace(state, streak_p50_ms=p50, streak_peak=in_flight)
        lowest = min(state.streak_p50_ms, p50)
        streak = state.streak + 1
        at_floor = conc <= bounds.min_concurrency
        sent_less = in_flight <= 0.75 * state.streak_peak
        if streak > SLOWER_STREAK and (at_floor or (sent_less and p50 >= 0.85 * lowest)):
            state = replace(state, baseline_ms=p50, probe_min_ms=None, probe_start=now, streak=0)
            return state, "latency stayed up though fewer calls were in flight: the partner is slower, new baseline"
        if state.concurrency_cut_at is not None and now - state.concurrency_cut_at < 1.5 * report.seconds:
            return replace(
                state, streak_p50_ms=lowest
            ), "latency above the baseline just after a cut: wait for its effect"
        gradient = max(MAX_CUT, LATENCY_TARGET * baseline / p50)
        cut = bounds.concurrency(min(conc, used * gradient))
        state = replace(state, concurrency=cut, streak=streak, streak_p50_ms=lowest, concurrency_cut_at=now)
        return state, "latency above the baseline: cut"
    state = replace(state, streak=0)
    if report.throttles:
        return state, "throttled: hold (throttles are the rate's)"
    in_use = report.held_by_concurrency > 0 or in_flight >= math.floor(conc + 1e-9)
    if not in_use:
        return state, "not in use: hold"
    if p50 > LATENCY_GROW * baseline:
        return state, "latency near the threshold: hold"
    grown = bounds.concurrency(conc + max(1.0, CONCURRENCY_GROWTH * conc))
    return replace(state, concurrency=grown), "in use, latency at the baseline: grow"


def decide(state: ControllerState, report: LimitReport, bounds: Bounds, now: float) -> Decision:
    """One step of the controller: the fleet's report for the last interval in, the new limits out."""
    state = replace(state, rate=bounds.rate(state.rate), concurrency=bounds.concurrency(state.concurrency))
    # a limit of a few places cannot bring many samples: it must not be stuck for want of them
    p50 = report.p50_ms(_samples_needed(state))
    inputs = {
        "seconds": round(report.seconds, 3),
        "calls": report.calls,
        "successes": report.successes,
        "throttles": report.throttles,
        "errors": report.errors,
        "peak_in_flight": report.peak_in_flight,
        "held_by_rate": report.held_by_rate,
        "held_by_concurrency": report.held_by_concurrency,
        "p50_ms": None if p50 is None else round(p50, 2),
        "baseline_ms": None if state.baseline_ms is None else round(state.baseline_ms, 2),
        "rate_before": round(state.rate, 3),
        "concurrency_before": effective_concurrency(state, bounds),
    }
    state, rate_rule = _next_rate(state, report, bounds, now)
    state, conc_rule = _next_concurrency(state, report, bounds, now)
    return Decision(
        state=state,
        concurrency=effective_concurrency(state, bounds),
        rate=state.rate,
        rate_rule=rate_rule,
        concurrency_rule=conc_rule,
        inputs=inputs,
    )


# ---- an adaptive limit as declared and stored -------------------------------------------

#: A new adaptive rate starts at this share of ``max_rate`` (never below ``min_rate``),
#: a new adaptive concurrency at this share of ``max_concurrency``: low enough that a
#: partner smaller than the bounds is not flooded at the start, high enough that the
#: slow start (1.5x a bottleneck second) reaches the bounds in a few seconds.
START_SHARE = 0.05
#: A worker's reports no leader took are dropped after this many seconds.
REPORTS_KEPT = 60.0


@dataclass(frozen=True)
class AdaptiveSpec:
    """Which of a limit's knobs the controller sets, and the user's bounds.

    A knob that is not adaptive keeps the user's fixed value (or none): the
    controller's output for it is not written. Kept as JSON in the limit's
    row (its ``adaptive`` column), beside the controller's state."""

    concurrency: bool
    rate: bool
    bounds: Bounds

    def to_json(self) -> str:
        import json

        data = {"concurrency": self.concurrency, "rate": self.rate, **asdict(self.bounds)}
        return json.dumps(data, separators=(",", ":"), sort_keys=True)

    @staticmethod
    def from_json(text: str) -> AdaptiveSpec:
        import json

        data = dict(json.loads(text))
        auto_c, auto_r = bool(data.pop("concurrency")), bool(data.pop("rate"))
        return AdaptiveSpec(auto_c, auto_r, Bounds(**data))

    def start(self) -> tuple[int, float]:
        """A new adaptive limit's effective concurrency and rate (:data:`START_SHARE` of the upper bounds)."""
        b = self.bounds
        conc = effective_concurrency(ControllerState(0.0, b.concurrency(START_SHARE * b.max_concurrency)), b)
        return conc, b.rate(START_SHARE * b.max_rate)


def rate_text(per_second: float) -> str:
    """An effective rate as a limit's ``rate`` setting: whole starts per
    second (``"37/s"``), or per minute below one a second (``"30/m"``)."""
    if per_second >= 1.0:
        return f"{max(1, round(per_second))}/s"
    return f"{max(1, round(per_second * 60))}/m"


@dataclass(frozen=True)
class AdaptiveRow:
    """An adaptive limit as its row holds it: the spec, the effective
    values the claims obey (the row's ``concurrency`` and ``rate``) and the
    controller's state (None until the first decision)."""

    name: str
    spec: AdaptiveSpec
    concurrency: int | None
    rate: str | None
    state: ControllerState | None = None


def declared(
    old: AdaptiveRow | None, spec: AdaptiveSpec, concurrency: int | None, rate: str | None
) -> tuple[int | None, str | None]:
    """A declared adaptive limit's effective concurrency and rate: the fixed
    ``concurrency`` or ``rate`` for a knob that is not adaptive; for one that
    is, what ``old`` (the row before, if it was adaptive) had, clamped into
    the new bounds, else :meth:`AdaptiveSpec.start`'s value."""
    from corral.core.rates import parse_rate

    start_c, start_r = spec.start()
    conc: int | None = concurrency
    if spec.concurrency:
        was = old.concurrency if old is not None and old.spec.concurrency else None
        conc = int(spec.bounds.concurrency(was if was is not None else start_c))
    text: str | None = rate
    if spec.rate:
        per_second = start_r
        if old is not None and old.spec.rate and old.rate:
            try:
                per_second = parse_rate(old.rate).per_second
            except ValueError:
                pass
        text = rate_text(spec.bounds.rate(per_second))
    return conc, text


def fleet_report(reports: Iterable[tuple[str, LimitReport]], seconds: float) -> LimitReport:
    """The fleet's report over ``seconds`` from its workers' (worker id, report) pairs.

    A worker's reports arrive about once a second, not in step with the
    leader: one interval may hold two of them and the next none. So each
    worker's counts are scaled to ``seconds`` by the time its reports cover
    (at most twice, at least half), then added. A worker only knows the calls
    in flight in its own process: the fleet's peak is taken as the sum of the
    workers' peaks (an upper bound)."""
    per: dict[str, LimitReport] = {}
    for worker, report in reports:
        per[worker] = (
            per[worker].merge(replace(report, seconds=per[worker].seconds + report.seconds))
            if (worker in per)
            else report
        )
    total = LimitReport(seconds=seconds)
    peak = 0
    for report in per.values():
        factor = 1.0 if report.seconds <= 0 else min(2.0, max(0.5, seconds / report.seconds))
        total = total.merge(
            LimitReport(
                seconds=seconds,
                calls=round(report.calls * factor),
                successes=round(report.successes * factor),
                throttles=round(report.throttles * factor),
                errors=round(report.errors * factor),
                held_by_rate=report.held_by_rate,
                held_by_concurrency=report.held_by_concurrency,
                latency=report.latency,
            )
        )
        peak += report.peak_in_flight
    return replace(total, seconds=seconds, peak_in_flight=peak)


# ---- per key: a controller state for each of a keyed limit's busiest keys -----------------

#: at most this many keys of one keyed limit have a controller state of their own (the busiest);
#: the others run under the limit's own effective values
MAX_KEY_STATES = 256
#: a key's state is forgotten after this many seconds without a call under it
KEY_IDLE_FORGET = 300.0
#: at most this many keys' changes of one keyed limit are events each second (the busiest
#: keys'): a thousand keys moving at once must not flood the event stream
MAX_KEY_EVENTS = 20


@dataclass(frozen=True)
class KeyState:
    """One key's controller state, when a call last went under the key, the
    calls of the last interval that had any (how busy the key is), and when
    the keeper last changed the key's effective values (None: never)."""

    state: ControllerState
    seen: float
    calls: int = 0
    changed: float | None = None


def busiest_reports(reports: Mapping[str, LimitReport], top: int = MAX_KEY_STATES) -> dict[str, LimitReport]:
    """A worker's per-key reports cut to the ``top`` keys with the most calls
    (throttles and errors break ties, then the key): what it sends stays bounded
    however many keys it met."""

    def weight(item: tuple[str, LimitReport]) -> tuple[int, int, str]:
        key, r = item
        return (-r.calls, -(r.throttles + r.errors), key)

    return dict(sorted(reports.items(), key=weight)[: max(0, top)])


def decide_keys(
    states: Mapping[str, KeyState],
    reports: Mapping[str, LimitReport],
    bounds: Bounds,
    now: float,
    *,
    start: tuple[float, float],
    max_keys: int = MAX_KEY_STATES,
    idle: float = KEY_IDLE_FORGET,
) -> tuple[dict[str, KeyState], dict[str, Decision]]:
    """One interval of a per-key adaptive limit: each key's own controller.

    A key that had calls gets a decision from its own state, created on its
    first use from ``start`` (the limit's effective concurrency and rate, so
    a new key begins where the limit stands). A key without calls keeps its
    state until ``idle`` seconds after its last call, then it is forgotten
    (it starts again from the limit's values when it comes back). At most
    ``max_keys`` states are kept: the keys with the most calls this interval,
    then the most recently seen; a key left out has no state and runs under
    the limit's values. Returns the states kept and the decisions made."""
    conc0, rate0 = start
    active = {k: r for k, r in reports.items() if r.calls or r.successes or r.throttles or r.errors}
    ranked = sorted(
        set(active) | set(states),
        key=lambda k: (
            -(active[k].calls if k in active else -1),
            -(states[k].seen if k in states else now),
            k,
        ),
    )
    kept: dict[str, KeyState] = {}
    decisions: dict[str, Decision] = {}
    for key in ranked:
        if len(kept) >= max(0, max_keys):
            break
        if key in active:
            old = states.get(key)
            state = old.state if old is not None else initial_state(bounds, now, rate=rate0, concurrency=conc0)
            decision = decide(state, active[key], bounds, now)
            decisions[key] = decision
            kept[key] = KeyState(decision.state, now, active[key].calls, None if old is None else old.changed)
        elif now - states[key].seen < idle:
            kept[key] = states[key]
    return kept, decisions


def key_state_json(key: KeyState) -> str:
    """A key's :class:`KeyState` as its row's ``controller`` column holds it."""
    import json

    data: dict[str, Any] = {"seen": key.seen, "calls": key.calls, "state": key.state.to_dict()}
    if key.changed is not None:
        data["changed"] = key.changed
    return json.dumps(data, separators=(",", ":"))


def key_state_of(text: str | None) -> KeyState | None:
    """A key row's ``controller`` column read back (None: none, or unreadable)."""
    import json

    if not text:
        return None
    try:
        data = json.loads(text)
        changed = data.get("changed")
        return KeyState(
            ControllerState.from_dict(data["state"]),
            float(data["seen"]),
            int(data.get("calls") or 0),
            None if changed is None else float(changed),
        )
    except (ValueError, TypeError, KeyError):
        return None


def key_live(text: str | None, now: float, idle: float = KEY_IDLE_FORGET) -> bool:
    """Does a key row's ``controller`` say the key had a call in the last
    ``idle`` seconds? Such a row is kept however full its bucket is: it holds
    the key's learned values, which a missing row would not."""
    key = key_state_of(text)
    return key is not None and now - key.seen < idle
