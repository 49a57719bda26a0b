"""The last hour, minute by minute: what the dashboard's charts and alerts read. Pure.

A sampler feeds it (running and queue depth each second, the tasks that
finished since its last look); it keeps one bucket per minute for an hour and
forgets older ones, so its size never grows with the store. The alert rules
mirror ``docs/alerts.yml`` over that hour (Prometheus keeps a week: the
"usual" P99 here is the hour's, before the last ten minutes).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from corral.core.stats import percentile

STEP = 60.0
WINDOW = 3600.0
#: Durations kept per minute (a p99 from this many is exact enough to chart).
MAX_DURATIONS = 5000

#: Thresholds of docs/alerts.yml.
RUNNING_OVER_LIMIT_FOR = 300.0
QUEUE_DEPTH_LIMIT = 500
QUEUE_DEPTH_FOR = 600.0
SUCCESS_RATE_MIN = 0.95
RATE_WINDOW = 600.0
P99_FACTOR = 2.0


@dataclass(slots=True)
class _Bucket:
    running: int = 0
    depth: int = 0
    sampled: bool = False
    ok: int = 0
    bad: int = 0
    durations: list[float] = field(default_factory=list)
    #: the p99 of ``durations`` when they were this many (-1: not yet)
    p99_of: int = -1
    p99: float | None = None

    def duration_p99(self) -> float | None:
        """The p99 of its durations, sorted again only when they changed (a
        closed minute's never do)."""
        if self.p99_of != len(self.durations):
            self.p99, self.p99_of = percentile(self.durations, 0.99), len(self.durations)
        return self.p99


@dataclass(frozen=True, slots=True)
class Point:
    at: float  # the minute's start, epoch seconds
    running: int | None
    depth: int | None
    success_rate: float | None
    p99: float | None


@dataclass(frozen=True, slots=True)
class Alert:
    name: str
    firing: bool
    summary: str


class Series:
    """Per-minute buckets of the last hour."""

    def __init__(self) -> None:
        self._buckets: dict[int, _Bucket] = {}
        self._depth_over_since: float | None = None
        self._limit_over_since: dict[str, float] = {}
        self._first_sample: float | None = None
        #: durations added so far, and the window p99s computed at a count:
        #: a tick asks for the same windows every second, and sorting an hour of
        #: durations (up to 300 000) each time cost a busy fleet's dashboard
        #: tens of milliseconds a second
        self._added = 0
        self._p99s: dict[tuple[int, int], tuple[int, float | None]] = {}

    def _bucket(self, at: float) -> _Bucket:
        return self._buckets.setdefault(int(at // STEP), _Bucket())

    def _forget(self, now: float) -> None:
        oldest = int((now - WINDOW) // STEP)
        for k in [k for k in self._buckets if k <= oldest]:
            del self._buckets[k]

    def sample(
        self, now: float, running: int, depth: int, limits: Mapping[str, tuple[int, int | None]] | None = None
    ) -> None:
        """Record the live gauges (the minute keeps its latest), and how long each threshold has been crossed.

        ``limits``: per limit name, (claims running, concurrency or None)."""
        b = self._bucket(now)
        b.running, b.depth, b.sampled = running, depth, True
        if self._first_sample is None:
            self._first_sample = now
        if depth > QUEUE_DEPTH_LIMIT:
            self._depth_over_since = self._depth_over_since if self._depth_over_since is not None else now
        else:
            self._depth_over_since = None
        limits = limits or {}
        for name, (used, cap) in limits.items():
            if cap is not None and used > cap:
                self._limit_over_since.setdefault(name, now)
            else:
                self._limit_over_since.pop(name, None)
        for name in [n for n in self._limit_over_since if n not in limits]:
            del self._limit_over_since[name]
        self._forget(now)

    def finished(self, rows: Iterable[tuple[str, float | None, float]]) -> None:
        """Count finished tasks: (state, started_at, finished_at) each."""
        for state, started, done in rows:
            b = self._bucket(done)
            if state == "SUCCESS":
                b.ok += 1
            elif state in ("FAILED", "TIMEOUT"):
                b.bad += 1
            else:
                continue  # canceled: an operator's choice, neither success nor failure
            if started is not None and len(b.durations) < MAX_DURATIONS:
                b.durations.append(max(0.0, done - started))
                self._added += 1

    def wants_durations(self, at: float) -> bool:
        """Whether the minute of ``at`` keeps more durations (past
        :data:`MAX_DURATIONS` it only counts)."""
        b = self._buckets.get(int(at // STEP))
        return b is None or len(b.durations) < MAX_DURATIONS

    def counted(self, counts: Iterable[tuple[float, str, int]]) -> None:
        """Count finished tasks without their durations: (a time in their
        minute, state, how many) each, for a minute that keeps no more."""
        for at, state, n in counts:
            b = self._bucket(at)
            if state == "SUCCESS":
                b.ok += n
            elif state in ("FAILED", "TIMEOUT"):
                b.bad += n

    def points(self, now: float) -> list[Point]:
        """One point per minute of the last hour, oldest first (None where nothing was seen)."""
        self._forget(now)
        last = int(now // STEP)
        out = []
        for k in range(last - int(WINDOW // STEP) + 1, last + 1):
            b = self._buckets.get(k)
            if b is None:
                out.append(Point(k * STEP, None, None, None, None))
                continue
            n = b.ok + b.bad
            out.append(
                Point(
                    k * STEP,
                    b.running if b.sampled else None,
                    b.depth if b.sampled else None,
                    b.ok / n if n else None,
                    b.duration_p99(),
                )
            )
        return out

    def _window(self, start: float, end: float) -> tuple[int, int, list[float]]:
        """Totals of the minutes after the one holding ``start``, up to the one holding ``end``."""
        lo, hi = int(start // STEP), int(end // STEP)
        ok = bad = 0
        durations: list[float] = []
        for k, b in self._buckets.items():
            if lo < k <= hi:
                ok += b.ok
                bad += b.bad
                durations += b.durations
        return ok, bad, durations

    def success_rate(self, now: float, seconds: float = RATE_WINDOW) -> float | None:
        ok, bad, _ = self._window(now - seconds, now)
        return ok / (ok + bad) if ok + bad else None

    def _window_p99(self, start: float, end: float) -> float | None:
        key = (int(start // STEP), int(end // STEP))
        kept = self._p99s.get(key)
        if kept is not None and kept[0] == self._added:
            return kept[1]
        value = percentile(self._window(start, end)[2], 0.99)
        if len(self._p99s) > 16:  # the windows of minutes gone
            self._p99s.clear()
        self._p99s[key] = (self._added, value)
        return value

    def p99(self, now: float, seconds: float = RATE_WINDOW) -> float | None:
        return self._window_p99(now - seconds, now)

    def usual_p99(self, now: float) -> float | None:
        """The P99 of the hour before the last ten minutes: what "usual" means here."""
        return self._window_p99(now - WINDOW, now - RATE_WINDOW)

    def alerts(self, now: float) -> list[Alert]:
        """The four rules of docs/alerts.yml, firing or not."""
        over = sorted(n for n, t in self._limit_over_since.items() if now - t >= RUNNING_OVER_LIMIT_FOR)
        depth_for = now - self._depth_over_since if self._depth_over_since is not None else 0.0
        rate = self.success_rate(now)
        p99, usual = self.p99(now), self.usual_p99(now)
        return [
            Alert(
                "CorralRunningAboveLimit",
                bool(over),
                f"more tasks run than limit {', '.join(over)} allows, for 5 minutes"
                if over
                else "every limit is honoured",
            ),
            Alert(
                "CorralQueueBacklog",
                depth_for >= QUEUE_DEPTH_FOR,
                f"over {QUEUE_DEPTH_LIMIT} tasks waiting for {depth_for / 60:.0f} minutes"
                if depth_for
                else f"queue depth under {QUEUE_DEPTH_LIMIT + 1}",
            ),
            Alert(
                "CorralSuccessRateLow",
                rate is not None and rate < SUCCESS_RATE_MIN,
                "no task finished in 10 minutes" if rate is None else f"{rate:.1%} succeeded over 10 minutes",
            ),
            Alert(
                "CorralP99DurationHigh",
                p99 is not None and usual is not None and usual > 0 and p99 > P99_FACTOR * usual,
                "not enough history yet"
                if p99 is None or usual is None
                else f"P99 {p99:.3g}s over 10 minutes, usual {usual:.3g}s",
            ),
        ]
