"""The dispatcher: claims as many units as there are free slots, and a few ahead.

One thread per worker. Before each claim it reserves the slots the claim
may fill (nothing else counts them free meanwhile), asks the hooks what it
may claim now (a degradation level, a pause), and hands what it got to the
slots through the ledger's inbox. With its slots all busy it may hold up to
``prefetch`` units more, claimed so that they hold no limit's place, token
or probe and record no start (a hand-back or a crash costs them no
attempt): a freed slot then starts its next unit without waiting a claim's
round trip. Nothing is held ahead while a policy restricts what is
claimed or how many run (a level's smaller claims only make each claim
ahead smaller), per-queue slots are set or retries run here (a fresh
arrival must find a free slot), and a worker running limited tasks lets its prefetch run dry
before each claim into a free slot, so limited work is never starved by a
flow of unlimited work.

With nothing to claim it waits for work; a store that can hands a newly
submitted task over in the submit's own commit (``Store.wait_offering``).
It also keeps the count a drain reads: claims begun, and the last one that
found nothing while nothing was in flight.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from corral.core.clock import Clock
from corral.core.model import Claim
from corral.core.pacing import auto_prefetch
from corral.engine.claimer import Claimer
from corral.engine.completer import Completer
from corral.engine.hooks import DispatchPolicy, Guarded
from corral.engine.registry import Registry
from corral.engine.units import Ledger, Pace, Unit
from corral.errors import StoreCorrupt, StoreError
from corral.stores.base import Offer, Store

log = logging.getLogger("corral.worker")


class Dispatcher:
    """Claims work for one worker's slots (see the module docstring)."""

    def __init__(
        self,
        store: Store,
        registry: Registry,
        clock: Clock,
        hooks: Guarded,
        ledger: Ledger,
        claimer: Claimer,
        completer: Completer,
        pace: Pace,
        *,
        prefetch: int | None,
        poll_interval: float,
        stop_claiming: threading.Event,
        on_corrupt: Callable[[StoreCorrupt], None],
    ):
        self.store = store
        self.registry = registry
        self.clock = clock
        self.hooks = hooks
        self.ledger = ledger
        self.claimer = claimer
        self.completer = completer
        self.pace = pace
        #: units held beyond the free slots (0: claim only into free slots;
        #: None: sized by itself from the units' durations, see :attr:`prefetch`)
        self.prefetch_given = prefetch
        self.poll_interval = poll_interval
        self.stop_claiming = stop_claiming
        #: told of a store failure no retry cures, before claiming stops
        self.on_corrupt = on_corrupt
        # A worker running limited tasks lets its prefetch run dry before the
        # next claim into a free slot, which alone may take limited work: so
        # limited work is never starved by a steady flow of unlimited work.
        self._mixed = any(getattr(t, "limits", ()) for t in registry.values())
        self._prefetch_turn = True
        self._prefetch_after = 0.0  # after an empty prefetch claim, the next one waits this long
        # For a drain (under the ledger's cond): claims begun, the last one
        # that found nothing with nothing in flight, and drains waiting.
        self.claim_seq = 0
        self.quiet_seq = 0
        self.draining = 0

    @property
    def prefetch(self) -> int:
        """Units this worker may hold beyond its free slots now: the number
        given, or one sized from how long its units take (see
        :func:`corral.core.pacing.auto_prefetch`)."""
        if self.prefetch_given is not None:
            return self.prefetch_given
        return auto_prefetch(self.claimer.concurrency, self.pace.units.known())

    def idle_wait(self) -> float:
        """How long an idle dispatcher waits for work: briefly while a drain
        waits for a claim to find nothing."""
        return min(self.poll_interval, 0.02) if self.draining else self.poll_interval

    def loop(self) -> None:
        names = frozenset(self.registry)
        ledger = self.ledger
        cond = ledger.cond
        claimer = self.claimer
        concurrency = claimer.concurrency
        while not self.stop_claiming.is_set():
            policy = self.hooks.dispatch()
            if policy.max_units is None:  # paused: nothing can run now, as far as a drain is concerned
                with cond:
                    self.claim_seq += 1
                    if ledger.inflight == 0:
                        self.quiet_seq = self.claim_seq
                        cond.notify_all()
                self.store.wait_for_work(self.idle_wait())
                continue
            with cond:
                cap = concurrency if policy.slots is None else min(concurrency, policy.slots)
                free = cap - ledger.inflight
                ahead = False
                if free <= 0:
                    # slots all busy: top up the prefetch once it is half used
                    held = -free
                    if not (self._may_prefetch(policy) and held <= self.prefetch // 2):
                        cond.wait(self.poll_interval)
                        continue
                    ahead = True
                    free = self.prefetch - held
                self.claim_seq += 1
                seq = self.claim_seq
                quiet = ledger.inflight == 0  # an empty claim now means nothing here can run
                # reserve the slots this claim may fill, so nothing else
                # counts them free while the claim is under way; a level
                # that makes claims smaller than the slots (WARNING) makes
                # each claim ahead as small
                small = policy.max_units < concurrency
                want = min(free, policy.max_units) if small or not ahead else free
                ledger.inflight += want
                if not ahead:
                    self._prefetch_turn = True  # a claim into free slots opens the next prefetch
            asked = self.clock.monotonic()  # the leases of what this claim takes stand until lease_seconds after
            try:
                claims = claimer.claim(want, names, policy, prefetch=ahead)
            except StoreCorrupt as exc:  # no retry can cure it: stop claiming, let the runner exit
                self.on_corrupt(exc)
                claims = None
                log.error("claim failed, stopping: %s", exc)
                self.stop_claiming.set()
            except StoreError as exc:  # an outage must not end the worker; a bug ends it (see Worker._thread)
                claims = None
                log.warning("claim failed, will retry: %s", exc)
            except BaseException:
                with cond:  # the slots reserved for this claim are free: the stop need not wait for them
                    ledger.inflight -= want
                    cond.notify_all()
                raise
            with cond:
                ledger.inflight -= want - len(claims or ())
                if claims == [] and quiet:
                    self.quiet_seq = max(self.quiet_seq, seq)
                cond.notify_all()
            if claims is None:
                self.stop_claiming.wait(min(2.0, self.poll_interval * 4))
                continue
            if ahead:
                if claims and self._mixed:
                    # limited work waits for a claim into a free slot: let
                    # the prefetch run dry before the next one
                    self._prefetch_turn = False
                elif not claims:
                    # nothing to take ahead: look again in a while, or when a
                    # slot frees (that claim may take limited work too)
                    self._prefetch_after = time.monotonic() + self.poll_interval
                    continue
            if not claims:
                if claimer.full_queues:
                    # a queue with no slot free may hold work: a slot freeing
                    # there is not news to the store, so look again soon
                    with cond:
                        cond.wait(min(self.idle_wait(), 0.05))
                    continue
                self._wait_for_work(policy, want, names)
                continue
            self._hold(claims, asked, ahead)
            time.sleep(0)  # let the woken slots take the GIL before the next claim

    def _hold(self, claims: list[Claim], asked: float, ahead: bool) -> None:
        """Hold what a claim (or a submit's hand-over) brought, in the slots
        reserved for it, and pass it to the slots. ``asked``: when the claim
        began, the leases stand until ``lease_seconds`` after it."""
        self.hooks.on_claims(self.claimer.id, claims)
        units = [Unit(c, prefetched=ahead, lease_until=asked + self.claimer.lease_seconds) for c in claims]
        ledger = self.ledger
        ledger.hold(units)
        if ahead and self.stop_claiming.is_set():
            # stopped or halted while this prefetch was under way: its
            # units would wait for a slot in vain, give them back now
            ledger.handed_back += self.completer.hand_back_prefetched()
        elif self.stop_claiming.is_set():
            # stopped or halted while this claim was under way: what it
            # took (a place an outcome freed meanwhile, say) would start
            # after the stop, give it back instead
            ledger.handed_back += self.completer.hand_back_unstarted(units)
        for unit in units:
            ledger.inbox.put(unit)  # a unit handed back is skipped by its slot

    def _wait_for_work(self, policy: DispatchPolicy, free: int, names: frozenset[str]) -> None:
        """Wait for work. With nothing restricting what this worker takes,
        its ``free`` slots are offered meanwhile: a store that can hands a
        new plain task over in the submit's own commit (one commit, not a
        submit's and a claim's), and each such task goes to a slot at once
        while the wait goes on (the offer stays open for the next submit)."""
        timeout = self.idle_wait()
        claimer = self.claimer
        if policy.lanes is not None or policy.only_retries or claimer.queue_slots is not None or self.draining:
            self.store.wait_for_work(timeout, claimer.queues)
            return
        offer = Offer(claimer.id, claimer.queues, names, free, claimer.lease_seconds)
        # the leases of tasks handed over stand until lease_seconds after
        # their submit, which came after the offer was opened
        asked = self.clock.monotonic()

        def take(claims: list[Claim]) -> None:
            with self.ledger.cond:
                self.ledger.inflight += len(claims)  # in the slots offered, free until now
            self._hold(claims, asked, True)  # no start recorded, as for a prefetch

        self.store.wait_offering(timeout, claimer.queues, offer, take)

    def _may_prefetch(self, policy: DispatchPolicy) -> bool:
        """Claim ahead of a free slot now? Only with nothing restricting what
        the claim takes or how many run (a degradation level's fewer slots,
        lanes or retries only, per-queue slots), with no retry in flight
        here, and, for a worker running limited tasks, only once between two
        claims into free slots. A smaller claim size alone (WARNING) does
        not stop it: a level that shrinks each claim must not leave the
        slots it allows waiting for claims (each claim ahead is as small)."""
        return (
            self.prefetch > 0
            and self.claimer.unrestricted(policy)
            # while retries run here, fresh arrivals must find a free slot, not
            # a line of units held ahead (the retry path's promise)
            and self.ledger.retries_held == 0
            and self._prefetch_turn
            and time.monotonic() >= self._prefetch_after
            and (policy.max_units or 0) > 0
        )
