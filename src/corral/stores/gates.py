"""A claim's gates as the SQL stores read them: one reader per row kind.

The gates themselves (:class:`~corral.core.gates.Gates`: limits, rates,
pauses, breakers) are pure and live in :mod:`corral.core.gates`; this module
turns the ``limits`` and ``breakers`` rows of either dialect into them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from corral.core import breaker as brk
from corral.core.gates import BreakerRow, LimitState
from corral.core.model import LimitSpec

#: the columns of a ``limits`` row, in the query's order (both dialects)
LIMIT_COLUMNS = ("name", "concurrency", "rate", "burst", "paused_until", "tokens", "counted_at", "starts")


def limit_state(row: Sequence[Any] | Mapping[str, Any]) -> LimitState:
    """A ``limits`` row (both dialects, as a tuple or by column name): its
    settings, bucket and log of starts."""
    if isinstance(row, Mapping):
        row = [row[c] for c in LIMIT_COLUMNS]
    name, concurrency, rate, burst, paused_until, tokens, counted_at, starts = row[: len(LIMIT_COLUMNS)]
    return LimitState(LimitSpec(name, concurrency, rate, burst, paused_until), tokens, counted_at, starts)


def breaker_row(row: Sequence[Any]) -> BreakerRow:
    """A ``breakers`` row (both dialects): name, settings and state as JSON."""
    name, config, state = row[:3]
    return BreakerRow(name, brk.config_from_json(config), brk.state_from_json(state))
