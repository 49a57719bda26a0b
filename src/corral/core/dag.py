"""Task graphs as plain data: order, cycles, and the bounds a schedule can reach.

A graph submitted in one call names its nodes by local names (refs). Before
anything is stored the nodes are put in an order where every node comes after
the nodes it depends on; a cycle makes that impossible and is reported with
the names along it. The bounds are those of list scheduling on ``slots``
identical machines: no schedule beats the longest chain of work (the critical
path), nor the total work spread evenly over every slot.
"""

from __future__ import annotations

import heapq
from collections.abc import Hashable, Iterable, Mapping, Sequence
from typing import TypeVar

from corral.core.states import FINAL, State

K = TypeVar("K", bound=Hashable)

#: What a task does when one of its upstream tasks ends FAILED, TIMEOUT or CANCELED.
UPSTREAM_POLICIES = ("cancel", "run")


class CycleError(ValueError):
    """The graph has a cycle; ``cycle`` lists its nodes, the first repeated at the end."""

    def __init__(self, cycle: Sequence[Hashable]):
        self.cycle = list(cycle)
        super().__init__("the graph has a cycle: " + " -> ".join(map(str, self.cycle)))


def find_cycle(graph: Mapping[K, Iterable[K]]) -> list[K] | None:
    """A cycle of ``graph`` (node -> the nodes it depends on) as a closed path
    ``[a, b, ..., a]``, or None. Iterative, so a deep graph cannot overflow
    the stack; nodes named only as targets count as nodes without edges."""
    state: dict[K, int] = {}  # 1 on the current path, 2 done
    for start in graph:
        if state.get(start):
            continue
        path: list[K] = [start]
        stack = [iter(graph.get(start, ()))]
        state[start] = 1
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                stack.pop()
                state[path.pop()] = 2
                continue
            seen = state.get(nxt)
            if seen == 1:
                return [*path[path.index(nxt) :], nxt]
            if seen is None:
                state[nxt] = 1
                path.append(nxt)
                stack.append(iter(graph.get(nxt, ())))
    return None


def topological_order(after: Sequence[Sequence[int]]) -> list[int]:
    """Positions ``0..n-1`` ordered so each comes after the positions it lists
    in ``after``; among the ready ones the smallest position first, so a list
    already in order keeps its order. Raises :class:`CycleError` (with
    positions) when no such order exists."""
    n = len(after)
    indegree = [0] * n
    dependents: list[list[int]] = [[] for _ in range(n)]
    for i, deps in enumerate(after):
        for j in set(deps):
            if not 0 <= j < n:
                raise IndexError(f"node {i} depends on position {j}, outside the graph")
            indegree[i] += 1
            dependents[j].append(i)
    ready = [i for i in range(n) if indegree[i] == 0]
    heapq.heapify(ready)
    out: list[int] = []
    while ready:
        i = heapq.heappop(ready)
        out.append(i)
        for d in dependents[i]:
            indegree[d] -= 1
            if indegree[d] == 0:
                heapq.heappush(ready, d)
    if len(out) < n:
        left = {i: [j for j in after[i] if indegree[j]] for i in range(n) if indegree[i]}
        cycle = find_cycle(left)
        raise CycleError(cycle or sorted(left))
    return out


def order_refs(refs: Sequence[str | None], depends: Sequence[Sequence[str]]) -> list[int]:
    """The submit order of a graph whose nodes depend on each other by ref.

    ``refs[i]`` is node i's local name (or None); ``depends[i]`` the refs it
    waits on. Returns the positions in an order where dependencies come
    first. Raises ValueError naming a repeated or unknown ref, and
    :class:`CycleError` naming the refs along a cycle in the direction work
    would flow (``a -> b``: b waits on a)."""
    where: dict[str, int] = {}
    for i, ref in enumerate(refs):
        if ref is None:
            continue
        if ref in where:
            raise ValueError(f"ref {ref!r} names two tasks of the graph (items {where[ref]} and {i})")
        where[ref] = i
    after: list[list[int]] = []
    for i, deps in enumerate(depends):
        row = []
        for r in deps:
            if r not in where:
                raise ValueError(f"depends_on of item {i} names {r!r}, the ref of no task in the same call")
            row.append(where[r])
        after.append(row)
    try:
        return topological_order(after)
    except CycleError as exc:
        # shown in the direction work flows: each ref runs before the next
        names = [refs[i] for i in reversed(exc.cycle) if isinstance(i, int)]
        raise CycleError([r if r is not None else "(a task without a ref)" for r in names]) from None


def depths(after: Sequence[Sequence[int]]) -> list[int]:
    """Each node's layer: 0 without dependencies, else one more than its
    deepest dependency. ``after`` must list only earlier positions."""
    out: list[int] = []
    for i, deps in enumerate(after):
        if any(j >= i for j in deps):
            raise ValueError(f"node {i} depends on a later position; order the graph first")
        out.append(1 + max((out[j] for j in deps), default=-1))
    return out


def critical_path(durations: Sequence[float], after: Sequence[Sequence[int]]) -> float:
    """The longest chain of work through the graph (``after`` in topological
    order): no number of slots finishes sooner."""
    finish: list[float] = []
    for i, deps in enumerate(after):
        finish.append(durations[i] + max((finish[j] for j in deps), default=0.0))
    return max(finish, default=0.0)


def ideal_makespan(durations: Sequence[float], after: Sequence[Sequence[int]], slots: int) -> float:
    """The lower bound of the time to run the graph on ``slots`` slots:
    ``max(critical path, total work / slots)``."""
    if slots < 1:
        raise ValueError("slots must be at least 1")
    return max(critical_path(durations, after), sum(durations) / slots)


def upstream_reason(upstream: int, state: str) -> str:
    """Why a dependent was canceled: the upstream task that ended badly."""
    return f"upstream {upstream} ended {state}"


def initial_state(upstream: Iterable[tuple[int, State]], policy: str) -> tuple[State, str | None]:
    """A dependent's state at submit, from its upstream tasks' states.

    Under ``"cancel"`` one upstream already ended badly cancels it (the reason
    names that upstream); it runs once every upstream has succeeded. Under
    ``"run"`` it runs once every upstream has ended, however it ended."""
    waiting = False
    for tid, st in upstream:
        if st in FINAL and st is not State.SUCCESS:
            if policy == "cancel":
                return State.CANCELED, upstream_reason(tid, st.value)
        elif st not in FINAL:
            waiting = True
    return (State.WAITING if waiting else State.PENDING), None
