"""Degradation levels: one fleet-wide dial from NORMAL to EMERGENCY. Pure.

========  ============  ========================================================
L0        NORMAL        everything runs
L1        WARNING       smaller claims (half the slots per claim, every slot
                        still runs and units are still held ahead), an alert
L2        DEGRADED      half the concurrency, and only queues or task kinds marked
                        critical
L3        CIRCUIT_OPEN  fresh work paused: only retries run
L4        EMERGENCY     nothing is dispatched until an operator resumes
========  ============  ========================================================

The level is computed from health signals (:func:`target_level`) by the
sweeper leader and kept in the store; workers follow it. It steps up at once
and down one level per calm period (:func:`step`, ``Thresholds.calm_period``),
so a flapping signal does not flap the fleet. A level set by hand stays until
handed back; the first evaluation after that goes straight to what the signals
call for, whatever the level was (EMERGENCY included): handing back means
"what the signals say now", not "start stepping down from here".
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

#: Seconds the signals must stay below the level before it steps down one
#: level (the pace of an automatic step down; ``App(level_calm_period=)``).
CALM_PERIOD = 60.0

#: ``calm_since`` of a level just handed back to the automatic rules: the next
#: evaluation sets the level the signals call for, up or down, at once.
HANDED_BACK = -math.inf


class Level(enum.IntEnum):
    NORMAL = 0
    WARNING = 1
    DEGRADED = 2
    CIRCUIT_OPEN = 3
    EMERGENCY = 4

    def __str__(self) -> str:
        """``L2 DEGRADED``: what ``print(app.level())`` shows (it stays an int to compare)."""
        return f"L{self.value} {self.name}"

    @classmethod
    def parse(cls, text: str | int | Level) -> Level:
        """``"DEGRADED"``, ``"degraded"``, ``"L2"`` or ``2``."""
        if isinstance(text, Level):
            return text
        if isinstance(text, int) and not isinstance(text, bool):
            return cls(text)
        t = str(text).strip().upper()
        if len(t) == 2 and t[0] == "L" and t[1].isdigit() and int(t[1]) in cls._value2member_map_:
            return cls(int(t[1]))
        try:
            return cls[t]
        except KeyError:
            names = ", ".join(f"{lv.name} (L{lv.value})" for lv in cls)
            raise ValueError(f"unknown level {text!r}; one of {names}") from None


@dataclass(frozen=True, slots=True)
class Signals:
    """What the leader measures, over its last look."""

    #: distinct task kinds whose recent outcomes are failures in a row
    failing_kinds: int = 0
    open_breakers: int = 0
    queue_depth: int = 0
    queue_bound: int | None = None
    #: leases lost (workers crashed or hung) per minute
    lease_losses_per_min: float = 0.0


@dataclass(frozen=True, slots=True)
class Thresholds:
    warn_failing_kinds: int = 2
    degrade_failing_kinds: int = 3
    open_failing_kinds: int = 5
    warn_depth_ratio: float = 0.8
    degrade_lease_losses_per_min: float = 5.0
    #: seconds the signals must stay below a level before stepping down one
    calm_period: float = CALM_PERIOD


def target_level(s: Signals, t: Thresholds = Thresholds()) -> Level:
    """The level the signals call for right now (never EMERGENCY: that is an
    operator's call, or a worse signal than these can judge)."""
    if s.failing_kinds >= t.open_failing_kinds:
        return Level.CIRCUIT_OPEN
    if (
        s.failing_kinds >= t.degrade_failing_kinds
        or s.lease_losses_per_min >= t.degrade_lease_losses_per_min
        or s.open_breakers >= 2
    ):
        return Level.DEGRADED
    depth_high = s.queue_bound is not None and s.queue_depth >= t.warn_depth_ratio * s.queue_bound
    if s.failing_kinds >= t.warn_failing_kinds or s.open_breakers >= 1 or depth_high:
        return Level.WARNING
    return Level.NORMAL


@dataclass(frozen=True, slots=True)
class LevelState:
    level: Level = Level.NORMAL
    #: set by hand: automatic steps leave it alone until handed back ("auto")
    manual: bool = False
    #: since when the target has stayed below ``level`` (None: it has not;
    #: :data:`HANDED_BACK`: just handed back, go to the target at once)
    calm_since: float | None = None
    reason: str = ""


def step(cur: LevelState, target: Level, now: float, t: Thresholds = Thresholds()) -> LevelState:
    """Move toward ``target``: up at once, down one level after a calm period.

    A level set by hand is left alone. One just handed back goes to ``target``
    at once; so does an EMERGENCY no longer held by hand (the rules never set
    it, so it is left over from a hand-back)."""
    if cur.manual:
        return cur
    if cur.calm_since == HANDED_BACK or cur.level is Level.EMERGENCY:
        return LevelState(target, False, None, f"handed back; signals call for {target.name}")
    if target > cur.level:
        return LevelState(target, False, None, f"signals call for {target.name}")
    if target == cur.level:
        return LevelState(cur.level, False, None, cur.reason) if cur.calm_since is not None else cur
    if cur.calm_since is None:
        return LevelState(cur.level, False, now, cur.reason)
    if now - cur.calm_since >= t.calm_period:
        down = Level(cur.level - 1)
        return LevelState(down, False, now if target < down else None, f"calm for {t.calm_period:g}s")
    return cur


@dataclass(frozen=True, slots=True)
class Dispatch:
    """What a worker may claim at a level."""

    max_units: int | None  # per claim; None pauses dispatch
    slots: int  # slots usable at this level
    only_critical: bool = False
    only_retries: bool = False


def dispatch_at(level: Level, concurrency: int) -> Dispatch:
    if level is Level.NORMAL:
        return Dispatch(concurrency, concurrency)
    if level is Level.WARNING:
        return Dispatch(max(1, concurrency // 2), concurrency)
    if level is Level.DEGRADED:
        half = max(1, concurrency // 2)
        return Dispatch(half, half, only_critical=True)
    if level is Level.CIRCUIT_OPEN:
        return Dispatch(max(1, concurrency // 2), concurrency, only_retries=True)
    return Dispatch(None, 0)
