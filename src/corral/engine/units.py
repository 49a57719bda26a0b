"""What a worker holds: units (one claim each), the tasks running, and the ledger.

A *unit* is what one claim brought: one task, or a chunk of one group's
tasks run in order. It is *in flight* while it takes one of the worker's
slots: from its claim (or its handover) until its outcomes are written or
handed back. Every room of the worker (dispatcher, slots, completer,
watchdog, heartbeat) reads and moves units through one :class:`Ledger`, so
the counts a claim is sized from are kept in one place, under one lock.
"""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from corral.core import slots
from corral.core.model import Claim, Outcome, TaskRecord
from corral.core.pacing import AutoChunk, RunningMean
from corral.engine.context import Context
from corral.engine.executors import ProcessRun

#: A unit's relay: none asked, asked of the completer, a successor waits in
#: its place, or closed (it ended first, or none came: its end hands over)
RELAY_NONE, RELAY_ASKED, RELAY_GIVEN, RELAY_CLOSED = range(4)


def is_retry(claim: Claim, prefetched: bool) -> bool:
    """Is the claim headed by a task run again after an attempt that ended?
    (A prefetched head's attempt is not raised until it starts.)"""
    return claim.tasks[0].attempt + (1 if prefetched else 0) > 1


@dataclass(eq=False)
class Unit:
    """One claim held here. Its flags are read and set under ``lock`` by the
    slot running it, the completer, the watchdog and a stop, which may all
    reach it at once."""

    claim: Claim
    done: bool = False  # accounting settled (by its slot or by the watchdog)
    lost: bool = False  # lease gone, or handed back at shutdown: start nothing more
    #: handed back before it started: the hand-back frees its slot once written
    given_back: bool = False
    slot_freed: bool = False  # its slot was replaced (a timed-out thread): not counted in flight
    begun: int = -1  # index of the last task this unit's slot committed to run
    #: claimed ahead of a free slot: the store recorded no start, not even the head's
    prefetched: bool = False
    #: chunk members started here whose start the store has not recorded yet:
    #: their outcome carries the attempt, so a chunk costs no extra write per task
    uncounted: set[int] = field(default_factory=set)
    #: until when its lease surely stands, on the worker clock's monotonic
    #: time: the lease's length after the claim or the last renewal was *asked*
    #: (the store counts it from a later moment)
    lease_until: float = float("-inf")
    #: when it was claimed (``time.monotonic``): the claim obeyed the pauses then
    claimed: float = field(default_factory=time.monotonic)
    lock: threading.Lock = field(default_factory=threading.Lock)
    #: where its relay stands (RELAY_*), and the successor waiting in its place
    relay: int = RELAY_NONE
    successor: Unit | None = None
    #: headed by a task run again after an attempt that ended (the retry path).
    #: Fixed at the claim: a prefetched head's attempt is raised when it
    #: starts, and the unit must leave the count it entered.
    retry: bool = field(init=False)

    def __post_init__(self) -> None:
        self.retry = is_retry(self.claim, self.prefetched)

    @property
    def queue(self) -> str:
        return self.claim.tasks[0].queue

    def finish(self) -> bool | None:
        """Mark the unit done exactly once: whether its slot still counts in
        flight, or None if it was done already."""
        with self.lock:
            if self.done:
                return None
            self.done = True
            return not self.slot_freed

    def end_relay(self) -> Unit | None:
        """At the unit's end: the successor waiting in its place, if one is
        there and still to run; no relay comes after this."""
        with self.lock:
            successor, self.successor = self.successor, None
            self.relay = RELAY_CLOSED
        if successor is None:
            return None
        with successor.lock:
            return None if successor.lost or successor.done else successor


@dataclass(eq=False)
class Relay:
    """The completer's cue: ``unit`` is near its end, claim its successor."""

    unit: Unit


@dataclass(eq=False)
class TaskRun:
    """One task's body running in a slot: what the watchdog, a cancel and a
    stop need to reach it."""

    unit: Unit
    record: TaskRecord
    ctx: Context
    deadline: float | None
    abandoned: bool = False
    finished: bool = False
    proc: ProcessRun | None = None
    future: Any = None
    #: written when an abandoned thread really ends (None: write nothing then)
    late_outcome: Outcome | None = None

    def cancel(self) -> None:
        """Ask the body to stop: its ctx says canceled, a child process is
        killed, a coroutine's future cancelled."""
        self.ctx._request_cancel()
        if self.proc is not None:
            self.proc.kill("cancel")
        elif self.future is not None:
            self.future.cancel()


