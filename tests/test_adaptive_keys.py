"""Per-key adaptive limits, the pure parts: each key of a keyed limit gets its
own controller state, created on first use, forgotten when idle, bounded to the
busiest keys; a key's row holding its own values gates that key."""

from __future__ import annotations

from corral.core.adaptive import (
    Bounds,
    KeyState,
    LimitReport,
    busiest_reports,
    decide_keys,
    initial_state,
)
from corral.core.gates import Gates, LimitState, key_at_rest, keyed_name
from corral.core.model import LimitSpec

BOUNDS = Bounds(min_concurrency=1, max_concurrency=40, min_rate=1.0, max_rate=200.0)
START = (2.0, 10.0)


def busy(calls: int, throttles: int = 0) -> LimitReport:
    return LimitReport(1.0, calls=calls, successes=calls - throttles, throttles=throttles, held_by_rate=1)


def test_each_key_has_its_own_controller_created_on_first_use():
    states: dict[str, KeyState] = {}
    # m-1 is throttled at 10/s, m-2 is not: m-1 is cut, m-2 grows, from the same start
    for second in range(1, 6):
        states, decisions = decide_keys(
            states, {"m-1": busy(10, 3), "m-2": busy(10)}, BOUNDS, float(second), start=START
        )
        assert set(decisions) == {"m-1", "m-2"}
    assert states["m-1"].state.rate < START[1] < states["m-2"].state.rate
    assert states["m-1"].state.w_max is not None and states["m-2"].state.w_max is None
    # a key seen for the first time starts where the limit stands, not where another key went
    states, decisions = decide_keys(states, {"m-3": busy(3)}, BOUNDS, 6.0, start=START)
    assert decisions["m-3"].inputs["rate_before"] == START[1]


def test_an_idle_key_keeps_its_state_for_a_while_then_is_forgotten():
    states, _ = decide_keys({}, {"m-1": busy(10, 3)}, BOUNDS, 1.0, start=START, idle=60.0)
    cut = states["m-1"].state
    states, decisions = decide_keys(states, {}, BOUNDS, 30.0, start=START, idle=60.0)
    assert decisions == {} and states["m-1"].state == cut  # idle: no decision, nothing drifts
    states, _ = decide_keys(states, {"m-1": LimitReport(1.0)}, BOUNDS, 61.0, start=START, idle=60.0)
    assert states == {}  # 60 s without a call: forgotten
    states, decisions = decide_keys(states, {"m-1": busy(5)}, BOUNDS, 62.0, start=START, idle=60.0)
    assert decisions["m-1"].inputs["rate_before"] == START[1]  # back, from the limit's values


def test_the_states_are_bounded_to_the_busiest_keys():
    reports = {f"k{i:03d}": busy(i + 1) for i in range(50)}
    states, decisions = decide_keys({}, reports, BOUNDS, 1.0, start=START, max_keys=10)
    assert set(states) == set(decisions) == {f"k{i:03d}" for i in range(40, 50)}
    # a quiet key with a state gives way to a busy new one; the busy ones keep theirs
    old = {"quiet": KeyState(initial_state(BOUNDS, 0.0, rate=50, concurrency=5), seen=0.5)} | states
    states, _ = decide_keys(
        old, {**{k: busy(5) for k in states}, "new": busy(9)}, BOUNDS, 2.0, start=START, max_keys=11
    )
    assert "quiet" not in states and "new" in states and len(states) == 11


def test_a_worker_reports_its_busiest_keys_only():
    reports = {"a": busy(1), "b": busy(30), "c": busy(30, 5), "d": busy(2)}
    assert list(busiest_reports(reports, top=2)) == ["c", "b"]
    assert busiest_reports(reports, top=0) == {}


def test_a_key_row_with_its_own_values_gates_that_key_and_the_others_run_under_the_limit():
    base = LimitState(LimitSpec("merchant", concurrency=2, rate="100/s"))
    own = LimitState(LimitSpec(keyed_name("merchant", "m-1"), concurrency=5, rate="7/s"))
    rows = {"merchant": base, own.spec.name: own}
    gates = Gates(1000.0, rows, {}, {})
    mine = gates.limit(keyed_name("merchant", "m-1"))
    other = gates.limit(keyed_name("merchant", "m-2"))
    assert mine is not None and (mine.spec.concurrency, mine.spec.rate) == (5, "7/s")
    assert other is not None and (other.spec.concurrency, other.spec.rate) == (2, "100/s")
    started = 0
    while gates.fits((keyed_name("merchant", "m-1"),), "t") and started < 50:
        gates.take((keyed_name("merchant", "m-1"),), "t")
        started += 1
    assert started <= 5  # the key's own concurrency and rate, not the limit's 100/s
    # a key row is at rest (may be forgotten) by its own rate's bucket
    assert key_at_rest(base.spec, own, 1000.0)
