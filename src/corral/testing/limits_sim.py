"""A discrete-event simulation of a fleet calling a partner under one limit.

Nothing runs for real and nothing sleeps: one event queue on simulated time,
seeded, so a run is the same every time and a minute of it takes a fraction
of a second. It is how the adaptive limit controller (:mod:`corral.core.adaptive`)
is tested over many seeds, and what a benchmark can replay.

- **The partner** has a hidden rate (a token bucket, by default of a tenth of a
  second's calls; a call beyond it is throttled at once, a 429) and a hidden
  concurrency cap (that many calls served at once, the rest wait in line, so
  latency rises past the cap; a line four caps long refuses more, an error).
  Both, its unloaded latency and the traffic of **another client** sharing
  it change over time, in :class:`Phase` steps. The other client's calls
  always count against the quota (they come first), so a client that sends
  too much cannot take the other's share, only be throttled.
- **The app** has work always waiting, none (idle), or arriving at a rate.
- **The limit** starts calls as a store would charge it: at most the
  effective concurrency in flight, at the effective rate (a token bucket of
  a tenth of a second's starts).
- **N workers** each count their calls in a
  :class:`~corral.core.adaptive.ReportAccumulator` and report about once a
  second, each at its own moment; **the leader** merges what arrived and
  runs the controller once a second, as the sweeper's leader would.

:func:`simulate` returns per-second figures (:class:`Run`) that tests and
benchmarks read.
"""

from __future__ import annotations

import heapq
import math
import random
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from corral.core.adaptive import (
    Bounds,
    ControllerState,
    LimitReport,
    ReportAccumulator,
    decide,
    fleet_report,
    initial_state,
)

#: seconds between two samples of what is in flight (the mean in flight and the partner's line)
SAMPLE_EVERY = 0.05
#: how long a throttle or a refusal takes to come back
REFUSAL_SECONDS = 0.005
#: the partner's line refuses more calls beyond this many concurrency caps
QUEUE_CAPS = 4


@dataclass(frozen=True)
class Phase:
    """The world from ``at`` seconds on. ``rate`` and ``cap`` None mean no such limit at the partner;
    ``demand`` is the app's new work a second (``math.inf``: work always waiting, 0: idle); ``burst``
    how many seconds of its rate the partner's quota lets through at once."""

    at: float
    rate: float | None = 100.0
    cap: int | None = None
    latency_ms: float = 50.0
    background: float = 0.0
    demand: float = math.inf
    burst: float = 0.1
    #: the quota as the benchmark's partner keeps it: at most ``rate`` calls in any sliding
    #: second (a burst of a whole second's calls at once, then none until they leave the window)
    sliding: bool = False


class Controller(Protocol):
    """What sets the limit: its starting values, then new ones from each merged report."""

    def start(self, now: float) -> tuple[int, float]: ...

    def step(self, report: LimitReport, now: float) -> tuple[int, float]: ...


class AdaptiveController:
    """The adaptive controller as the leader runs it: state in, state out (kept as its JSON record)."""

    def __init__(self, bounds: Bounds, rate: float | None = None, concurrency: float | None = None):
        self.bounds = bounds
        self._rate, self._concurrency = rate, concurrency
        self.record: dict[str, object] = {}
        self.decisions: list[dict[str, object]] = []

    def start(self, now: float) -> tuple[int, float]:
        state = initial_state(self.bounds, now, rate=self._rate, concurrency=self._concurrency)
        self.record = state.to_dict()
        return int(self.bounds.concurrency(math.floor(state.concurrency))), state.rate

    def step(self, report: LimitReport, now: float) -> tuple[int, float]:
        decision = decide(ControllerState.from_dict(self.record), report, self.bounds, now)
        self.record = decision.state.to_dict()
        self.decisions.append(decision.explanation)
        return decision.concurrency, decision.rate


class FixedController:
    """A fixed limit, for comparison."""

    def __init__(self, concurrency: int, rate: float):
        self.concurrency, self.rate = concurrency, rate

    def start(self, now: float) -> tuple[int, float]:
        return self.concurrency, self.rate

    def step(self, report: LimitReport, now: float) -> tuple[int, float]:
        return self.concurrency, self.rate


