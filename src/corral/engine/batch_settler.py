"""Batch callbacks follow their batch's last task (see :mod:`corral.core.batches`).

:class:`BatchHooks` remembers which claimed tasks belong to a batch and,
when one of them ends, asks the store to settle that batch: the store
submits the batch's ``on_complete`` task if the batch has one and has just
reached a final status, exactly once however many workers ask together. A
task of a batch with no callback costs one small read per completed claim.
The sweeper settles every batch again on its rounds, so a callback whose
last task ended elsewhere (a cancel, a sweep) is never lost.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Collection, Sequence

from corral.core.model import Claim, Outcome
from corral.core.states import FINAL
from corral.engine.hooks import Hooks
from corral.stores.base import Store

log = logging.getLogger("corral.batches")


class BatchHooks(Hooks):
    def __init__(self, store: Store):
        self.store = store
        self._lock = threading.Lock()
        self._batch_of: dict[str, dict[int, str]] = {}  # lease token -> task id -> batch

    def on_claims(self, worker_id: str, claims: Sequence[Claim]) -> None:
        for c in claims:
            members = {t.id: t.batch for t in c.tasks if t.batch is not None}
            if members:
                with self._lock:
                    self._batch_of[c.token] = members

    def on_outcomes(self, outcomes: Sequence[Outcome], applied: Sequence[bool]) -> None:
        ended: set[str] = set()
        with self._lock:
            if not self._batch_of:
                return
            for o, ok in zip(outcomes, applied):
                members = self._batch_of.get(o.token)
                if members is None:
                    continue
                batch = members.pop(o.task_id, None)
                if not members:
                    del self._batch_of[o.token]
                if batch is not None and ok and o.status in FINAL:
                    ended.add(batch)
        if ended:
            submitted = self.store.settle_batches(ended)
            if submitted:
                log.info("batch callback(s) submitted: %s", ", ".join(map(str, submitted)))

    def on_leases_lost(self, worker_id: str, tokens: Collection[str]) -> None:
        with self._lock:
            for t in tokens:
                self._batch_of.pop(t, None)
