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

from collections.abc import Collection, Sequence

from corral.core.model import Claim, Outcome

#: What :meth:`Hooks.dispatch_budget` returns when nothing limits dispatch.
UNLIMITED = 1 << 30


class Hooks:
    """No-op defaults; subclass and override what you need."""

    def dispatch_budget(self) -> int | None:
        """How many units the worker may claim now; ``None`` pauses dispatch."""
        return UNLIMITED

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

    def on_claims(self, worker_id: str, claims: Sequence[Claim]) -> None:
        for h in self.hooks:
            h.on_claims(worker_id, claims)

    def on_outcomes(self, outcomes: Sequence[Outcome], applied: Sequence[bool]) -> None:
        for h in self.hooks:
            h.on_outcomes(outcomes, applied)

    def on_leases_lost(self, worker_id: str, tokens: Collection[str]) -> None:
        for h in self.hooks:
            h.on_leases_lost(worker_id, tokens)
