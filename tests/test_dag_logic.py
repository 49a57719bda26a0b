"""core/dag: ordering a graph, finding cycles, the bounds of a schedule."""

from __future__ import annotations

import pytest

from corral.core import dag
from corral.core.states import State


def test_order_keeps_a_sorted_graph_as_given():
    assert dag.order_refs(["a", "b", "c"], [[], ["a"], ["a", "b"]]) == [0, 1, 2]


def test_order_puts_dependencies_first():
    # report listed first, depends on both parses, which depend on fetch
    order = dag.order_refs(["report", "p1", "fetch", "p2"], [["p1", "p2"], ["fetch"], [], ["fetch"]])
    assert order == [2, 1, 3, 0]


def test_cycle_is_named_along_its_path():
    with pytest.raises(dag.CycleError) as exc:
        dag.order_refs(["a", "b", "c", "free"], [["c"], ["a"], ["b"], []])
    cycle = exc.value.cycle
    assert cycle[0] == cycle[-1] and sorted(cycle[:-1]) == ["a", "b", "c"]
    assert str(exc.value).startswith("the graph has a cycle: ")
    assert " -> " in str(exc.value) and "\n" not in str(exc.value)


def test_self_dependency_is_a_cycle():
    with pytest.raises(dag.CycleError) as exc:
        dag.order_refs(["a"], [["a"]])
    assert exc.value.cycle == ["a", "a"]


def test_repeated_and_unknown_refs_are_refused():
    with pytest.raises(ValueError, match="'a' names two tasks"):
        dag.order_refs(["a", "a"], [[], []])
    with pytest.raises(ValueError, match="'nope'"):
        dag.order_refs(["a", None], [[], ["nope"]])


def test_find_cycle_is_iterative_on_deep_graphs():
    n = 50_000
    chain = {i: [i + 1] for i in range(n)}
    assert dag.find_cycle(chain) is None
    chain[n] = [0]
    cycle = dag.find_cycle(chain)
    assert cycle is not None and len(cycle) == n + 2


def test_depths_and_critical_path():
    after = [[], [0], [0], [1, 2], []]
    assert dag.depths(after) == [0, 1, 1, 2, 0]
    durations = [1.0, 2.0, 5.0, 1.0, 4.0]
    assert dag.critical_path(durations, after) == 7.0
    # 13 units of work on 2 slots: 6.5 < critical path 7
    assert dag.ideal_makespan(durations, after, 2) == 7.0
    assert dag.ideal_makespan(durations, after, 1) == 13.0
    with pytest.raises(ValueError):
        dag.depths([[1], []])


def test_initial_state_by_policy():
    ok, bad, running = (1, State.SUCCESS), (2, State.FAILED), (3, State.RUNNING)
    assert dag.initial_state([], "cancel") == (State.PENDING, None)
    assert dag.initial_state([ok], "cancel") == (State.PENDING, None)
    assert dag.initial_state([ok, running], "cancel") == (State.WAITING, None)
    assert dag.initial_state([running, bad], "cancel") == (State.CANCELED, "upstream 2 ended FAILED")
    assert dag.initial_state([running, bad], "run") == (State.WAITING, None)
    assert dag.initial_state([ok, bad, (4, State.CANCELED)], "run") == (State.PENDING, None)
