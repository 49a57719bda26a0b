"""Retention: how long finished tasks are kept before they are deleted.

A policy maps a final state to an age: a task that ended in that state more
than that long ago may go (``None``: kept for ever). It is applied by the
sweeper's leader (:mod:`corral.maintenance.retention`) and by
``App.prune`` / ``corral prune``; what a store must still keep whatever its
age (what a dependent, an unfinished batch or a halted group needs) is the
store's :meth:`~corral.stores.base.Store.prune` rule.

The default keeps failures longer than successes: a success or a cancel is
seldom looked at after a week; a failure (a dead letter) is what someone
comes back to, so it stays a month.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from corral.core.states import FINAL, State
from corral.errors import ConfigError

DAY = 86400.0

#: The retention of an ``App`` that does not say otherwise.
DEFAULT_RETENTION: dict[State, float | None] = {
    State.SUCCESS: 7 * DAY,
    State.CANCELED: 7 * DAY,
    State.FAILED: 30 * DAY,
    State.TIMEOUT: 30 * DAY,
}

#: What ``App.prune`` and ``corral prune`` remove unless told which states:
#: never a dead letter (FAILED, TIMEOUT) unless asked by name.
DEFAULT_PRUNE_STATES: tuple[State, ...] = (State.SUCCESS, State.CANCELED)

_FINAL_NAMES = ", ".join(s.value for s in State if s in FINAL)


def final_state(value: Any, option: str) -> State:
    """A final state named by ``value`` (``"success"`` or ``State.SUCCESS``); ConfigError otherwise."""
    if isinstance(value, State):
        state = value
    elif isinstance(value, str):
        try:
            state = State(value.strip().upper())
        except ValueError:
            raise ConfigError(f"{option}: unknown state {value!r} (finished states: {_FINAL_NAMES})") from None
    else:
        raise ConfigError(f"{option}: a state name is a string, not {type(value).__name__}")
    if state not in FINAL:
        raise ConfigError(f"{option}: only finished tasks are pruned ({_FINAL_NAMES}), not {state.value}")
    return state


def final_states(values: Iterable[Any] | str | State, option: str) -> tuple[State, ...]:
    """The final states named by ``values`` (one name, or several), without repeats."""
    if isinstance(values, str | State):
        values = [values]
    out: list[State] = []
    for v in values:
        s = final_state(v, option)
        if s not in out:
            out.append(s)
    if not out:
        raise ConfigError(f"{option}: name at least one state ({_FINAL_NAMES})")
    return tuple(out)


def age(value: Any, option: str) -> float:
    """Seconds in an age: a number of seconds, or ``"7d"``, ``"12h"``, ``"30m"``, ``"90s"``.

    Must be more than 0: an age of 0 would delete a task the moment it ends,
    before anyone could read its result."""
    from corral.core.planning import parse_duration

    if isinstance(value, bool):
        raise ConfigError(f"{option} must be an age like '7d', '12h' or seconds, not {value!r}")
    try:
        seconds = parse_duration(value)
    except (ValueError, TypeError):
        raise ConfigError(f"{option} must be an age like '7d', '12h' or seconds, not {value!r}") from None
    if seconds <= 0:
        raise ConfigError(f"{option} must be more than 0, not {value!r}")
    return seconds


def policy(value: Mapping[Any, Any] | bool | None) -> dict[State, float]:
    """The retention asked by ``App(retention=...)``, as state -> age in seconds.

    ``True`` (the default): :data:`DEFAULT_RETENTION`. ``False`` or ``None``:
    keep everything. A mapping changes the default state by state, e.g.
    ``{"SUCCESS": "1d"}`` keeps successes a day and the rest as by default;
    an age of ``None`` keeps that state for ever."""
    if value is None or value is False:
        return {}
    merged: dict[State, float | None] = dict(DEFAULT_RETENTION)
    if value is not True:
        if not isinstance(value, Mapping):
            raise ConfigError(
                "retention must be True, False or a mapping of state to age, "
                f"e.g. {{'SUCCESS': '7d'}}, not {type(value).__name__}"
            )
        for key, ttl in value.items():
            state = final_state(key, "retention")
            merged[state] = None if ttl is None else age(ttl, f"retention[{state.value}]")
    return {s: ttl for s, ttl in merged.items() if ttl is not None}


def cutoffs(ages: Mapping[State, float], now: float) -> dict[str, float]:
    """Per state name, the finish time before which a task may go."""
    return {s.value: now - ttl for s, ttl in ages.items()}


def describe(ages: Mapping[State, float]) -> str:
    """``SUCCESS 7d, FAILED 30d`` (or ``off``)."""
    from corral.core.planning import format_duration

    if not ages:
        return "off"
    return ", ".join(f"{s.value} {format_duration(ttl)}" for s, ttl in sorted(ages.items(), key=lambda kv: kv[1]))
