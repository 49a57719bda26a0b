"""Limits that learn: the controller's targets, measured in the discrete-event
simulator over 20 seeds (a partner with a hidden rate and concurrency cap that
change, another client sharing it, an app that is sometimes idle, workers
reporting once a second, the controller run as the leader would run it), and
the pure parts: reports, their merge, the state record, the bounds.

No thread, no store, no sleep: a minute of simulated time takes a few
hundredths of a second."""

from __future__ import annotations

import json

import pytest

from corral.core.adaptive import (
    Bounds,
    ControllerState,
    LimitReport,
    ReportAccumulator,
    bucket_of,
    decide,
    initial_state,
    quantile_ms,
)
from corral.core.clock import FakeClock
from corral.testing.adaptive_targets import BOUNDS, CAPPED, SEEDS, WORLDS, capped, halved, hindsight, ramp
from corral.testing.limits_sim import AdaptiveController, Phase, Run, simulate


def _adaptive(phases: tuple[Phase, ...], seconds: float, seed: int, *, rate: float, concurrency: float) -> Run:
    return simulate(phases, AdaptiveController(BOUNDS, rate=rate, concurrency=concurrency), seconds=seconds, seed=seed)


# Each target is asserted in two worlds (corral.testing.adaptive_targets): "ideal" (a token-bucket
# partner, reports in step with the leader) and "bench" (the benchmark's sliding-second partner, and
# reports up to 0.4 s late as on a loaded machine, merged as the keeper merges them). The figures,
# seed by seed: python -m corral.testing.adaptive_targets

# -- the rate ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("seed", SEEDS)
def test_from_10_per_s_the_rate_reaches_90_percent_of_a_hidden_100_within_30_s_with_few_throttles(seed, world):
    figures = ramp(seed, world)
    assert figures["to_90_s"] <= 30, figures  # a whole 5 s window averaging 90/s ends by 30 s
    assert figures["throughput_30_60"] >= 90, figures
    assert figures["throttled_pct"] < 2, figures


@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("seed", SEEDS)
def test_when_the_hidden_rate_halves_throttles_stop_within_10_s_and_the_new_rate_is_reached_within_20_s(seed, world):
    figures = halved(seed, world)
    assert figures["throttled_pct_50_80"] < 2, figures
    assert figures["to_42_5_s"] <= 20, figures  # a 5 s window averaging 85 % of 50/s ends by 20 s after
    assert figures["throughput_60_80"] >= 0.85 * 50, figures


def test_the_rate_holds_while_the_app_is_idle_and_is_used_again_at_once():
    phases = (Phase(0, rate=100, latency_ms=50), Phase(30, rate=100, demand=0), Phase(60, rate=100, latency_ms=50))
    for seed in SEEDS:
        run = _adaptive(phases, 70, seed, rate=10, concurrency=10)
        assert run.total("calls", 31, 60) == 0
        assert max(run.rate[31:60]) == min(run.rate[31:60]) >= 80  # no drift either way while idle
        assert run.throughput(61, 70) >= 80
        assert run.throttled_share(60, 66) < 0.02  # no flood on resuming


# -- the concurrency ---------------------------------------------------------------------------------


@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("seed", SEEDS)
def test_a_hidden_concurrency_cap_of_20_is_found_and_its_halving_overloads_fewer_than_5_seconds(seed, world):
    figures = capped(seed, world)
    assert 18 <= figures["in_flight_10_40"] <= 30, figures
    assert figures["p50_ratio"] <= 1.5, figures  # against the unloaded median, the partner's 100 ms
    assert figures["overloaded_s_40_70"] < 5, figures


def test_a_slower_partner_is_told_from_our_own_load_and_does_not_drive_the_limit_to_the_floor():
    # the partner's latency doubles at 30 s while its cap stays 20: sending less cannot help
    phases = (Phase(0, rate=None, cap=20, latency_ms=100), Phase(30, rate=None, cap=20, latency_ms=200))
    for seed in SEEDS:
        run = _adaptive(phases, 90, seed, rate=400, concurrency=4)
        assert 18 <= run.mean_in_flight(60, 90) <= 30, run.concurrency[30:]
        assert run.p50_ms(60, 90) <= 1.5 * 200


