"""A claim of ungrouped work under concurrency limits, decided without the planner.

:class:`~corral.core.claims.ClaimPlanner` reads candidates one by one, in
claim order, and serves keys in turn (:func:`~corral.core.claims.turn_key`).
While the work queued is ungrouped and its limits have a concurrency only,
its answer over the first ``window`` candidates can often be shown from one
read of them (each with the state of each of its gates: cap, places held,
shut for the whole claim, or something only the planner decides, such as a
rate or a breaker not closed) by counting alone; :func:`decide` does that,
or says it cannot.

Why it is the planner's answer:

- a candidate a gate shuts out before the claim (a limit full, a pause)
  never heads a unit and never takes its key's turn: it is left out;
- give every other candidate its place ``rn`` among those naming each of
  its gates, in claim order. It *fits* when, under each capped gate, places
  held + ``rn`` <= the cap. Whatever is taken of the candidates that fit,
  no gate goes over its cap (a gate's taken candidates are at most the
  highest place among them): the answer is safe whatever else holds;
- when a gate is over its cap by all its candidates read (held + their
  number > cap) only where it *orders* them (it is each one's turn key, or
  each one's only limit), no other gate binds: the planner then takes a
  turn key's candidates one per pass in claim order up to its room, and a
  lone limit's candidates in claim order up to its room, exactly those
  that fit; a candidate's pass is its place among those of its turn key
  (1 without one), and passes come in order (a key's second candidate
  after every key's first), so the answer is the fitting candidates by
  (pass, claim order), the first n;
- the planner reads past the window: a second turn only when every
  candidate was read, and n found, or every candidate read and decided;
  never a candidate past one this read cannot decide.

Anything else is :data:`UNDECIDED` (the planner decides), or :data:`SHORT`:
the window was too narrow to show n.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import NamedTuple

from corral.core.gates import KEY_SEP

#: the read cannot show the planner's answer
UNDECIDED = "undecided"
#: the window held fewer than n candidates of the first turn (read more)
SHORT = "short"


class Gate(NamedTuple):
    """A gate's state as the claim reads it."""

    #: its cap (None: no concurrency, or no limit of that name)
    cap: int | None = None
    #: places held under it (read when it has a cap)
    held: int = 0
    #: shuts its candidates out for the whole claim (full before it, paused)
    shut: bool = False
    #: only the planner decides (a rate, a breaker not closed)
    unknown: bool = False


class Candidate(NamedTuple):
    """One candidate and one of its gate names (None: it names none), in
    claim order, a candidate's rows together."""

    id: int
    lim: str | None
    #: the task's name is under a breaker not closed
    stopped: bool = False


class Decision(NamedTuple):
    ids: list[int]
    #: None: the answer; else :data:`UNDECIDED` or :data:`SHORT`
    miss: str | None = None


_OPEN = Gate()


def decide(
    rows: Iterable[Candidate], gates: Mapping[str, Gate], n: int, full: bool, *, prefetch: bool = False
) -> Decision:
    """The planner's units (one task each) among the candidates of ``rows``,
    in its order, at most ``n``; ``gates``: the state of each gate they name;
    ``full``: the read stopped at its window (more candidates may follow).
    With ``prefetch`` no limited task is taken (an idle unit must not hold a
    place) nor one whose name is under a breaker not closed (nor a probe)."""
    order: list[int] = []
    names: dict[int, list[str]] = {}
    shut: set[int] = set()
    unknown: set[int] = set()
    for r in rows:
        own = names.get(r.id)
        if own is None:
            own = names[r.id] = []
            order.append(r.id)
            if r.stopped:
                (shut if prefetch else unknown).add(r.id)
        if r.lim is None or r.lim in own:
            continue
        own.append(r.lim)
        g = gates.get(r.lim, _OPEN)
        if g.shut or prefetch:
            shut.add(r.id)
        elif g.unknown:
            unknown.add(r.id)
    live = [tid for tid in order if tid not in shut]
    # each candidate's place among the live candidates of each of its gates, in claim order
    count: dict[str, int] = {}
    place: dict[tuple[int, str], int] = {}
    for tid in live:
        for lim in names[tid]:
            k = count.get(lim, 0) + 1
            count[lim] = place[(tid, lim)] = k
    first_unknown = None
    picked: list[tuple[int, int, int]] = []
    turns: dict[str, int] = {}  # candidates so far whose turn comes under each key
    for i, tid in enumerate(live):
        own = names[tid]
        keys = [lim for lim in own if KEY_SEP in lim]
        turn = min(keys) if keys else None
        if turn is not None:
            turns[turn] = pass_ = turns.get(turn, 0) + 1
        else:
            pass_ = 1
        orders = turn if turn is not None else (own[0] if len(own) == 1 else None)
        fits = True
        for lim in own:
            g = gates.get(lim, _OPEN)
            if g.cap is None:
                continue
            if lim != orders and g.held + count[lim] > g.cap:
                return Decision([], UNDECIDED)  # a gate binds over candidates it does not order
            if g.held + place[(tid, lim)] > g.cap:
                fits = False
        if tid in unknown:
            if first_unknown is None:
                first_unknown = i
            continue
        if fits:
            picked.append((pass_, i, tid))
    if first_unknown is not None:  # the first turn before it alone
        picked = [p for p in picked if p[0] == 1 and p[1] < first_unknown]
    elif full:  # a second turn comes after every key's first, read or not
        picked = [p for p in picked if p[0] == 1]
    picked.sort()
    ids = [tid for _, _, tid in picked[:n]]
    if len(ids) >= n or (not full and first_unknown is None):
        return Decision(ids)
    return Decision([], SHORT if first_unknown is None else UNDECIDED)


def read(raw: Iterable[Sequence]) -> tuple[list[Candidate], dict[str, Gate], bool]:
    """The rows of the store's read (``claim_keyed``): the candidates in
    claim order, each gate's state, and whether a retry is due."""
    cands: list[tuple] = []
    gates: dict[str, Gate] = {}
    retries = False
    for r in raw:
        kind = r[0]
        if kind == 0:
            cands.append((r[2], r[1], r[3], bool(r[4])))
        elif kind == 1:
            gates[r[3]] = Gate(r[5], r[6] or 0, bool(r[7]), bool(r[8]))
        else:
            retries = True
    cands.sort(key=lambda c: (c[0], c[1]))
    return [Candidate(c[1], c[2], c[3]) for c in cands], gates, retries