@dataclass(eq=False)
class Pace:
    """How long this worker's work takes, as measured here: the claims are
    sized from it (chunks, prefetch) and a relay is asked early by it."""

    #: a task's body (chunk sizes, a relay's timing)
    tasks: AutoChunk = field(default_factory=AutoChunk)
    #: a unit from its first task's start to its last one's end (prefetch size)
    units: RunningMean = field(default_factory=RunningMean)
    #: a handover's write (how early a relay is asked)
    handovers: RunningMean = field(default_factory=RunningMean)


class Ledger:
    """The units held here and the slots they take.

    ``cond`` guards the counts: ``inflight`` (units that take a slot, and
    slots a claim under way reserved), the same by queue and split into
    retries and fresh work (per-queue slots and the retry path size claims
    from them), and ``units`` (every unit held, a relayed successor or a
    unit whose timed-out thread still runs included: the heartbeat renews
    their leases). Waiters on ``cond`` (a drain, a stop, a dispatcher with no
    slot free) are woken whenever a count falls.

    ``inbox`` is the line from the dispatcher and the completer to the slot
    threads. ``runs`` are the task bodies running now, ``abandoned`` those of
    them timed out whose thread still runs. ``handed_back`` counts the tasks
    a stop (or a halt) gave back to the queue.
    """

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.inflight = 0
        self.units: set[Unit] = set()
        self.inbox: queue.SimpleQueue[Unit | None] = queue.SimpleQueue()
        self.runs: dict[int, TaskRun] = {}
        self.abandoned: dict[int, TaskRun] = {}
        self.handed_back = 0
        self._by_queue: dict[str, int] = {}
        self.retries_held = 0
        self._fresh_held = 0
        self._fresh_peak = slots.RecentPeak(1.0)  # the most fresh units held in about the last second

    def count(self, unit: Unit, step: int) -> None:
        """Keep the per-queue and retry counts of units in flight (``cond`` held)."""
        q = unit.queue
        self._by_queue[q] = self._by_queue.get(q, 0) + step
        if unit.retry:
            self.retries_held += step
        else:
            self._fresh_held += step
            if step > 0:
                self._fresh_peak.note(self._fresh_held, time.monotonic())

    def by_queue(self) -> dict[str, int]:
        """Units in flight per queue, now (``cond`` held)."""
        return dict(self._by_queue)

    def retry_counts(self) -> tuple[int, int]:
        """Retries in flight, and the most fresh units held in about the last second."""
        with self.cond:
            return self.retries_held, self._fresh_peak.peak(time.monotonic())

    def hold(self, units: list[Unit]) -> None:
        """Units a claim brought, whose slots it reserved: held, counted by queue and kind."""
        with self.cond:
            self.units.update(units)
            for unit in units:
                self.count(unit, +1)

    def forget(self, unit: Unit, counted: bool) -> None:
        """Take a unit that ended out of the counts (``cond`` held)."""
        if counted:
            self.inflight -= 1
            self.count(unit, -1)
        self.units.discard(unit)

    def settle(self, unit: Unit) -> bool:
        """Mark a unit's slot free exactly once."""
        counted = unit.finish()
        if counted is None:
            return False
        with self.cond:
            self.forget(unit, counted)
            self.cond.notify_all()
        return True

    def pass_place(self, unit: Unit, successor: Unit) -> None:
        """``unit`` ended: its successor takes its slot, in one step (the
        dispatcher never sees the slot free), and the place it holds under
        its limits (the lease token they share)."""
        counted = unit.finish()
        with successor.lock:
            successor.slot_freed = False  # counted in flight from now on
        with self.cond:
            if counted is not None:
                self.forget(unit, counted)
            self.count(successor, +1)
            self.inflight += 1
            self.cond.notify_all()
        self.inbox.put(successor)

    def take_over(self, ended: list[Unit], units: list[Unit]) -> None:
        """Free the ended units' slots and fill them with ``units``, their
        successors, in one step, so the dispatcher never counts them free
        meanwhile."""
        ends = [(unit, unit.finish()) for unit in ended]
        with self.cond:
            for unit, counted in ends:
                if counted is not None:
                    self.forget(unit, counted)
            self.units.update(units)
            for unit in units:
                self.count(unit, +1)
            self.inflight += len(units)
            self.cond.notify_all()
        for unit in units:
            self.inbox.put(unit)
