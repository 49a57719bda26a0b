"""Rates: how fast a limit lets tasks start. Pure arithmetic.

A limit's ``rate`` ("20/s", "6000/m", "100/h", "5/10s") is N starts a
period. Two rules carry it out:

- by default a **sliding window**: at most N starts in *any* period (any
  sliding second for "N/s"), the promise a partner's quota makes. The log of
  recent starts is kept in :data:`SLICES` slices of the period (a slice's
  starts leave the window together, when its last possible one does: never
  early, at most a slice late). Within it the starts are paced by a small
  bucket of :func:`pace` tokens refilled at the rate: they come spread over
  the period, at most a tenth of N together, not N at once and then nothing
  (a partner counts calls as they arrive, and a burst arrives spread by the
  workers' own delays: the tail of one burst and the head of the next would
  meet in one of its seconds). A claim that comes late loses nothing as long
  as the pacing bucket is not full, and the window never counts it early;
- with an explicit ``burst=B``, a plain **token bucket** of B tokens
  refilled at N a period: B may start at once, and up to B - 1 + N in one
  period. It is the opt-in for a partner that tolerates bursts; ``burst=1``
  spaces the starts evenly, a period / N apart, and a late claim's lateness
  is lost.

A store keeps the state (the bucket's two numbers, the window's log) in the
limit's row and charges it inside the claim, in the same transaction that
takes the task: every worker of the fleet draws from the one log and bucket.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass

_RATE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*/\s*(\d+(?:\.\d+)?)?\s*(s|sec|second|m|min|minute|h|hour)s?\s*$", re.I)
_UNIT = {"s": 1.0, "sec": 1.0, "second": 1.0, "m": 60.0, "min": 60.0, "minute": 60.0, "h": 3600.0, "hour": 3600.0}

#: slices a sliding window's log is kept in: a start leaves the window at most
#: period / SLICES late, so a busy limit reaches at least SLICES / (SLICES + 1)
#: of its rate, and the log stays a few hundred bytes whatever N is
SLICES = 50
#: a sliding window's pacing bucket holds this share of N (at least 2 tokens)
PACE_SHARE = 0.1
_EPS = 1e-9


@dataclass(frozen=True, slots=True)
class Rate:
    """``per_second`` starts a second on average.

    ``window`` (seconds) set: a sliding window, at most ``burst`` starts in
    any ``window`` seconds, paced by a bucket of ``pace`` tokens. None: a
    token bucket of ``burst`` tokens."""

    per_second: float
    burst: float
    window: float | None = None
    pace: float | None = None

    @property
    def bucket_size(self) -> float:
        """Tokens the bucket holds at most: the pace of a window, else the burst."""
        return self.burst if self.pace is None else self.pace

    @property
    def interval(self) -> float:
        """Seconds between two starts at the steady rate."""
        return 1.0 / self.per_second

    @property
    def slice(self) -> float:
        """A sliding window's slice, in seconds (its log's resolution)."""
        return (self.window or 0.0) / SLICES


def parse_rate(text: str, burst: int | None = None) -> Rate:
    """``"20/s"`` -> at most 20 starts in any sliding second. Also ``"N/m"``,
    ``"N/h"``, ``"N/10s"`` (any sliding minute, hour, ten seconds).

    A fractional N ("2.5/s") spaces starts evenly: one in any period / N.
    An explicit ``burst`` asks for a token bucket instead (see the module)."""
    m = _RATE.match(text or "")
    if not m:
        raise ValueError(f"cannot parse rate {text!r}: expected e.g. '100/s', '6000/m' or '20/h'")
    count, every, unit = float(m.group(1)), float(m.group(2) or 1), _UNIT[m.group(3).lower()]
    period = every * unit
    per_second = count / period
    if not math.isfinite(per_second) or per_second <= 0:
        raise ValueError(f"rate {text!r} must allow more than 0 tasks")
    if burst is not None:
        if isinstance(burst, bool) or not isinstance(burst, int) or burst < 1:
            raise ValueError(f"burst must be a whole number >= 1, not {burst!r}")
        return Rate(per_second, float(burst))
    if count == math.floor(count):
        return Rate(per_second, count, period, pace(int(count)))
    return Rate(per_second, 1.0, period / count)


def pace(n: int) -> float:
    """The pacing bucket of a window of ``n`` starts: a tenth of them, at
    least 2 (a late claim's token is kept), at most ``n``."""
    return float(min(n, max(2, math.ceil(n * PACE_SHARE - _EPS))))


@dataclass(frozen=True, slots=True)
class Bucket:
    """A bucket's state: ``tokens`` as counted at ``at`` (epoch seconds)."""

    tokens: float
    at: float

    @staticmethod
    def full(rate: Rate, now: float) -> Bucket:
        return Bucket(rate.bucket_size, now)

    def level(self, rate: Rate, now: float) -> float:
        """Tokens available at ``now`` (refilled since ``at``, capped at the bucket's size).

        A clock that went back refills nothing (never a negative refill)."""
        return min(rate.bucket_size, self.tokens + max(0.0, now - self.at) * rate.per_second)

    def take(self, rate: Rate, now: float, n: int = 1) -> tuple[int, Bucket]:
        """Take up to ``n`` whole tokens; returns how many were taken and the new state."""
        have = self.level(rate, now)
        got = max(0, min(n, int(math.floor(have + _EPS))))
        return got, Bucket(have - got, now)

    def wait(self, rate: Rate, now: float) -> float:
        """Seconds until one whole token is there (0 when one is)."""
        have = self.level(rate, now)
        return 0.0 if have >= 1.0 - _EPS else (1.0 - have) / rate.per_second


@dataclass(frozen=True, slots=True)
class Window:
    """A sliding window's log: ``slices`` of (end, starts), oldest first.

    The starts of a slice happened before its ``end`` (the end of the slice
    of the period they fell in) and count until ``end + window``: a start at
    ``t`` leaves the window after ``t + window``, never before, so no
    ``window`` seconds ever hold more than ``burst`` starts."""

    slices: tuple[tuple[float, int], ...] = ()

    def _live(self, rate: Rate, now: float) -> list[tuple[float, int]]:
        """The slices still in the window at ``now``. A slice more than a
        window ahead of ``now`` was logged before the clock was set back:
        forgotten (one window's starts may come again, once), rather than
        holding the limit shut until the clock catches up."""
        w = rate.window or 0.0
        return [(end, k) for end, k in self.slices if now - w + _EPS < end <= now + w + rate.slice and k > 0]

    def used(self, rate: Rate, now: float) -> int:
        """Starts in the window at ``now``."""
        return sum(k for _, k in self._live(rate, now))

    def room(self, rate: Rate, now: float) -> int:
        """How many may start at ``now``."""
        return max(0, int(math.floor(rate.burst + _EPS)) - self.used(rate, now))

    def take(self, rate: Rate, now: float, n: int) -> Window:
        """The log with ``n`` starts at ``now`` added (call after :meth:`room`)."""
        live = self._live(rate, now)
        end = _slice_end(rate, now)
        if live and abs(live[-1][0] - end) < rate.slice / 2:
            live[-1] = (end, live[-1][1] + n)
        elif n > 0:
            live.append((end, n))
        return Window(tuple(sorted(live)))

    def wait(self, rate: Rate, now: float) -> float:
        """Seconds until one more may start (0 when one may now)."""
        live = sorted(self._live(rate, now))
        over = sum(k for _, k in live) - int(math.floor(rate.burst + _EPS)) + 1
        for end, k in live:
            if over <= 0:
                break
            over -= k
            if over <= 0:
                return max(0.0, end + (rate.window or 0.0) - now)
        return 0.0

    def to_json(self) -> str:
        return json.dumps([[end, k] for end, k in self.slices], separators=(",", ":"))

    @staticmethod
    def from_json(text: str | None) -> Window:
        """The log stored as JSON; unreadable or missing is an empty log."""
        if not text:
            return Window()
        try:
            rows = json.loads(text)
            return Window(tuple(sorted((float(e), int(k)) for e, k in rows)))
        except (ValueError, TypeError):
            return Window()


def _slice_end(rate: Rate, now: float) -> float:
    """The end of the slice ``now`` falls in (always after ``now``)."""
    s = rate.slice
    return (math.floor(now / s + _EPS) + 1) * s
