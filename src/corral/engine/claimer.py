"""What a worker asks for when it claims: lanes, per-queue budgets, chunks, retries.

One :class:`Claimer` per worker, used by the two threads that claim: the
dispatcher (into free slots, or ahead of them) and the completer (the
successors it claims in the write of their predecessors' outcomes, see
:meth:`corral.engine.completer.Completer`). Both must ask alike, so the
chunk size, the chunks of the end of the queued work and the retry path's
share are decided here once.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import replace

from corral.core import slots, validation
from corral.core.claims import ClaimRequest
from corral.core.model import Claim
from corral.core.pacing import tail_bound, tail_split
from corral.engine.hooks import DispatchPolicy
from corral.engine.units import Ledger, Pace, is_retry
from corral.errors import StoreError
from corral.stores.base import Store

log = logging.getLogger("corral.worker")

#: How often a worker reads the backlog for the chunks of the end of the
#: queued work (a bounded count: 2 ms on PostgreSQL at its largest), at
#: most how seldom while the last count reached its bound, and for how long
#: after a grouped claim.
TAIL_LOOK_EVERY = 0.05
TAIL_FAR_LOOK_EVERY = 0.25
TAIL_GROUPED_WITHIN = 1.0


class Claimer:
    """The claims of one worker: its queues and names, lanes of a policy,
    per-queue slots, the chunk size, and the retry share."""

    def __init__(
        self,
        store: Store,
        worker_id: str,
        queues: Sequence[str],
        *,
        concurrency: int,
        queue_slots: dict[str, int] | None,
        chunk_size: int | None,
        retry_share: float | None,
        lease_seconds: float,
        ledger: Ledger,
        pace: Pace,
        stop_claiming: threading.Event,
    ):
        self.store = store
        self.id = worker_id
        self.queues = tuple(queues)
        self.concurrency = concurrency
        #: per-queue slots (``{"default": 8, "bulk": 2}``), or None: one pool
        self.queue_slots = queue_slots
        #: None: sized by itself from the tasks' durations (see core.pacing.AutoChunk)
        self.chunk_size = chunk_size
        #: at most this share of a claim goes to retries while fresh work waits
        #: (None: retries queue with fresh work, by priority then due time)
        self.retry_share = retry_share
        self.lease_seconds = lease_seconds
        self.ledger = ledger
        self.pace = pace
        self.stop_claiming = stop_claiming
        #: when a claim last brought a group's unit (the tail's chunks follow grouped work only)
        self.grouped_at = -1.0
        #: the last claim left out a queue with no slot free (per-queue slots)
        self.full_queues = False
        self._backlog: tuple[float, int | None] = (-1.0, None)  # (read at, queued tasks) for tail_split
        self._turn = 0  # which queue asks first (per-queue slots)

    def claim(self, want: int, names: frozenset[str], policy: DispatchPolicy, *, prefetch: bool = False) -> list[Claim]:
        """One claim, or one per lane of the policy (and with per-queue slots,
        one per queue with a slot free) until ``want`` is reached."""
        template = self.request(policy, prefetch)
        if policy.lanes is None:
            lanes: tuple[tuple[tuple[str, ...], frozenset[str]], ...] = ((self.queues, names),)
        else:
            lanes = tuple(
                (
                    self.queues if lane.queues is None else tuple(q for q in self.queues if q in lane.queues),
                    names if lane.names is None else names & lane.names,
                )
                for lane in policy.lanes
            )
        chunk = self.chunk()
        tail = self.tail(chunk)
        claims: list[Claim] = []
        self.full_queues = False
        for queues, lane_names in lanes:
            if not queues or not lane_names or len(claims) >= want:
                continue
            if self.queue_slots is None:
                asks = [(queues, want - len(claims))]
            else:
                with self.ledger.cond:
                    held = self.ledger.by_queue()
                    for c in claims:  # claimed in this round, not yet counted
                        held[c.tasks[0].queue] = held.get(c.tasks[0].queue, 0) + 1
                self._turn += 1
                budgets = slots.queue_budgets(
                    slots.rotate(queues, self._turn), self.queue_slots, held, want - len(claims)
                )
                self.full_queues = self.full_queues or any(held.get(q, 0) >= self.queue_slots[q] for q in queues)
                asks = [((q,), n) for q, n in budgets]
            for ask_queues, n in asks:
                if n <= 0 or len(claims) >= want:
                    continue
                request = replace(
                    template,
                    queues=ask_queues,
                    max_units=min(n, want - len(claims)),
                    names=lane_names,
                    chunk_size=chunk,
                    tail=tail,
                )
                got = self.store.claim(self.id, request)
                claims += got
                self.note_grouped(got)
                retried = sum(1 for c in got if is_retry(c, prefetch))
                if retried:
                    template = replace(
                        template,
                        retry_cap=None if template.retry_cap is None else max(0, template.retry_cap - retried),
                        retry_max=None if template.retry_max is None else max(0, template.retry_max - retried),
                    )
        return claims

    def request(self, policy: DispatchPolicy, prefetch: bool) -> ClaimRequest:
        """The claim's options that follow from the policy and the retries
        held here (the queues, units, names, chunk and tail are the caller's)."""
        retry_cap = retry_max = None
        if self.retry_share is not None and not policy.only_retries:
            # the share bounds the retries this worker *holds*, not each claim
            slots_now = self.concurrency if policy.slots is None else min(self.concurrency, policy.slots)
            retries_held, fresh_peak = self.ledger.retry_counts()
            retry_cap = validation.held_retry_cap(slots_now, self.retry_share, retries_held)
            if fresh_peak:
                # fresh work came a moment ago: keep room for its next arrivals
                room = slots.retry_room(slots_now, self.retry_share, fresh_peak)
                retry_max = max(0, room - retries_held)
            if prefetch:
                # retries are claimed into free slots only: a retry held ahead
                # would take a turn fresh arrivals need
                retry_cap = retry_max = 0
        return ClaimRequest(
            self.queues,
            1,
            lease_seconds=self.lease_seconds,
            only_retries=policy.only_retries,
            retry_share=None if policy.only_retries else self.retry_share,
            retry_cap=retry_cap,
            retry_max=retry_max,
            prefetch=prefetch,
        )

    def unrestricted(self, policy: DispatchPolicy) -> bool:
        """Does nothing restrict what a claim may take now (no per-queue
        slots, no degradation policy's slots, lanes or retries only) while
        this worker still claims?"""
        return (
            self.queue_slots is None
            and policy.slots is None
            and policy.lanes is None
            and not policy.only_retries
            and not self.stop_claiming.is_set()
        )

    def note_grouped(self, claims: Sequence[Claim]) -> None:
        """Claims just taken: grouped work makes the tail's chunks count."""
        if any(c.group is not None for c in claims):
            self.grouped_at = time.monotonic()

    def chunk(self) -> int:
        """The chunk size the next claim asks for: the one given, or one
        sized from the durations of the tasks run here so far."""
        return self.chunk_size if self.chunk_size is not None else self.pace.tasks.size()

    def tail(self, chunk: int, *, read: bool = True) -> tuple[int, int] | None:
        """Chunks for the end of the queued work (:func:`tail_split`), for a
        worker that sizes its chunks itself and ran grouped work a moment
        ago (plain work has no chunks: no count is read for it). With
        ``read`` false the last count stands, however old: a handover must
        not wait for a count (see :class:`corral.engine.completer.Completer`)."""
        now = time.monotonic()
        if chunk <= 1 or self.chunk_size is not None or now - self.grouped_at > TAIL_GROUPED_WITHIN:
            return None
        bound = tail_bound(chunk, self.concurrency)
        read_at, backlog = self._backlog
        every = TAIL_LOOK_EVERY
        if backlog is not None and backlog >= bound:
            # far from the end: look again before a quarter of the bound can
            # have run (about a chunk's time), within these limits
            every = min(TAIL_FAR_LOOK_EVERY, max(every, chunk * (self.pace.tasks.known() or 0.0)))
        if read and now - read_at > every:
            try:
                backlog = self.store.backlog(bound)
            except StoreError as exc:
                log.debug("reading the backlog failed: %s", exc)
                backlog = None
            self._backlog = (now, backlog)
        return None if backlog is None else tail_split(chunk, backlog, self.concurrency)
