"""Retention: the sweeper leader's step that deletes old finished tasks.

Like Oban's Pruner and river's job cleaner: after each sweep the leader
deletes the tasks the policy (:mod:`corral.core.retention`) lets go, in
bounded batches (:data:`PRUNE_BATCH` rows per statement, at most
:data:`PRUNE_ROUNDS` statements per tick), so workers' claims and
completions go on between them and a backlog of months is worked off over a
few ticks rather than in one long transaction. What a store keeps whatever
its age is :meth:`corral.stores.base.Store.prune`'s rule.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from corral.core.retention import cutoffs, describe
from corral.core.states import State
from corral.stores.base import Store

log = logging.getLogger("corral.retention")

#: Tasks deleted per statement, and statements per tick at most.
PRUNE_BATCH = 1_000
PRUNE_ROUNDS = 20


def prune(store: Store, before: Mapping[str, float], *, batch: int = PRUNE_BATCH, rounds: int | None = None) -> int:
    """Delete what ``before`` (state name -> finish cut-off) lets go, ``batch``
    rows per statement, until a statement finds fewer (or after ``rounds``
    statements); returns how many went."""
    gone = 0
    n = 0
    while rounds is None or n < rounds:
        got = store.prune(before, batch)
        gone += got
        n += 1
        if got < batch:
            break
    return gone


class Retention:
    """Apply ``ages`` (final state -> seconds kept) to ``store``; :meth:`tick`
    runs after each sweep of the leader."""

    def __init__(
        self,
        store: Store,
        ages: Mapping[State, float],
        *,
        batch: int = PRUNE_BATCH,
        rounds: int = PRUNE_ROUNDS,
    ):
        self.store = store
        self.ages = dict(ages)
        self.batch = batch
        self.rounds = rounds
        #: tasks this process has deleted
        self.pruned = 0

    def __repr__(self) -> str:
        return f"Retention({describe(self.ages)})"

    def tick(self) -> int:
        """One bounded pass; returns how many tasks went."""
        if not self.ages:
            return 0
        gone = prune(self.store, cutoffs(self.ages, self.store.now()), batch=self.batch, rounds=self.rounds)
        if gone:
            self.pruned += gone
            log.info("retention removed %d finished task(s) (%s)", gone, describe(self.ages))
        return gone