def test_the_floor_recovers_after_a_long_overload_by_another_client_though_the_partner_stays_slower():
    # another client floods the partner (300 calls/s against 20 places of 100 ms) for 30 s, then
    # leaves a partner that has become 2.5 times slower: the old baseline is no use any more
    phases = (
        Phase(0, rate=None, cap=20, latency_ms=100),
        Phase(10, rate=None, cap=20, latency_ms=100, background=300),
        Phase(40, rate=None, cap=20, latency_ms=250),
    )
    for seed in SEEDS:
        run = _adaptive(phases, 80, seed, rate=400, concurrency=4)
        assert min(run.concurrency[20:40]) <= 5  # it gave way
        assert run.mean_in_flight(60, 80) >= 18, run.concurrency[40:]


def test_the_concurrency_does_not_grow_against_a_rate_limited_partner():
    # the rate binds (40/s, 50 ms: 2 in flight); fast 429s must not grow the concurrency
    phases = (Phase(0, rate=40, latency_ms=50),)
    for seed in SEEDS:
        run = _adaptive(phases, 60, seed, rate=100, concurrency=4)
        assert max(run.concurrency) <= 8, run.concurrency


# -- against the best fixed limit in hindsight --------------------------------------------------------


#: throughput / the best fixed rate's in hindsight: (mean, worst seed) asserted in each world. In the
#: bench world a limit told the share the other client leaves reaches 0.9 only by sending all of it
#: and having 5-6 % of its calls throttled (the next test), which the targets above forbid against a
#: partner alone; the adaptive limit holds 0.78 (0.74) there, asserted with a little room.
HINDSIGHT_FLOORS = {"ideal": (0.9, 0.85), "bench": (0.76, 0.72)}


@pytest.mark.parametrize("world", WORLDS)
def test_against_the_best_fixed_limit_in_hindsight_nearly_its_throughput_and_fewer_throttles(world):
    # a quota of 60 -> 40 -> 60/s shared with another client at 10/s, the app idle 10 s of it
    figures = [hindsight(seed, world) for seed in SEEDS]
    for seed_figures in figures:
        # every fixed limit that does as well as the adaptive one is throttled more, in every run
        assert seed_figures["throttles"] < seed_figures["fewest_throttles_as_good"], seed_figures
    ratios = sorted(f["ratio_to_best"] for f in figures)
    # the slow start from 10/s costs the first seconds, which the limit chosen in hindsight does not pay
    mean, worst = HINDSIGHT_FLOORS[world]
    assert sum(ratios) / len(ratios) >= mean and ratios[0] >= worst, ratios


def test_in_the_bench_world_0_9_of_the_best_fixed_limit_costs_more_throttles_than_a_partner_alone_allows():
    """Why the bench world's floor is lower: against a sliding second shared with another client's
    Poisson traffic, throttles begin well under the share left. A limit told that share exactly
    (no controller knows as much) reaches 0.9 of the best fixed rate only by sending all of it,
    with more than 2 % of its calls throttled in every run; sending 0.9 of it keeps under 2 %
    and reaches less than 0.9. Against a partner alone (the ramp and halving targets) a
    controller must keep under 2 %, and from throttles alone it cannot tell the two apart."""
    figures = [hindsight(seed, "bench") for seed in SEEDS]

    def mean(key: str) -> float:
        return sum(f[key] for f in figures) / len(figures)

    assert mean("told_1.0_ratio") >= 0.9 and min(f["told_1.0_throttled_pct"] for f in figures) > 2
    assert mean("told_0.9_ratio") < 0.9 and mean("told_0.9_throttled_pct") < 2


# -- the pure parts ------------------------------------------------------------------------------------


def test_every_decision_stays_inside_the_bounds():
    bounds = Bounds(min_concurrency=3, max_concurrency=12, min_rate=5.0, max_rate=60.0)
    for seed in range(5):
        controller = AdaptiveController(bounds, rate=1000, concurrency=1)
        run = simulate(CAPPED + (Phase(55, rate=20, cap=2, latency_ms=100),), controller, seconds=70, seed=seed)
        assert all(3 <= c <= 12 for c in run.concurrency)
        assert all(5.0 <= r <= 60.0 for r in run.rate)
        assert {d["concurrency_rule"] for d in controller.decisions} >= {"latency above the baseline: cut"}


