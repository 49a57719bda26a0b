"""A claim's gates as the SQL stores read them: one reader per row kind.

The gates themselves (:class:`~corral.core.gates.Gates`: limits, rates,
pauses, breakers) are pure and live in :mod:`corral.core.gates`; this module
turns the ``limits`` and ``breakers`` rows of either dialect into them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from corral.core import breaker as brk
from corral.core.gates import BreakerRow, LimitState
from corral.core.model import LimitSpec


def limit_state(row: Sequence[Any]) -> LimitState:
    """A ``limits`` row (both dialects): its settings, bucket and log of starts."""
    name, concurrency, rate, burst, paused_until, tokens, counted_at, starts = row[:8]
    return LimitState(LimitSpec(name, concurrency, rate, burst, paused_until), tokens, counted_at, starts)


def breaker_row(row: Sequence[Any]) -> BreakerRow:
    """A ``breakers`` row (both dialects): name, settings and state as JSON."""
    name, config, state = row[:3]
    return BreakerRow(name, brk.config_from_json(config), brk.state_from_json(state))
