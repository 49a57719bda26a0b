"""The completer: outcomes written in batches, off the slot threads.

A slot never waits for a write between the tasks of its unit: it puts the
outcome on the completer's queue and goes on. The completer gathers what
comes within ``window`` (5 ms for a store in another process or on a disk,
none for the in-process memory store) into one write. Three kinds of item
come through the queue, in order:

- an :class:`~corral.core.model.Outcome` to write;
- a :class:`~corral.engine.units.Unit` that ended: a unit of a group or
  under a limit frees its slot only once the outcomes before it are
  written, so the next claim already sees the group and the limit free (one
  naming a key, in a store whose keys' places never pass over: at once). In
  a store that hands places over, those ended units' successors are claimed
  in the same transaction (``Store.complete_and_claim``) and take their
  slots at once: the place never stands free;
- a :class:`~corral.engine.units.Relay`: a unit under a limit near its end
  asks for its successor early; the successor waits in its place, under
  its lease token, and takes its slot the moment it ends.

It also records, at most every :data:`START_WRITE_EVERY`, the starts of
held tasks (chunk members, prefetched or relayed units) whose bodies have
run for :data:`START_RECORD_AFTER`, so they show RUNNING within about half
a second; a shorter one's start is recorded with its outcome.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace

from corral.core.clock import Clock
from corral.core.gates import KEY_SEP
from corral.core.model import Claim, Outcome, Start, TaskRecord
from corral.core.states import State
from corral.engine.claimer import Claimer
from corral.engine.hooks import Guarded
from corral.engine.registry import Registry
from corral.engine.units import RELAY_ASKED, RELAY_CLOSED, RELAY_GIVEN, Ledger, Pace, Relay, Unit
from corral.errors import StoreError, StoreUnavailable
from corral.stores.base import Store

log = logging.getLogger("corral.worker")

#: How long the completer gathers outcomes into one write for a store in
#: another process or on a disk (none for the in-process memory store).
COMPLETER_WINDOW = 0.005
#: How long the completer waits for more ended units of no group before it
#: hands their places over: ended units of work under keyed limits come in
#: runs, and a hand-over of 8 places costs about what one of 4 does (W1 with
#: every task keyed: 4.2 places a transaction without, 8 with; 20-25 % faster).
HANDOVER_GATHER = 0.0003
#: Writing outcomes through a store outage: tries, and the longest pause between them.
_COMPLETE_TRIES = 5
_COMPLETE_MAX_PAUSE = 5.0
#: The longest pause between writes of outcomes through an outage: they
#: must land soon after it ends, before sweepers look at their leases.
_OUTAGE_PAUSE = 0.5
#: A held task's start (a chunk member, a prefetched or relayed task) is
#: recorded once its body has run this long without an outcome (a shorter one
#: records it with its outcome: no write of its own), in one write with every
#: other start due, at most once per START_WRITE_EVERY: a start shows within
#: about half a second, for a few writes a second at most.
START_RECORD_AFTER = 0.25
START_WRITE_EVERY = 0.2

Item = Outcome | Unit | Relay


class Starts:
    """Starts not recorded yet of held tasks whose bodies run (the slots
    note and drop them, the completer writes those due)."""

    def __init__(self) -> None:
        #: id -> (when due to be written, lease token, attempt, started_at)
        self._due: dict[int, tuple[float, str, int, float]] = {}
        self._lock = threading.Lock()
        self.written_at = 0.0

    def note(self, task_id: int, due: float, token: str, attempt: int, started_at: float) -> None:
        with self._lock:
            self._due[task_id] = (due, token, attempt, started_at)

    def drop(self, task_id: int) -> None:
        """The task's outcome records its start from now on."""
        with self._lock:
            self._due.pop(task_id, None)

    def wait(self) -> float:
        """How long the completer may wait for an item: until the next start
        is due to be written (or a while, for a start noted meanwhile)."""
        with self._lock:
            first = next(iter(self._due.values()), None)
        wait = START_RECORD_AFTER if first is None else first[0] - time.monotonic()
        wait = max(wait, self.written_at + START_WRITE_EVERY - time.monotonic())
        return max(0.001, wait)

    def take_due(self) -> list[Start]:
        """The starts due to be written now (none if the last write was too
        recent), taken out of the book."""
        now = time.monotonic()
        if now < self.written_at + START_WRITE_EVERY:
            return []
        with self._lock:
            due = [Start(tid, tok, n, at) for tid, (when, tok, n, at) in self._due.items() if when <= now]
            for st in due:
                del self._due[st.task_id]
        if due:
            self.written_at = now
        return due


