"""The fast claim of ungrouped work under concurrency limits
(:mod:`corral.core.keyed_claims`) answers as the planner does, or not at all.

Random queues of ungrouped candidates under keyed and plain limits (caps
that bind or not, places held, full keys, a lone limit, two keys on one
task, a rate) are claimed by :class:`ClaimPlanner` over every candidate and by
:func:`decide` over the first few: whenever ``decide`` answers, it is the
planner's answer, units and order, and no gate goes over its cap."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from corral.core.claims import Candidate as PlanCandidate
from corral.core.claims import ClaimPlanner, ClaimRequest
from corral.core.gates import Gates, LimitState, keyed_name
from corral.core.keyed_claims import SHORT, UNDECIDED, Candidate, Gate, decide
from corral.core.model import LimitSpec


def _scenario(rng: random.Random):
    """Candidates (in claim order) with their gate names; the declared
    limits; each gate's places held; each key's own cap (a key's row)."""
    limits = {"api": LimitSpec("api", concurrency=rng.choice([1, 2, 3, 1000]))}
    if rng.random() < 0.5:
        limits["db"] = LimitSpec("db", concurrency=rng.choice([1, 2, 5, 1000]))
    if rng.random() < 0.3:
        limits["acct"] = LimitSpec("acct", concurrency=rng.choice([1, 2, 1000]))
    if rng.random() < 0.3:
        limits["rated"] = LimitSpec("rated", rate="2/s")
    keys = [f"m{i}" for i in range(rng.randint(1, 6))]
    own_caps = {keyed_name("api", k): rng.choice([1, 3]) for k in keys if rng.random() < 0.15}
    tasks = []
    for tid in range(1, rng.randint(1, 30) + 1):
        names = []
        shape = rng.random()
        if shape < 0.1:
            pass  # plain work
        elif shape < 0.2:
            names = ["db"]  # a lone plain limit
        elif shape < 0.25 and "rated" in limits:
            names = ["rated"]  # only the planner decides a rate
        else:
            names = [keyed_name("api", rng.choice(keys))]
            if "db" in limits and rng.random() < 0.2:
                names.append("db")
            if "acct" in limits and rng.random() < 0.2:
                names.append(keyed_name("acct", rng.choice(keys)))
        tasks.append((tid, tuple(names)))
    gate_names = {n for _, names in tasks for n in names}
    held = {n: rng.choice([0, 0, 0, 1, 2]) for n in gate_names}
    return tasks, limits, held, own_caps


def _cap(name: str, limits, own_caps) -> int | None:
    base = limits.get(name.partition("\x1f")[0])
    if base is None:
        return None
    return own_caps.get(name, base.concurrency)


def _planner(tasks, limits, held, own_caps, n: int) -> list[int]:
    """The planner's units over every candidate, as SQLiteStore._pick drives it."""
    states = {name: LimitState(spec) for name, spec in limits.items()}

    def load_key(name: str):
        cap = own_caps.get(name)
        return None if cap is None else LimitState(LimitSpec(name, concurrency=cap))

    plan = ClaimPlanner(
        ClaimRequest(("default",), n),
        lambda: Gates(0.0, states, dict(held), {}, load_key=load_key),
        {},
    )
    cands = [PlanCandidate(tid, "t", "default", None, frozenset(names), False) for tid, names in tasks]

    def stream():
        for c in cands:
            if not plan.shut_out(c):
                yield c

    def try_take(c):
        return plan.admits(c) and plan.try_head(c, lambda *_: [])

    plan.run(stream(), None, try_take, lambda c: (c.id,))
    return [u[0].id for u in plan.units]


def _decide(tasks, limits, held, own_caps, n: int, window: int):
    read = tasks[:window]
    rows = [Candidate(tid, name) for tid, names in read for name in (names or (None,))]
    gates = {}
    for _, names in read:
        for name in names:
            cap = _cap(name, limits, own_caps)
            h = held.get(name, 0)
            gates[name] = Gate(cap, h, cap is not None and h >= cap, name == "rated")
    return decide(rows, gates, n, len(tasks) > window)


@pytest.mark.parametrize("seed", range(4))
def test_an_answer_is_always_the_planners(seed):
    rng = random.Random(seed)
    answered = Counter()
    for _ in range(2500):
        tasks, limits, held, own_caps = _scenario(rng)
        n = rng.randint(1, 8)
        window = rng.choice([n, n + 4, 2 * n + 4, 64])
        got = _decide(tasks, limits, held, own_caps, n, window)
        if got.miss is not None:
            assert got.miss in (SHORT, UNDECIDED) and got.ids == []
            answered[got.miss] += 1
            continue
        answered["answer"] += 1
        assert got.ids == _planner(tasks, limits, held, own_caps, n), (tasks, limits, held, own_caps, n, window)
        taken = Counter(name for tid, names in tasks if tid in got.ids for name in names)
        for name, k in taken.items():
            cap = _cap(name, limits, own_caps)
            assert cap is None or held.get(name, 0) + k <= cap
    # the fast path answers most such claims (keys with room, caps that bind per key)
    assert answered["answer"] > 1000, answered


def test_keys_are_served_in_turn_and_a_full_key_waits():
    a, b, c = (keyed_name("api", k) for k in "abc")
    rows = [Candidate(1, a), Candidate(2, a), Candidate(3, b), Candidate(4, a), Candidate(5, c)]
    gates = {a: Gate(2, 0), b: Gate(2, 0), c: Gate(2, 2, shut=True)}
    assert decide(rows, gates, 10, full=False).ids == [1, 3, 2]  # a's second turn after b's first; c full
    assert decide(rows, gates, 2, full=True).ids == [1, 3]  # every key's first turn before a second
    assert decide(rows, gates, 3, full=True).miss == SHORT  # a second turn may wait behind keys not read


def test_nothing_past_a_candidate_only_the_planner_decides():
    a, b = keyed_name("api", "a"), keyed_name("rated", "b")
    rows = [Candidate(1, a), Candidate(2, b), Candidate(3, a), Candidate(4, None)]
    gates = {a: Gate(5, 0), b: Gate(None, 0, unknown=True)}
    assert decide(rows, gates, 1, full=False).ids == [1]
    assert decide(rows, gates, 2, full=False).miss == UNDECIDED
    # a task named under a breaker not closed: undecided, and never prefetched
    rows = [Candidate(1, None, stopped=True), Candidate(2, None)]
    assert decide(rows, {}, 1, full=False).miss == UNDECIDED
    assert decide(rows, {}, 1, full=False, prefetch=True).ids == [2]


def test_a_plain_limit_binding_over_keyed_work_is_left_to_the_planner():
    a, b = keyed_name("api", "a"), keyed_name("api", "b")
    rows = [Candidate(1, a), Candidate(1, "db"), Candidate(2, b), Candidate(2, "db")]
    gates = {a: Gate(5, 0), b: Gate(5, 0), "db": Gate(1, 0)}
    assert decide(rows, gates, 2, full=False).miss == UNDECIDED
    # a lone limit's own candidates: the first up to its room
    rows = [Candidate(1, "db"), Candidate(2, "db"), Candidate(3, None)]
    assert decide(rows, {"db": Gate(1, 0)}, 5, full=False).ids == [1, 3]
