"""Summary statistics shared by batch summaries, benchmarks and reports."""

from __future__ import annotations

import math
from collections.abc import Sequence


def percentile(values: Sequence[float], q: float, *, presorted: bool = False) -> float | None:
    """The nearest-rank ``q`` quantile (0 < q <= 1) of ``values``; None when empty.

    Nearest rank returns a value that was really observed: the p99 of 100
    durations is the 99th smallest, never an interpolation between two."""
    if not values:
        return None
    s = values if presorted else sorted(values)
    idx = min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))
    return s[idx]