def test_a_new_leader_continues_from_the_record_exactly_where_the_old_one_stopped():
    clock = FakeClock(start=0.0)
    reports = [
        LimitReport(
            1.0,
            calls=40 + i,
            successes=40 + i,
            peak_in_flight=10,
            held_by_rate=3,
            held_by_concurrency=2,
            latency={bucket_of(50 + i): 40},
        )
        for i in range(10)
    ] + [
        LimitReport(
            1.0, calls=80, successes=60, throttles=20, peak_in_flight=10, held_by_rate=9, latency={bucket_of(300): 60}
        )
    ]
    state = initial_state(BOUNDS, clock.time(), rate=30, concurrency=5)
    alone = []
    for report in reports:
        clock.advance(1.0)
        alone.append(decide(state, report, BOUNDS, clock.time()))
        state = alone[-1].state
    # the same, but each step's state goes through its JSON record, as from one leader to the next
    clock = FakeClock(start=0.0)
    record = json.dumps(initial_state(BOUNDS, clock.time(), rate=30, concurrency=5).to_dict())
    handed = []
    for report in reports:
        clock.advance(1.0)
        wire = LimitReport.from_dict(json.loads(json.dumps(report.to_dict())))
        handed.append(decide(ControllerState.from_dict(json.loads(record)), wire, BOUNDS, clock.time()))
        record = json.dumps(handed[-1].state.to_dict())
    assert [(d.rate, d.concurrency, d.rate_rule, d.concurrency_rule) for d in handed] == [
        (d.rate, d.concurrency, d.rate_rule, d.concurrency_rule) for d in alone
    ]
    assert len(record) < 600
    assert alone[-1].rate_rule == "throttled: cut" and alone[-1].rate == pytest.approx(0.9 * 60)


def test_a_decision_explains_itself_with_its_inputs_and_rules():
    state = initial_state(BOUNDS, 0.0, rate=50, concurrency=10)
    report = LimitReport(
        1.0, calls=50, successes=40, throttles=10, peak_in_flight=9, held_by_rate=4, latency={bucket_of(80): 40}
    )
    decision = decide(state, report, BOUNDS, 1.0)
    event = decision.explanation
    assert event["rate_rule"] == "throttled: cut" and event["rate"] == 36.0
    assert event["concurrency_rule"] == "throttled: hold (throttles are the rate's)"
    assert event["inputs"]["throttles"] == 10 and event["inputs"]["rate_before"] == 50
    assert 65 <= event["inputs"]["p50_ms"] <= 95
    json.dumps(event)


def test_growth_needs_the_limit_to_be_the_bottleneck():
    state = initial_state(BOUNDS, 0.0, rate=50, concurrency=10)
    idle = LimitReport(1.0, calls=20, successes=20, peak_in_flight=3, latency={bucket_of(80): 20})
    decision = decide(state, idle, BOUNDS, 1.0)
    assert (decision.rate, decision.concurrency) == (50, 10)
    assert decision.rate_rule == "not the bottleneck: hold" and decision.concurrency_rule == "not in use: hold"
    busy = LimitReport(
        1.0,
        calls=50,
        successes=50,
        peak_in_flight=10,
        held_by_rate=5,
        held_by_concurrency=5,
        latency={bucket_of(80): 50},
    )
    decision = decide(decision.state, busy, BOUNDS, 2.0)
    assert decision.rate > 50 and decision.concurrency > 10
    # never above twice the rate measured to succeed
    few = LimitReport(1.0, calls=10, successes=10, peak_in_flight=10, held_by_rate=5, latency={bucket_of(80): 10})
    assert decide(decision.state, few, BOUNDS, 3.0).rate <= max(decision.rate, 2 * 10)


def test_the_slow_start_waits_for_its_last_raise_to_show_before_raising_again():
    """The reports lag the rate by a second or two: a slow start that raised
    on every bottleneck interval would overshoot a cap by the growth of the lag."""
    state = ControllerState(100.0, 10.0)
    lagging = LimitReport(1.0, calls=85, successes=70, peak_in_flight=5, held_by_rate=5)
    decision = decide(state, lagging, BOUNDS, 1.0)
    assert decision.rate == 100 and decision.rate_rule.endswith("the last raise not seen yet")
    shown = LimitReport(1.0, calls=100, successes=95, peak_in_flight=5, held_by_rate=5)
    assert decide(state, shown, BOUNDS, 1.0).rate == 150
    # long past the last cut, the slow start again waits the same way
    stale = ControllerState(50.0, 10.0, w_max=40.0, since_cut=60.0, last_cut_at=0.0)
    behind = LimitReport(1.0, calls=42, successes=35, peak_in_flight=5, held_by_rate=5)
    assert decide(stale, behind, BOUNDS, 61.0).rate == 50
    assert decide(stale, shown, BOUNDS, 61.0).rate == 75


