"""What a claim asks for, and the planner that decides what it takes.

A claim (see the claim rules in :mod:`corral.stores.base`) is asked for with
one :class:`ClaimRequest`, written once and passed whole from the worker to
the store. :class:`ClaimPlanner` is the claim's policy, pure: given the
candidates in claim order (a store reads them from its heaps or its indexes)
it decides which may head a unit (the head rule, the gates of limits, rates,
pauses and breakers, a prefetch's and a relay's restrictions, the retry
path's share), which of a group's following tasks go with it as a chunk, and
what the gates charge. The store reads and writes; the planner never does.

PostgreSQL decides the same rules inside one statement (``claim`` in
``stores/sql/postgres.sql``); the conformance suite holds the three stores
to the same answers.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import NamedTuple

from corral.core.gates import KEY_SEP, Gates
from corral.core.model import DEFAULT_LEASE_SECONDS
from corral.core.pacing import chunk_reach, line_chunk
from corral.core.pauses import Paused
from corral.core.validation import retry_bounds


@dataclass(frozen=True, slots=True)
class ClaimRequest:
    """One claim's options (see :meth:`corral.stores.base.Store.claim`).

    ``queues`` are kept sorted and unique, ``names`` (the task names the
    worker knows; None: any) as a frozen set."""

    queues: tuple[str, ...]
    max_units: int = 1
    names: frozenset[str] | None = None
    chunk_size: int = 1
    lease_seconds: float = DEFAULT_LEASE_SECONDS
    #: only RETRYING tasks (the CIRCUIT_OPEN level)
    only_retries: bool = False
    #: the retry path's share of a claim, and the worker's bounds on it
    retry_share: float | None = None
    retry_cap: int | None = None
    retry_max: int | None = None
    #: units held ahead of a free slot: no limit, no breaker, no start recorded
    prefetch: bool = False
    #: ``(short, long)`` near the end of the queued work (:func:`corral.core.pacing.tail_split`)
    tail: tuple[int, int] | None = None

    def __post_init__(self) -> None:
        queues = self.queues
        if not (isinstance(queues, tuple) and all(a < b for a, b in zip(queues, queues[1:]))):
            object.__setattr__(self, "queues", tuple(sorted(set(queues))))
        if self.names is not None and not isinstance(self.names, frozenset):
            object.__setattr__(self, "names", frozenset(self.names))
        if self.tail is not None and not isinstance(self.tail, tuple):
            object.__setattr__(self, "tail", tuple(self.tail))

    def units(self, max_units: int) -> ClaimRequest:
        """The same request for ``max_units`` units."""
        return replace(self, max_units=max_units)

    @property
    def chunk(self) -> int:
        return max(1, int(self.chunk_size))

    def retry_bounds(self) -> tuple[int | None, int]:
        """(the most retry units taken while fresh work is claimable, None:
        no share; the most taken in all): see :func:`corral.core.validation.retry_bounds`."""
        share = None if self.only_retries else self.retry_share
        return retry_bounds(self.max_units, share, self.retry_cap, self.retry_max)

    def knows(self, name: str) -> bool:
        """Does the worker know the task name ``name``?"""
        return self.names is None or name in self.names


class Candidate(NamedTuple):
    """A queued task as the planner reads it (a head candidate or a chunk
    follower). A named tuple: a claim makes one per row it reads."""

    id: int
    name: str
    queue: str
    group: str | None
    limits: frozenset[str]
    retrying: bool
    #: due (``run_at`` has come); a follower that is not ends a chunk
    due: bool = True
    #: still queued (PENDING or RETRYING); a follower that is not ends a chunk
    queued: bool = True


#: the limits of a candidate that names none
NO_LIMITS: frozenset[str] = frozenset()


def turn_key(c: Candidate) -> str | None:
    """The key ``c`` waits its turn under in a claim: its first keyed limit's
    name (``limit + KEY_SEP + key``, the least in name order), or None (no
    key, or a grouped task: its group serves it in turn)."""
    if c.group is not None or not c.limits:
        return None
    best = None
    for n in c.limits:
        if KEY_SEP in n and (best is None or n < best):
            best = n
    return best


class ClaimPlanner:
    """One claim's decisions over the candidates a store reads.

    ``gates`` builds the claim's :class:`~corral.core.gates.Gates` when first
    needed (reading the limits' and breakers' rows costs a store a query);
    ``breakers`` maps each task name or limit under a breaker to whether it
    is CLOSED; ``relay`` (a relay's successor: the limits whose places its
    running predecessor passes on) admits only work naming no other limit
    and no breaker. ``dry`` plans without chunks (a look that only asks
    whether anything can be claimed). ``paused`` (the pauses by hand the
    store read in the claim's transaction) shuts out every task of a paused
    queue or group, or naming a paused limit.

    A store reads candidates in claim order, drops those :meth:`shut_out`
    says no to, and offers each head it may take (its own checks done) to
    :meth:`try_head`, through :meth:`run` (the retry path's share); the
    claims are :attr:`units`, what they charge is in :attr:`gates`."""

    def __init__(
        self,
        request: ClaimRequest,
        gates: Callable[[], Gates],
        breakers: Mapping[str, bool],
        *,
        relay: frozenset[str] | None = None,
        dry: bool = False,
        paused: Paused | None = None,
    ):
        self.request = request
        self.paused = paused if paused else None
        self._make_gates = gates
        self._breakers = breakers
        self.relay = relay
        self.dry = dry
        self.gates: Gates | None = None
        self.units: list[list[Candidate]] = []
        cap, most = request.retry_bounds()
        self.retry_cap = cap
        self.retry_most = most
        self._closed: set[tuple[frozenset[str], str]] = set()
        #: keys served in this pass of the claim, and the candidates waiting for the next pass
        self._served: set[str] = set()
        self._later: list[tuple[Candidate, bool]] = []
        self._waiting: dict[str, int] = {}  # key -> its candidates in _later
        self._chunk = 0 if dry else request.chunk
        if self._chunk > 1:
            far = chunk_reach(self._chunk)
            self._far = far if request.tail is None else max(far, request.tail[1])

    # ---- the gates ------------------------------------------------------------
    def the_gates(self) -> Gates:
        if self.gates is None:
            self.gates = self._make_gates()
        return self.gates

    def shut_out(self, c: Candidate) -> bool:
        """True when ``c`` cannot head a unit of this claim whatever comes
        before it: a name or state not asked for, a limit or a breaker not
        CLOSED under prefetch (an idle unit must not hold a limit's place, a
        token or a probe), work a relay may not pass its places to, or gates
        that are shut (they only close further as the claim takes places and
        tokens). A store may skip working out such a candidate's place in
        the order."""
        req = self.request
        if (req.names is not None and c.name not in req.names) or (req.only_retries and not c.retrying):
            return True
        if self.paused is not None and self.paused.holds(c.queue, c.group, c.limits):
            return True
        limits, breakers = c.limits, self._breakers
        if self.relay is not None and (c.name in breakers or not limits <= self.relay):
            return True
        if not limits and c.name not in breakers:
            return False
        if req.prefetch and (limits or not breakers[c.name]):
            return True
        gate = (limits, c.name)
        if gate in self._closed:  # most heads behind a full limit name the same limits
            return True
        if self.the_gates().fits(limits, c.name):
            return False
        self._closed.add(gate)
        return True

    def admits(self, c: Candidate) -> bool:
        """May ``c`` head a unit now (after :meth:`shut_out` let it through,
        with the places this claim took since)?"""
        return (not c.limits and c.name not in self._breakers) or self.the_gates().fits(c.limits, c.name)

    # ---- a head and its chunk -------------------------------------------------
    def try_head(self, c: Candidate, read_line: Callable[[Candidate, int], Sequence[Candidate]]) -> bool:
        """Take a unit headed by ``c`` if its gates let it start now (a store
        has checked what only it knows: that ``c`` is still its group's
        head). ``read_line(c, far)`` reads the group's following tasks still
        in its line, in order, at most ``far`` (only called for a chunk).
        True when taken."""
        gated = bool(c.limits) or c.name in self._breakers
        if gated and not self.the_gates().fits(c.limits, c.name):
            return False  # the places this claim took since the candidate was read
        far = self.reach(c, gated)
        members = self.chunk(c, read_line(c, far)) if far else [c]
        self.take(members, gated)
        return True

    def reach(self, head: Candidate, gated: bool | None = None) -> int:
        """How far the line of ``head``'s group must be read for
        :meth:`chunk`: 0 when the unit is ``head`` alone (no group, chunks of
        one, a dry look, or a unit under a rate or a probing breaker, each of
        whose starts is charged)."""
        if head.group is None or self._chunk <= 1:
            return 0
        if gated is None:
            gated = bool(head.limits) or head.name in self._breakers
        if gated and self.the_gates().solo(head.limits, head.name):
            return 0
        return self._far

    def chunk(self, head: Candidate, line: Sequence[Candidate]) -> list[Candidate]:
        """The unit headed by ``head``: with the tasks of ``line`` that go
        with it (its group's following tasks still in the line, in order,
        read as far as :meth:`reach`, when it is not 0). Chunk members are due, queued tasks
        of the head's queue, of known names, under no pause, no breaker and no limit
        the head's gates do not let through (none under prefetch; under a
        relay, only its limits); a group whose whole line fits in a chunk's
        reach goes in one chunk."""
        members = [head]
        if not line:
            return members
        req = self.request
        size = line_chunk(req.chunk, len(line) + 1, req.tail)
        reach = chunk_reach(size)
        lims = set(head.limits)
        for f in line[: size - 1] if len(line) >= reach else line:
            if not f.queued or not f.due or f.queue != head.queue:
                break
            if not req.knows(f.name) or f.name in self._breakers or (req.prefetch and f.limits):
                break
            if req.only_retries and not f.retrying:
                break
            if self.paused is not None and self.paused.holds(f.queue, f.group, f.limits):
                break
            more = f.limits - lims
            if self.relay is not None and not more <= self.relay:
                break
            if more:
                g = self.the_gates()
                if not g.fits(more, "") or g.solo(more, ""):
                    break
            lims |= more
            members.append(f)
        return members

    def take(self, members: list[Candidate], gated: bool = True) -> None:
        """Record the unit ``members`` (its head first): charge its gates."""
        head = members[0]
        if gated or len(members) > 1:
            lims = head.limits if len(members) == 1 else frozenset().union(*(m.limits for m in members))
            if lims or head.name in self._breakers:
                self.the_gates().take(lims, head.name)
        self.units.append(members)

    # ---- the retry path -------------------------------------------------------
    def run(
        self,
        fresh: Iterator[Candidate],
        retries: Iterator[Candidate] | None,
        try_take: Callable[[Candidate], bool],
        rank: Callable[[Candidate], tuple],
    ) -> None:
        """Take units in claim order until the request's ``max_units``,
        serving keys in turn.

        ``fresh`` yields candidates in claim order (retries among them when
        ``retries`` is None: no retry path apart); ``retries`` the retry
        path's, merged by ``rank`` with fresh work, taking at most the retry
        cap while fresh work is claimable and, once it runs short, the rest
        up to the most retries a claim takes. ``try_take`` tries one head
        (the store's own checks, then :meth:`try_head`) and says whether it
        was taken.

        **Keys in turn.** A key (:func:`turn_key`) heads at most one unit in
        a pass: a candidate of a key already served waits, in claim order,
        for the next pass, which begins once the candidates run out. A hot
        key's backlog in front thus takes one unit of a claim, and every
        other key with room one, before it takes a second."""
        goal = 1 if self.dry else self.request.max_units
        cap = self.retry_cap
        taken = 0  # retries taken

        def offer(c: Candidate, retry: bool) -> bool:
            key = turn_key(c)
            if key is not None and key in self._served:
                # a key heads at most a unit a pass: no more of its candidates
                # wait than the claim could still take
                n = self._waiting.get(key, 0)
                if n < self._could_take(key, goal):
                    self._waiting[key] = n + 1
                    self._later.append((c, retry))
                return False
            if not try_take(c):
                return False
            if key is not None:
                self._served.add(key)
            return True

        if retries is None or cap is None:
            for c in fresh:
                if len(self.units) >= goal:
                    return
                offer(c, False)
            self._next_passes(goal, offer, None)
            return
        if self.dry:
            cap = min(cap, 1)
        next_r, next_f = next(retries, None), next(fresh, None)
        while len(self.units) < goal and (next_f is not None or (next_r is not None and taken < cap)):
            if next_r is not None and taken < cap and (next_f is None or rank(next_r) <= rank(next_f)):
                taken += offer(next_r, True)
                next_r = next(retries, None)
            else:
                assert next_f is not None
                offer(next_f, False)
                next_f = next(fresh, None)
        room = self.retry_most - taken
        if next_r is not None and room > 0:
            goal2 = min(goal, len(self.units) + room)  # fresh work ran short: retries take the rest
            for c in _chain(next_r, retries):
                if len(self.units) >= goal2:
                    break
                taken += offer(c, True)
        self._next_passes(goal, offer, None if cap is None else self.retry_most - taken)

    def _next_passes(self, goal: int, offer: Callable[[Candidate, bool], bool], retry_room: int | None) -> None:
        """The passes after the first: the candidates that waited for their
        key's turn, in claim order, each pass serving a key once, until the
        goal is met or a pass takes nothing (retries up to ``retry_room``
        more; None: no bound)."""
        while self._later and len(self.units) < goal:
            later, self._later = self._later, []
            self._served.clear()
            self._waiting.clear()
            took = False
            for c, retry in later:
                if len(self.units) >= goal:
                    break
                if retry and retry_room is not None:
                    if retry_room <= 0:
                        continue
                    if offer(c, True):
                        retry_room -= 1
                        took = True
                elif offer(c, retry):
                    took = True
            if not took:
                return

    def passes_over(self, c: Candidate) -> bool:
        """Will this claim take nothing more like ``c`` (the same limits and
        name) from here on in this pass: its gates are shut, or its key
        (:func:`turn_key`) has headed a unit and as many of its candidates
        wait for the next pass as the claim could take? A store reading past
        many such candidates may leave their limits out of what it reads next."""
        if (c.limits, c.name) in self._closed:
            return True
        key = turn_key(c)
        if key is None or key not in self._served:
            return False
        goal = 1 if self.dry else self.request.max_units
        return self._waiting.get(key, 0) >= self._could_take(key, goal)

    def _could_take(self, key: str, goal: int) -> int:
        """How many more units headed by ``key`` this claim could take: its
        room under its gates, and the units still to take."""
        left = goal - len(self.units)
        return min(left, self.the_gates().room(key)) if left > 0 else 0

    @property
    def gated(self) -> bool:
        """Did a gate (a limit, a rate, a breaker) take part in this claim?"""
        return self.gates is not None


def _chain(first: Candidate, rest: Iterable[Candidate]) -> Iterator[Candidate]:
    yield first
    yield from rest


@dataclass(frozen=True, slots=True)
class Relay:
    """A unit still running its last task that asks for a successor in its
    place: its lease token and the limits it names."""

    token: str
    limits: frozenset[str] = field(default_factory=frozenset)