@dataclass
class Run:
    """Per-second figures of one simulated run (index = second)."""

    phases: Sequence[Phase]
    successes: list[int]
    throttles: list[int]
    errors: list[int]
    calls: list[int]
    in_flight: list[float]  # mean of our calls in flight
    waiting: list[float]  # mean calls waiting in the partner's line (every client's)
    latencies: list[list[float]]  # our successful calls' latencies (ms), by the second they ended
    concurrency: list[int]  # effective limits during the second
    rate: list[float]
    decisions: list[dict[str, object]] = field(default_factory=list)

    def _span(self, start: float, end: float | None) -> range:
        last = len(self.successes) if end is None else min(len(self.successes), int(end))
        return range(int(start), last)

    def throughput(self, start: float = 0, end: float | None = None) -> float:
        """Our successful calls a second over [start, end)."""
        span = self._span(start, end)
        return sum(self.successes[i] for i in span) / max(1, len(span))

    def throttled_share(self, start: float = 0, end: float | None = None) -> float:
        span = self._span(start, end)
        calls = sum(self.calls[i] for i in span)
        return sum(self.throttles[i] for i in span) / max(1, calls)

    def total(self, what: str, start: float = 0, end: float | None = None) -> int:
        series: list[int] = getattr(self, what)
        return sum(series[i] for i in self._span(start, end))

    def mean_in_flight(self, start: float = 0, end: float | None = None) -> float:
        span = self._span(start, end)
        return sum(self.in_flight[i] for i in span) / max(1, len(span))

    def p50_ms(self, start: float = 0, end: float | None = None) -> float:
        values = sorted(v for i in self._span(start, end) for v in self.latencies[i])
        return values[len(values) // 2] if values else math.nan

    def overloaded_seconds(self, start: float = 0, end: float | None = None) -> int:
        """Seconds the partner's line made a call wait more than half its unloaded latency, or refused calls."""
        count = 0
        for i in self._span(start, end):
            cap = self.phase_at(i).cap
            if (cap is not None and self.waiting[i] > 0.5 * cap) or self.errors[i] > 0.05 * max(1, self.calls[i]):
                count += 1
        return count

    def phase_at(self, second: float) -> Phase:
        current = self.phases[0]
        for phase in self.phases:
            if phase.at <= second:
                current = phase
        return current


class _Bucket:
    __slots__ = ("rate", "span", "size", "tokens", "at")

    def __init__(self, rate: float, now: float, span: float = 0.1):
        self.rate, self.at, self.span = rate, now, span
        self.size = max(1.0, rate * span)
        self.tokens = self.size

    def set_rate(self, rate: float, now: float) -> None:
        self.refill(now)
        self.rate, self.size = rate, max(1.0, rate * self.span)
        self.tokens = min(self.tokens, self.size)

    def refill(self, now: float) -> None:
        self.tokens = min(self.size, self.tokens + (now - self.at) * self.rate)
        self.at = now

    def take(self, now: float) -> bool:
        self.refill(now)
        if self.tokens >= 1.0 - 1e-9:
            self.tokens = max(0.0, self.tokens - 1.0)
            return True
        return False

    def charge(self, now: float) -> None:
        """Take a token even if there is none: the bucket owes it (at most a bucket's worth)."""
        self.refill(now)
        self.tokens = max(-self.size, self.tokens - 1.0)

    def due(self) -> float:
        """When the next token will be there."""
        return self.at + max(0.0, 1.0 - self.tokens) / self.rate + 1e-6


class _Window:
    """The benchmark partner's quota: at most ``rate`` accepted calls in any sliding second."""

    __slots__ = ("rate", "recent")

    def __init__(self, rate: float):
        self.rate = rate
        self.recent: deque[float] = deque()

    def _drop(self, now: float) -> None:
        while self.recent and self.recent[0] <= now - 1.0:
            self.recent.popleft()

    def take(self, now: float) -> bool:
        self._drop(now)
        if len(self.recent) >= self.rate:
            return False
        self.recent.append(now)
        return True

    def charge(self, now: float) -> None:
        self._drop(now)
        self.recent.append(now)


def _quota(phase: Phase, now: float) -> _Bucket | _Window | None:
    if phase.rate is None:
        return None
    return _Window(phase.rate) if phase.sliding else _Bucket(phase.rate, now, phase.burst)


# event kinds
_START, _DONE, _SERVED, _BACKGROUND, _ARRIVAL, _REPORT, _CONTROL, _PHASE, _SAMPLE = range(9)


def simulate(
    phases: Sequence[Phase],
    controller: Controller,
    *,
    seconds: float,
    seed: int,
    workers: int = 2,
    latency_spread: float = 0.2,
    report_lag: float = 0.0,
) -> Run:
    """Run ``controller`` against the partner of ``phases`` for ``seconds`` of simulated time.

    ``report_lag`` > 0 is a loaded machine: each worker's report is taken up to that
    many seconds after its moment (uniformly, each time anew), so one leader's
    interval may hold two reports of a worker and the next none, as for real; the
    leader then merges them as the keeper does (:func:`fleet_report`)."""
    rng = random.Random(seed)
    lag_rng = random.Random(seed + 1_000_003)  # the reports' lag does not move the other draws
    n = int(math.ceil(seconds))
    run = Run(
        phases=list(phases),
        successes=[0] * n,
        throttles=[0] * n,
        errors=[0] * n,
        calls=[0] * n,
        in_flight=[0.0] * n,
        waiting=[0.0] * n,
        latencies=[[] for _ in range(n)],
        concurrency=[0] * n,
        rate=[0.0] * n,
    )
    events: list[tuple[float, int, int, Any]] = []
    seq = 0

    def push(at: float, kind: int, data: Any = None) -> None:
        nonlocal seq
        seq += 1
        heapq.heappush(events, (at, seq, kind, data))

    phase = phases[0]
    partner_bucket = _quota(phase, 0.0)
    serving = 0
    line: list[tuple[int, float]] = []  # (call id or -1 for the other client, sent at)
    line_head = 0

    concurrency, rate = controller.start(0.0)
    ours = _Bucket(rate, 0.0)
    in_flight = 0
    backlog = math.inf if phase.demand == math.inf else 0.0
    wake_at = math.inf
    accumulators = [ReportAccumulator(0.0) for _ in range(workers)]
    inbox: list[tuple[str, LimitReport]] = []
    call_worker: dict[int, int] = {}
    call_sent: dict[int, float] = {}
    next_call = 0
    samples_in_flight = [0] * n
    samples_waiting = [0] * n
    samples = [0] * n

    def service_time() -> float:
        return phase.latency_ms / 1000.0 * rng.lognormvariate(0.0, latency_spread)

    def arrive_at_partner(call: int, now: float) -> None:
        """A call reaches the partner: throttled, refused, served or put in line."""
        nonlocal serving
        if call < 0 and partner_bucket is not None:  # the other client's calls always count
            partner_bucket.charge(now)
        elif partner_bucket is not None and not partner_bucket.take(now):
            push(now + REFUSAL_SECONDS, _DONE, (call, "throttle"))
            return
        if phase.cap is None or serving < phase.cap:
            serving += 1
            push(now + service_time(), _SERVED, call)
        elif len(line) - line_head >= QUEUE_CAPS * phase.cap:
            push(now + REFUSAL_SECONDS, _DONE, (call, "error"))
        else:
            line.append((call, now))

    def try_start(now: float) -> None:
        nonlocal in_flight, backlog, wake_at, next_call
        while backlog >= 1:
            if in_flight >= concurrency:
                accumulators[next_call % workers].held("concurrency")
                return
            if not ours.take(now):
                accumulators[next_call % workers].held("rate")
                due = ours.due()
                if due < wake_at or wake_at <= now:
                    wake_at = due
                    push(due, _START)
                return
            backlog -= 1
            call = next_call
            next_call += 1
            in_flight += 1
            worker = call % workers
            call_worker[call] = worker
            call_sent[call] = now
            accumulators[worker].started(in_flight)
            second = int(now)
            if second < n:
                run.calls[second] += 1
            arrive_at_partner(call, now)

    def finish(call: int, outcome: str, now: float) -> None:
        nonlocal in_flight, backlog
        if call < 0:
            return
        in_flight -= 1
        acc = accumulators[call_worker.pop(call)]
        sent = call_sent.pop(call)
        second = int(now)
        if outcome == "ok":
            latency = (now - sent) * 1000.0
            acc.succeeded(latency)
            if second < n:
                run.successes[second] += 1
                run.latencies[second].append(latency)
        elif outcome == "throttle":
            acc.throttled()
            backlog += 1  # the task waits and runs again, no attempt burned
            if second < n:
                run.throttles[second] += 1
        else:
            acc.failed()
            backlog += 1
            if second < n:
                run.errors[second] += 1
        try_start(now)

    for p in phases[1:]:
        push(p.at, _PHASE, p)
    push(0.0, _BACKGROUND)
    push(0.0, _ARRIVAL)
    for w in range(workers):
        push(0.8 + 0.15 * w / workers + lag_rng.uniform(0.0, report_lag), _REPORT, (w, 0.8 + 0.15 * w / workers))
    push(1.0, _CONTROL, 0.0)
    push(0.0, _SAMPLE)
    try_start(0.0)

    while events:
        now, _, kind, data = heapq.heappop(events)
        if now >= seconds:
            break
        if kind == _SERVED:
            call = data
            serving -= 1
            if line_head < len(line) and (phase.cap is None or serving < phase.cap):
                nxt, _sent = line[line_head]
                line_head += 1
                if line_head > 1024:
                    del line[:line_head]
                    line_head = 0
                serving += 1
                push(now + service_time(), _SERVED, nxt)
            finish(call, "ok", now)
        elif kind == _DONE:
            call, outcome = data
            finish(call, outcome, now)
        elif kind == _START:
            if now >= wake_at:
                wake_at = math.inf
            try_start(now)
        elif kind == _BACKGROUND:
            if phase.background > 0:
                arrive_at_partner(-1, now)
                push(now + rng.expovariate(phase.background), _BACKGROUND)
            else:
                push(now + 0.1, _BACKGROUND)
        elif kind == _ARRIVAL:
            if phase.demand == math.inf:
                backlog = math.inf
                push(now + 0.1, _ARRIVAL)
            elif phase.demand > 0:
                backlog = 1 if backlog == math.inf else backlog + 1
                push(now + rng.expovariate(phase.demand), _ARRIVAL)
            else:
                if backlog == math.inf:
                    backlog = 0
                push(now + 0.1, _ARRIVAL)
            try_start(now)
        elif kind == _REPORT:
            w, moment = data
            inbox.append((str(w), accumulators[w].take(now)))
            moment += 1.0
            push(moment + lag_rng.uniform(0.0, report_lag), _REPORT, (w, moment))
        elif kind == _CONTROL:
            last = data
            if report_lag > 0:
                report = fleet_report(inbox, now - last)
            else:
                report = LimitReport.merged((r for _w, r in inbox), seconds=now - last)
            inbox.clear()
            concurrency, rate = controller.step(report, now)
            ours.set_rate(rate, now)
            push(now + 1.0, _CONTROL, now)
            try_start(now)
        elif kind == _PHASE:
            phase = data
            if phase.rate is None:
                partner_bucket = None
            elif isinstance(partner_bucket, _Window) and phase.sliding:
                partner_bucket.rate = phase.rate  # the calls already in the window still count
            elif isinstance(partner_bucket, _Bucket) and not phase.sliding:
                partner_bucket.span = phase.burst
                partner_bucket.set_rate(phase.rate, now)
            else:
                partner_bucket = _quota(phase, now)
            while phase.cap is not None and serving < phase.cap and line_head < len(line):
                nxt, _sent = line[line_head]
                line_head += 1
                serving += 1
                push(now + service_time(), _SERVED, nxt)
        elif kind == _SAMPLE:
            second = int(now)
            if second < n:
                samples[second] += 1
                samples_in_flight[second] += in_flight
                samples_waiting[second] += len(line) - line_head
                run.concurrency[second] = concurrency
                run.rate[second] = rate
            push(now + SAMPLE_EVERY, _SAMPLE)
    for i in range(n):
        if samples[i]:
            run.in_flight[i] = samples_in_flight[i] / samples[i]
            run.waiting[i] = samples_waiting[i] / samples[i]
    run.decisions = list(getattr(controller, "decisions", []))
    return run


def over_seeds(make: Callable[[int], Run], seeds: Sequence[int]) -> list[Run]:
    """One run per seed."""
    return [make(seed) for seed in seeds]
