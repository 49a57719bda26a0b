"""Token buckets: how fast a limit lets tasks start. Pure arithmetic.

A limit's ``rate`` ("100/s", "6000/m", "20/h") refills a bucket of at most
``burst`` tokens; starting a task takes one. The state is two numbers
(tokens, when they were counted), so a store keeps it in the limit's row
and charges it inside the claim, in the same transaction that takes the
task: every worker of the fleet draws from the one bucket.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

_RATE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*/\s*(\d+(?:\.\d+)?)?\s*(s|sec|second|m|min|minute|h|hour)s?\s*$", re.I)
_UNIT = {"s": 1.0, "sec": 1.0, "second": 1.0, "m": 60.0, "min": 60.0, "minute": 60.0, "h": 3600.0, "hour": 3600.0}


@dataclass(frozen=True, slots=True)
class Rate:
    """``per_second`` tokens a second, at most ``burst`` saved up."""

    per_second: float
    burst: float

    @property
    def interval(self) -> float:
        """Seconds between two tokens at the steady rate."""
        return 1.0 / self.per_second


def parse_rate(text: str, burst: int | None = None) -> Rate:
    """``"100/s"`` -> 100 tokens a second. Also ``"N/m"``, ``"N/h"``, ``"N/10s"``.

    The default burst is one second's worth of tokens (at least 1): a rate of
    100/s may start 100 tasks at once after a quiet spell, never more."""
    m = _RATE.match(text or "")
    if not m:
        raise ValueError(f"cannot parse rate {text!r}: expected e.g. '100/s', '6000/m' or '20/h'")
    count, every, unit = float(m.group(1)), float(m.group(2) or 1), _UNIT[m.group(3).lower()]
    per_second = count / (every * unit)
    if not math.isfinite(per_second) or per_second <= 0:
        raise ValueError(f"rate {text!r} must allow more than 0 tasks")
    if burst is None:
        burst_f = max(1.0, per_second)
    else:
        if isinstance(burst, bool) or not isinstance(burst, int) or burst < 1:
            raise ValueError(f"burst must be a whole number >= 1, not {burst!r}")
        burst_f = float(burst)
    return Rate(per_second, burst_f)


@dataclass(frozen=True, slots=True)
class Bucket:
    """A bucket's state: ``tokens`` as counted at ``at`` (epoch seconds)."""

    tokens: float
    at: float

    @staticmethod
    def full(rate: Rate, now: float) -> Bucket:
        return Bucket(rate.burst, now)

    def level(self, rate: Rate, now: float) -> float:
        """Tokens available at ``now`` (refilled since ``at``, capped at the burst).

        A clock that went back refills nothing (never a negative refill)."""
        return min(rate.burst, self.tokens + max(0.0, now - self.at) * rate.per_second)

    def take(self, rate: Rate, now: float, n: int = 1) -> tuple[int, Bucket]:
        """Take up to ``n`` whole tokens; returns how many were taken and the new state."""
        have = self.level(rate, now)
        got = max(0, min(n, int(math.floor(have + 1e-9))))
        return got, Bucket(have - got, now)

    def wait(self, rate: Rate, now: float) -> float:
        """Seconds until one whole token is there (0 when one is)."""
        have = self.level(rate, now)
        return 0.0 if have >= 1.0 - 1e-9 else (1.0 - have) / rate.per_second
