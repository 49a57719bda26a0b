"""The one seam between the engine and what steers or watches it.

A worker knows three things: a registry of task definitions, a store, and one
:class:`Hooks` object. Flow control plugs in through :meth:`Hooks.dispatch_budget`
(degradation levels and breakers decide how much may be claimed now);
metrics and the event stream plug in through the ``on_*`` callbacks. A hook
never changes a task: the store's guarded writes stay the only way to do that.

Callbacks run on the worker's own threads (dispatcher, completer, heartbeat),
so they must be quick and must not raise; an error in one is logged and
dropped, never allowed to stop the worker.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Sequence
from dataclasses import dataclass

from corral.core.model import Claim, Outcome

log = logging.getLogger("corral.worker")

#: What :meth:`Hooks.dispatch_budget` returns when nothing limits dispatch.
UNLIMITED = 1 << 30


@dataclass(frozen=True, slots=True)
class Lane:
    """Part of what a worker may claim: its queues within ``queues`` and its
    task names within ``names`` (None: no restriction)."""

    queues: frozenset[str] | None = None
    names: frozenset[str] | None = None

    def __and__(self, other: Lane) -> Lane:
        def both(a: frozenset[str] | None, b: frozenset[str] | None) -> frozenset[str] | None:
            return b if a is None else a if b is None else a & b

        return Lane(both(self.queues, other.queues), both(self.names, other.names))


@dataclass(frozen=True, slots=True)
class DispatchPolicy:
    """What the dispatcher may claim now (see :meth:`Hooks.dispatch`)."""

    #: units per claim; None pauses dispatch
    max_units: int | None = UNLIMITED
    #: units in flight at most (None: the worker's concurrency)
    slots: int | None = None
    #: claim only tasks waiting to be retried (``ClaimRequest(only_retries=True)``)
    only_retries: bool = False
    #: claim only from these lanes, in order (None: everything the worker runs)
    lanes: tuple[Lane, ...] | None = None


#: The policy that restricts nothing.
OPEN = DispatchPolicy()


class Hooks:
    """No-op defaults; subclass and override what you need."""

    def dispatch_budget(self) -> int | None:
        """How many units the worker may claim now; ``None`` pauses dispatch."""
        return UNLIMITED

    def dispatch(self) -> DispatchPolicy:
        """What the worker may claim now; asked before every claim.

        The default is :meth:`dispatch_budget` alone, so a hook that only
        caps the claim size overrides that; one that also restricts what is
        claimed (retries only, critical work only, fewer slots) overrides this."""
        return DispatchPolicy(self.dispatch_budget())

    def on_claims(self, worker_id: str, claims: Sequence[Claim]) -> None:
        """Units were just claimed by ``worker_id``."""

    def on_outcomes(self, outcomes: Sequence[Outcome], applied: Sequence[bool]) -> None:
        """Outcomes were written; ``applied[i]`` is False when one was stale."""

    def on_leases_lost(self, worker_id: str, tokens: Collection[str]) -> None:
        """The store says this worker no longer holds these leases."""


class HookChain(Hooks):
    """Several hooks as one: the smallest budget wins; every callback runs."""

    def __init__(self, *hooks: Hooks):
        self.hooks = tuple(hooks)

    def dispatch_budget(self) -> int | None:
        budget: int | None = UNLIMITED
        for h in self.hooks:
            b = h.dispatch_budget()
            if b is None:
                return None
            budget = min(budget, b) if budget is not None else b
        return budget

    def dispatch(self) -> DispatchPolicy:
        """Every restriction at once: the smallest budget and slots, retries
        only if any says so, and only what every hook's lanes allow."""
        max_units: int | None = UNLIMITED
        slots: int | None = None
        only_retries = False
        lanes: tuple[Lane, ...] | None = None
        for h in self.hooks:
            p = h.dispatch()
            if p.max_units is None:
                return DispatchPolicy(None)
            max_units = p.max_units if max_units is None else min(max_units, p.max_units)
            if p.slots is not None:
                slots = p.slots if slots is None else min(slots, p.slots)
            only_retries = only_retries or p.only_retries
            if p.lanes is not None:
                lanes = p.lanes if lanes is None else tuple(a & b for a in lanes for b in p.lanes)
        return DispatchPolicy(max_units, slots, only_retries, lanes)

    def on_claims(self, worker_id: str, claims: Sequence[Claim]) -> None:
        for h in self.hooks:
            h.on_claims(worker_id, claims)

    def on_outcomes(self, outcomes: Sequence[Outcome], applied: Sequence[bool]) -> None:
        for h in self.hooks:
            h.on_outcomes(outcomes, applied)

    def on_leases_lost(self, worker_id: str, tokens: Collection[str]) -> None:
        for h in self.hooks:
            h.on_leases_lost(worker_id, tokens)


class Guarded:
    """The hooks as the engine calls them: a hook that raises is logged and
    ignored, never allowed to stop the worker (watching the work must never
    stop it); a ``dispatch`` that raises restricts nothing."""

    def __init__(self, hooks: Hooks):
        self.hooks = hooks

    def dispatch(self) -> DispatchPolicy:
        try:
            return self.hooks.dispatch()
        except Exception:  # noqa: BLE001 - a watcher's bug must not stop the work
            log.exception("hook dispatch failed")
            return OPEN

    def on_claims(self, worker_id: str, claims: Sequence[Claim]) -> None:
        try:
            self.hooks.on_claims(worker_id, claims)
        except Exception:  # noqa: BLE001
            log.exception("hook on_claims failed")

    def on_outcomes(self, outcomes: Sequence[Outcome], applied: Sequence[bool]) -> None:
        try:
            self.hooks.on_outcomes(outcomes, applied)
        except Exception:  # noqa: BLE001
            log.exception("hook on_outcomes failed")

    def on_leases_lost(self, worker_id: str, tokens: Collection[str]) -> None:
        try:
            self.hooks.on_leases_lost(worker_id, tokens)
        except Exception:  # noqa: BLE001
            log.exception("hook on_leases_lost failed")