def _ungrouped(items: Sequence[object]) -> bool:
    """Are the units among ``items`` (ended, or asking for a relay) all of no group?"""
    for x in items:
        unit = x.unit if isinstance(x, Relay) else x
        if isinstance(unit, Unit) and unit.claim.group is not None:
            return False
    return True


class Completer:
    """Writes outcomes, frees the slots of the units that ended, and passes
    places under a limit to their successors (see the module docstring)."""

    def __init__(
        self,
        store: Store,
        clock: Clock,
        hooks: Guarded,
        ledger: Ledger,
        claimer: Claimer,
        pace: Pace,
        *,
        registry: Registry,
        window: float,
    ):
        self.store = store
        self.clock = clock
        self.hooks = hooks
        self.ledger = ledger
        self.claimer = claimer
        self.pace = pace
        self.registry = registry
        #: how long outcomes are gathered into one write (see COMPLETER_WINDOW)
        self.window = window
        self.starts = Starts()
        #: outcome batches written (a drain looks again after one)
        self.writes = 0
        self._q: queue.SimpleQueue[Item] = queue.SimpleQueue()
        self._idle = threading.Event()
        self._idle.set()
        # orders "queue empty, so idle" against "not idle, then queued": without
        # it an item put in between could be written while the flag says idle
        self._gate = threading.Lock()
        self._handover_asked = float("-inf")  # when the last handover was asked (the worker clock's)

    # ---- what the other rooms ask ------------------------------------------------
    def put(self, item: Item) -> None:
        """An outcome to write, a unit whose slot frees once what came before
        it is written, or a unit near its end that asks for its successor."""
        with self._gate:
            self._idle.clear()
            self._q.put(item)

    def release(self, unit: Unit) -> None:
        """Free a unit's slot; for a group or a limit, only once its outcomes
        are in the store, so the next claim already sees them free (no empty
        claims). Other units free their slot at once. A successor relayed
        to the unit takes its slot instead."""
        successor = unit.end_relay()
        if successor is not None:
            self.ledger.pass_place(unit, successor)
            return
        first = unit.claim.tasks[0]
        if unit.claim.group is None and (not first.limits or self._free_at_once(first.limits)):
            self.ledger.settle(unit)
        else:
            self.put(unit)

    def _free_at_once(self, limits: Sequence[str]) -> bool:
        """A unit naming a key, in a store that never hands a key's place over."""
        return not self.store.keys_hand_over and any(KEY_SEP in n for n in limits)

    def hand_back(self, rest: Sequence[TaskRecord], token: str) -> None:
        """Give unstarted tasks of a unit back to the queue, attempts intact."""
        for rec in rest:
            self.put(Outcome(rec.id, token, rec.version, State.PENDING, attempt=rec.attempt))

    def hand_back_prefetched(self) -> int:
        """Give back at once the prefetched units no slot has started,
        attempts intact (their start was never recorded), rather than start
        them (a stop, a halt). Returns the tasks given back."""
        with self.ledger.cond:
            units = [u for u in self.ledger.units if u.prefetched]
        return self.hand_back_unstarted(units)

    def hand_back_unstarted(self, units: Sequence[Unit]) -> int:
        """Give back at once those of ``units`` no slot has started,
        attempts intact (a claim into a free slot counted its first task's
        attempt: that one is taken back). Returns the tasks given back."""
        given = 0
        for unit in units:
            with unit.lock:
                if unit.done or unit.lost or unit.begun >= 0:
                    continue
                unit.lost = True  # a slot that picks it up starts nothing
                unit.given_back = True
            tasks = unit.claim.tasks
            if not unit.prefetched:
                first = tasks[0]
                self.put(Outcome(first.id, unit.claim.token, first.version, State.PENDING, attempt=first.attempt - 1))
                tasks = tasks[1:]
            self.hand_back(tasks, unit.claim.token)
            given += len(unit.claim.tasks)
            # free it once the hand-back is written: not in flight means back in the queue
            self.put(unit)
        return given

    def give_back(self, successor: Unit) -> None:
        """Give a relayed successor that never started back to the queue,
        attempts intact; it leaves the units once the hand-back is written."""
        with successor.lock:
            successor.lost = successor.given_back = True
        self.hand_back(successor.claim.tasks, successor.claim.token)
        self.ledger.handed_back += len(successor.claim.tasks)
        self.put(successor)

    def flush(self, timeout: float | None) -> bool:
        """Wait until everything put so far is written; False on timeout."""
        end = None if timeout is None else time.monotonic() + timeout
        while not (self._q.empty() and self._idle.is_set()):
            if end is not None and time.monotonic() > end:
                return False
            self._idle.wait(0.01)
        return True

    # ---- the thread ---------------------------------------------------------------
    def loop(self) -> None:
        q = self._q
        window = self.window
        names = frozenset(self.registry)
        while True:
            try:
                first = q.get(timeout=self.starts.wait())
            except queue.Empty:
                self._write_starts()
                continue
            items: list[Item] = [first]
            # Gather for a moment: one write per batch, not per task. A unit
            # waiting for its slot (a marker in the queue) ends the wait.
            waiting = isinstance(items[0], (Unit, Relay))
            deadline = time.monotonic() + window
            gathered = False
            while len(items) < 512:
                try:
                    if waiting:
                        item = q.get_nowait()
                    else:
                        left = deadline - time.monotonic()
                        item = q.get(timeout=left) if left > 0 else q.get_nowait()
                except queue.Empty:
                    if waiting and not gathered and window > 0 and _ungrouped(items):
                        # the slots' next ends a moment later go in the same
                        # hand-over: one write transaction for more places
                        gathered = True
                        time.sleep(HANDOVER_GATHER)
                        continue
                    break
                items.append(item)
                waiting = waiting or isinstance(item, (Unit, Relay))
            self._write_starts()
            outcomes = [x for x in items if isinstance(x, Outcome)]
            # (a unit whose relayed successor took its place is done already)
            ended = [x for x in items if isinstance(x, Unit) and not x.lost and not x.done]
            relays = [x.unit for x in items if isinstance(x, Relay) and x.unit.relay == RELAY_ASKED]
            successors = self._hand_over(outcomes, ended, names, relays) if ended or relays else None
            if successors is None:
                if outcomes:
                    self._apply(outcomes)
            else:
                self._take_over(ended, successors)
                # the count the handover used, read again if it is due: after
                # the places passed over, not while they waited (a count is
                # a few milliseconds on PostgreSQL)
                self.claimer.tail(self.claimer.chunk())
            for x in items:
                if isinstance(x, Unit):
                    self.ledger.settle(x)
            with self._gate:
                if q.empty():
                    self._idle.set()

    def _write_starts(self) -> None:
        """Record, in one write, the starts of held tasks running for a while."""
        due = self.starts.take_due()
        if not due:
            return
        try:
            self.store.record_starts(due)
        except StoreError as exc:  # the outcomes record them; only the view waits
            log.warning("recording %d start(s) failed (%s); their outcomes record them", len(due), exc)

    def _apply(self, outcomes: list[Outcome]) -> None:
        """Write outcomes; through an outage, for as long as it lasts (each
        write is fenced by its lease token, so one that comes too late
        changes nothing, and sweepers leave leases that ran out during an
        outage to their workers for a while after it). Other errors are
        tried a few times."""
        failures = 0
        while True:
            try:
                applied = self.store.complete(outcomes)
                self.writes += 1
                break
            except StoreUnavailable as exc:
                if failures == 0:
                    log.warning(
                        "completing %d outcome(s) failed (%s); retrying until the store is back", len(outcomes), exc
                    )
                failures += 1
                time.sleep(min(_OUTAGE_PAUSE, 0.1 * 2**failures))
            except StoreError as exc:  # a bug surfaces after a few tries
                failures += 1
                if failures >= _COMPLETE_TRIES:
                    log.error("gave up writing %d outcome(s) (%s); the sweeper will recover them", len(outcomes), exc)
                    return
                log.warning("completing %d outcome(s) failed (%s); retrying", len(outcomes), exc)
                time.sleep(min(_COMPLETE_MAX_PAUSE, 0.2 * 2**failures))
        self._applied(outcomes, applied)

    def _hand_over(
        self, outcomes: list[Outcome], ended: list[Unit], names: frozenset[str], relays: Sequence[Unit] = ()
    ) -> list[Claim] | None:
        """Write the outcomes and claim the ended units' successors in one
        transaction: a place under a limit passes from one unit to the next
        with no moment free, no claim of the dispatcher's and no wait for
        the limit's lock. None when it cannot be done now (the outcomes are
        then written as usual, and the dispatcher claims): also when more
        units ended than one claim may take (a level that shrinks claims), as
        the places left over must be announced to every worker.

        ``relays`` are units near their end that asked for a successor: one
        claimed for such a unit waits in its place (:meth:`_relayed`)."""
        policy = self.hooks.dispatch()
        claimer = self.claimer
        if (
            not self.store.hands_over
            or policy.max_units is None
            or len(ended) > policy.max_units
            or not claimer.unrestricted(policy)
        ):
            self._relayed(relays, {})
            return None
        chunk = claimer.chunk()
        began = time.monotonic()
        self._handover_asked = self.clock.monotonic()
        try:
            request = replace(
                claimer.request(policy, False),
                max_units=max(1, len(ended)),
                names=names,
                chunk_size=chunk,
                tail=claimer.tail(chunk, read=False),
            )
            applied, claims = self.store.complete_and_claim(
                outcomes,
                [u.claim.tasks[0].limits for u in ended],
                claimer.id,
                request,
                relays=[(u.claim.token, u.claim.tasks[0].limits) for u in relays],
            )
        except StoreError as exc:
            log.warning("handing %d place(s) over failed (%s); writing the outcomes alone", len(ended), exc)
            self._relayed(relays, {})
            return None
        self.pace.handovers.observe(time.monotonic() - began)
        self.writes += 1
        self._applied(outcomes, applied)
        claimer.note_grouped(claims)
        tokens = {u.claim.token for u in relays}
        self._relayed(relays, {c.token: c for c in claims if c.token in tokens})
        return [c for c in claims if c.token not in tokens]

    def _relayed(self, relays: Sequence[Unit], successors: Mapping[str, Claim]) -> None:
        """Put each relayed successor in its predecessor's place: it waits
        there (held, not counted in flight) until the predecessor ends. A
        predecessor that ended meanwhile hands its place over to it now; one
        that was let go (a stop, a lost lease) gives it back."""
        for unit in relays:
            claim = successors.get(unit.claim.token)
            if claim is None:
                with unit.lock:
                    if unit.relay == RELAY_ASKED:
                        unit.relay = RELAY_CLOSED
                continue
            self.hooks.on_claims(self.claimer.id, [claim])
            successor = Unit(
                claim,
                prefetched=True,
                slot_freed=True,
                lease_until=self._handover_asked + self.claimer.lease_seconds,
            )
            with self.ledger.cond:
                self.ledger.units.add(successor)
            with unit.lock:
                waiting = unit.relay == RELAY_ASKED and not unit.lost and not unit.done
                if waiting:
                    unit.relay, unit.successor = RELAY_GIVEN, successor
            if waiting:
                continue
            with unit.lock:
                stays = not unit.lost and not unit.done
            if stays:  # it ended a moment ago: its end, still queued here, hands nothing over
                self.ledger.pass_place(unit, successor)
            else:
                self.give_back(successor)

    def _take_over(self, ended: list[Unit], claims: list[Claim]) -> None:
        """Free the ended units' slots and fill them with their successors in
        one step, so the dispatcher never counts them free meanwhile."""
        if claims:
            self.hooks.on_claims(self.claimer.id, claims)
        lease_until = self._handover_asked + self.claimer.lease_seconds
        self.ledger.take_over(ended, [Unit(c, lease_until=lease_until) for c in claims])

    def _applied(self, outcomes: list[Outcome], applied: list[bool]) -> None:
        for o, ok in zip(outcomes, applied):
            if not ok:
                log.info(
                    "task %s: late or stale outcome %s discarded",
                    o.task_id,
                    o.status.value,
                    extra={"task_id": o.task_id, "attempt": o.attempt},
                )
        self.hooks.on_outcomes(outcomes, applied)