def test_a_re_cut_right_after_a_cut_is_shallow_and_keeps_the_capacity_measured():
    """The interval right after a cut still carries calls sent at the old rate:
    its successes understate the partner, so a re-cut takes at most a quarter off."""
    cut = ControllerState(45.0, 10.0, w_max=50.0, since_cut=0.0, last_cut_at=10.0)
    report = LimitReport(1.0, calls=49, successes=29, throttles=20, peak_in_flight=5, held_by_rate=5)
    decision = decide(cut, report, BOUNDS, 11.0)
    assert decision.rate_rule == "throttled again: re-cut"
    assert decision.rate == pytest.approx(0.75 * 45) and decision.state.w_max == 50.0
    # later, the same throttles are a cut of their own: to 0.9 of what succeeded
    assert decide(cut, report, BOUNDS, 20.0).rate == pytest.approx(0.9 * 29)


def test_reports_accumulate_in_memory_and_merge_across_workers():
    a, b = ReportAccumulator(0.0), ReportAccumulator(0.0)
    for in_flight in (1, 2, 3):
        a.started(in_flight)
    a.succeeded(40.0)
    a.succeeded(45.0)
    a.throttled()
    a.held("rate")
    b.started(5)
    b.failed()
    b.held("concurrency")
    with pytest.raises(ValueError):
        b.held("memory")
    merged = LimitReport.merged([a.take(1.0), b.take(1.1)], seconds=1.0)
    assert (merged.calls, merged.successes, merged.throttles, merged.errors) == (4, 2, 1, 1)
    assert (merged.peak_in_flight, merged.held_by_rate, merged.held_by_concurrency) == (5, 1, 1)
    assert sum(merged.latency.values()) == 2 and merged.seconds == 1.0
    assert a.take(2.0) == LimitReport(seconds=1.0)  # taking starts again from nothing
    assert LimitReport.merged([], seconds=1.0) == LimitReport(seconds=1.0)
    assert LimitReport.from_dict(json.loads(json.dumps(merged.to_dict()))) == merged


def test_the_coarse_histogram_gives_quantiles_within_a_bucket():
    histogram: dict[int, int] = {}
    for ms in range(1, 1001):
        histogram[bucket_of(float(ms))] = histogram.get(bucket_of(float(ms)), 0) + 1
    assert quantile_ms(histogram, 0.5) == pytest.approx(500, rel=0.2)
    assert quantile_ms(histogram, 0.99) == pytest.approx(990, rel=0.2)
    assert quantile_ms({}, 0.5) is None
    assert bucket_of(0.0) == 0 and bucket_of(1e12) == 79


def test_bounds_refuse_nonsense():
    with pytest.raises(ValueError):
        Bounds(min_concurrency=5, max_concurrency=2)
    with pytest.raises(ValueError):
        Bounds(min_rate=0.0)


def test_a_report_missing_from_an_interval_neither_stalls_the_slow_start_nor_deepens_a_cut():
    """On a loaded machine a worker's report can miss the leader's second: what
    succeeded then reads as half. The measure is the highest of the last few
    seconds', and a cut reads the share of the calls that succeeded."""
    state = ControllerState(100.0, 10.0, recent_ok=(97.0,), rate_before=100.0)
    half = LimitReport(1.0, calls=50, successes=50, peak_in_flight=5, held_by_rate=5)
    decision = decide(state, half, BOUNDS, 1.0)
    assert decision.rate == 150 and decision.rate_rule == "bottleneck, never throttled: slow start"
    assert decide(ControllerState(100.0, 10.0), half, BOUNDS, 1.0).rate == 100  # one second alone: it waits
    # a throttled second whose reports hold 89 successes of 96 calls sent at 114/s: the partner took ~106/s
    sent = ControllerState(114.0, 10.0, recent_ok=(75.0,), rate_before=114.0)
    throttled = LimitReport(1.0, calls=96, successes=89, throttles=7, peak_in_flight=5, held_by_rate=5)
    cut = decide(sent, throttled, BOUNDS, 2.0)
    assert cut.rate_rule == "throttled: cut" and cut.rate == pytest.approx(0.9 * 89 / 96 * 114)
    assert cut.state.recent_ok == (89.0,)  # the measure starts again at the cut
    # the state record keeps the measure
    assert ControllerState.from_dict(json.loads(json.dumps(cut.state.to_dict()))) == cut.state
