"""A claim's gates as the SQL stores read them: one reader per row kind.

The gates themselves (:class:`~corral.core.gates.Gates`: limits, rates,
pauses, breakers) are pure and live in :mod:`corral.core.gates`; this module
turns the ``limits`` and ``breakers`` rows of either dialect into them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from corral.core import breaker as brk
from corral.core.gates import BreakerRow, LimitState
from corral.core.limits import settings_from_json, settings_json
from corral.core.model import LimitSpec

#: the columns of a ``limits`` row, in the query's order (both dialects)
LIMIT_COLUMNS = (
    "name",
    "concurrency",
    "rate",
    "burst",
    "paused_until",
    "tokens",
    "counted_at",
    "starts",
    "per_key",
    "set_by",
    "declared",
    "changed_at",
)


def limit_state(row: Sequence[Any] | Mapping[str, Any]) -> LimitState:
    """A ``limits`` row (both dialects, as a tuple or by column name): its
    settings, who changed them, bucket and log of starts."""
    if isinstance(row, Mapping):
        row = [row[c] for c in LIMIT_COLUMNS]
    name, concurrency, rate, burst, paused_until, tokens, counted_at, starts = row[:8]
    per_key, set_by, declared, changed_at = (*row[8 : len(LIMIT_COLUMNS)], None, None, None, None)[:4]
    spec = LimitSpec(
        name,
        concurrency,
        rate,
        burst,
        paused_until,
        bool(per_key),
        set_by,
        settings_from_json(declared),
        changed_at,
    )
    return LimitState(spec, tokens, counted_at, starts)


def limit_params(spec: LimitSpec, changed_at: float | None) -> dict[str, Any]:
    """The ``set_limit`` statement's parameters (both dialects) for a row
    :mod:`corral.core.limits` decided; ``changed_at``: None keeps the row's."""
    return {
        "name": spec.name,
        "concurrency": spec.concurrency,
        "rate": spec.rate,
        "burst": spec.burst,
        "per_key": spec.per_key,
        "set_by": spec.set_by,
        "declared": settings_json(spec.declared),
        "changed_at": changed_at,
    }


def breaker_row(row: Sequence[Any]) -> BreakerRow:
    """A ``breakers`` row (both dialects): name, settings and state as JSON."""
    name, config, state = row[:3]
    return BreakerRow(name, brk.config_from_json(config), brk.state_from_json(state))
