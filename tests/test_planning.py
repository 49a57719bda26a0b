"""The capacity planner against the seeds' worked examples."""

from __future__ import annotations

import pytest

from corral.core import planning
from corral.core.planning import (
    WORKED_EXAMPLE,
    capacity_plan,
    concurrency_limit,
    format_duration,
    littles_law,
    mean_duration,
    parse_duration,
    process_layout,
    required_concurrency,
    required_workers,
    workers_per_process,
)


def test_seed_000_qps_times_latency_times_safety():
    # Partner API: 100 QPS, 200 ms a request -> 20 in flight at the cap, 14 with 0.7.
    plan = concurrency_limit(100, 0.2)
    assert plan.per_request_qps == pytest.approx(5.0)
    assert plan.theoretical == pytest.approx(20.0)
    assert plan.limit == 14
    assert concurrency_limit(100, 0.2, safety=1.0).limit == 20
    assert concurrency_limit(100, 0.2, safety=0.6).limit == 12


def test_concurrency_limit_never_below_one_and_rejects_nonsense():
    assert concurrency_limit(1, 0.01).limit == 1
    for bad in [(0, 0.2, 0.7), (100, 0, 0.7), (100, 0.2, 0), (100, 0.2, 1.5), (-5, 0.2, 0.7)]:
        with pytest.raises(ValueError):
            concurrency_limit(*bad)


def test_seed_002_littles_law_mean_duration_and_required_workers():
    law = littles_law(done=392, window_s=48 * 3600, workers=4, target=720)
    assert law.throughput_per_h == pytest.approx(8.17, abs=0.01)
    assert law.mean_duration_s / 60 == pytest.approx(29, abs=0.5)  # "about 29 minutes"
    assert law.target_throughput_per_h == pytest.approx(15.0)
    assert law.required_concurrency == pytest.approx(7.32, abs=0.05)  # seed: 15 x 0.488 = 7.32
    assert law.required_workers == 8


def test_littles_law_units_do_not_matter():
    # The same run measured in seconds or in days gives the same duration.
    assert mean_duration(392, 48 * 3600, 4) == pytest.approx(mean_duration(392, 2 * 86400, 4))
    # Required concurrency is a plain number: 15/h for 0.5 h is 7.5 in flight.
    assert required_concurrency(15, 3600, 1800) == pytest.approx(7.5)
    # A target over a different window than the measurement.
    law = littles_law(392, 48 * 3600, 4, target=360, target_window_s=24 * 3600)
    assert law.required_workers == 8
    assert littles_law(392, 48 * 3600, 4).required_workers is None


def test_exact_integer_concurrency_is_not_rounded_up():
    # 10 tasks/h at 0.5 h each is exactly 5, not 6.
    law = littles_law(done=10, window_s=3600, workers=5, target=10)
    assert law.required_workers == 5


def test_seed_002_workers_per_process():
    w = workers_per_process(io_wait=25, cpu_time=4)
    assert w.raw == pytest.approx(7.25)
    assert w.workers == 7
    assert not w.capped
    capped = workers_per_process(io_wait=25, cpu_time=4, cap=4)
    assert capped.workers == 4 and capped.capped
    assert workers_per_process(0, 4).workers == 1  # pure CPU: one per process
    with pytest.raises(ValueError):
        workers_per_process(25, 0)


def test_seed_002_layout_processes_and_lanes():
    # 8 workers needed, at most 2 per process (the seed's choice): 4 processes, 10 partitions.
    lay = process_layout(8, 2)
    assert (lay.processes, lay.per_process, lay.total_slots, lay.lanes) == (4, 2, 8, 10)
    # At most 7 per process: 2 processes of 4, not 7 + 1.
    lay = process_layout(8, 7)
    assert (lay.processes, lay.per_process, lay.total_slots) == (2, 4, 8)
    assert process_layout(1, 8).lanes == 2
    with pytest.raises(ValueError):
        process_layout(0, 2)


@pytest.mark.parametrize(
    "text,unit,seconds",
    [
        ("200ms", "s", 0.2),
        ("0.2s", "s", 0.2),
        ("29m", "s", 29 * 60),
        ("48h", "s", 48 * 3600),
        ("2d", "s", 172800),
        ("90", "s", 90),
        ("200", "ms", 0.2),
        ("48", "h", 48 * 3600),
        (" 1.5 min ", "s", 90),
    ],
)
def test_parse_duration(text, unit, seconds):
    assert parse_duration(text, unit) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "abc", "10 parsecs", "-5s", "1e3s"])
def test_parse_duration_rejects(text):
    with pytest.raises(ValueError):
        parse_duration(text)


def test_format_duration():
    assert format_duration(0.2) == "200ms"
    assert format_duration(12.5) == "12.5s"
    assert format_duration(29.4 * 60) == "29.4 min"
    assert format_duration(5 * 3600) == "5.0 h"


# ---- the whole plan, as `corral plan` shows it ---------------------------------------------
def test_required_workers_from_a_known_mean_duration():
    r = required_workers(720, 48 * 3600, 29 * 60)
    assert r.required_concurrency == pytest.approx(7.25)
    assert r.required_workers == 8
    # An exact integer is not rounded up, as with littles_law.
    assert required_workers(10, 3600, 1800).required_workers == 5
    assert list(r.as_dict()) == ["target", "window_s", "mean_duration_s", "required_concurrency", "required_workers"]


def test_capacity_plan_of_the_worked_example_has_every_part():
    plan = capacity_plan(**WORKED_EXAMPLE)
    assert plan.concurrency_limit.limit == 14
    assert plan.littles_law.required_workers == 8
    assert plan.required is None
    assert plan.workers_per_process.workers == 7
    # (d) links (b) and (c): 8 workers, at most 7 a process -> 2 processes of 4.
    assert (plan.layout.concurrency, plan.layout.processes, plan.layout.per_process) == (8, 2, 4)
    assert list(plan.as_dict()) == ["concurrency_limit", "littles_law", "workers_per_process", "layout"]
    assert not plan.empty


def test_capacity_plan_leaves_out_parts_without_all_their_inputs():
    assert capacity_plan().empty
    assert capacity_plan().as_dict() == {}
    assert capacity_plan(qps=100).empty
    assert capacity_plan(done=392, window_s=48 * 3600).empty
    assert capacity_plan(target=720, mean_duration_s=29 * 60).empty, "no window to reach the target in"
    only_a = capacity_plan(qps=100, latency_s=0.2, safety=1.0)
    assert only_a.concurrency_limit.limit == 20 and only_a.layout is None
    # A measured run with no target gives a duration but no concurrency to lay out.
    measured = capacity_plan(done=392, window_s=48 * 3600, workers=4, io_wait=25, cpu_time=4)
    assert measured.littles_law.required_workers is None and measured.layout is None


def test_capacity_plan_layout_takes_what_it_is_given_over_what_it_derives():
    plan = capacity_plan(target=720, mean_duration_s=29 * 60, target_window_s=48 * 3600, io_wait=25, cpu_time=4, cap=2)
    assert plan.required.required_workers == 8
    assert (plan.layout.concurrency, plan.layout.max_per_process, plan.layout.processes) == (8, 2, 4)
    # The target window defaults to the measured one.
    assert capacity_plan(target=720, mean_duration_s=29 * 60, window_s=48 * 3600).required.required_workers == 8
    given = capacity_plan(done=392, window_s=48 * 3600, workers=4, target=720, concurrency=5, per_process=3)
    assert (given.layout.concurrency, given.layout.processes, given.layout.per_process) == (5, 2, 3)
    assert capacity_plan(concurrency=8, per_process=3).layout.processes == 3


def test_capacity_plan_rejects_values_out_of_range():
    for bad in [
        dict(qps=100, latency_s=0.2, safety=3),
        dict(done=0, window_s=3600, workers=4),
        dict(io_wait=25, cpu_time=0),
        dict(concurrency=0, per_process=2),
    ]:
        with pytest.raises(ValueError):
            capacity_plan(**bad)


def test_limit_advice_keeps_every_sliding_second_under_the_cap():
    from corral.core.planning import limit_advice

    a = limit_advice(100, 0.2)
    assert (a.concurrency, a.rate_per_s) == (40, 70)
    assert a.line("partner_api") == 'app.limit("partner_api", concurrency=40, rate="70/s")'
    tiny = limit_advice(1, 0.05)
    assert (tiny.concurrency, tiny.rate_per_s) == (1, 1)


# ---- from history -----------------------------------------------------------------------------
def _rows(durations, failed=()):
    """Tasks run one after another from t=0, each for its duration."""
    out, t = [], 0.0
    for i, d in enumerate(durations):
        out.append(planning.HistoryRow("FAILED" if i in failed else "SUCCESS", t, t + d, 1))
        t += d
    return out


def test_history_measures_durations_success_and_throughput():
    h = planning.history("task 'sync'", _rows(range(1, 11), failed={2, 7}), sample=100)
    assert (h.read, h.timed, h.successes, h.failures) == (10, 10, 8, 2)
    assert (h.p50_s, h.p99_s, h.mean_s) == (5, 10, 5.5)
    assert h.success_rate == 0.8 and h.window_s == 55 and h.throughput_per_s == pytest.approx(10 / 55)


def test_history_plan_fills_the_formulas_in():
    h = planning.history("task 'sync'", _rows([2.0] * 10, failed={0, 1}))
    hp = planning.history_plan(h, qps=100, safety=0.7, target=3600, target_window_s=3600)
    # Little's law: in flight = 10/20s x 2 s = 1; 1/s x 2 s = 2 workers; / 0.8 success = 2.5 -> 3
    assert hp.in_flight == pytest.approx(1.0)
    assert hp.required.required_concurrency == pytest.approx(2.0) and hp.required.required_workers == 2
    assert hp.attempts_per_success == pytest.approx(1.25)
    assert hp.required_with_retries == pytest.approx(2.5) and hp.workers_with_retries == 3
    # the limit: 100 QPS x 2 s x 0.7 = 140
    assert hp.limit.limit == 140 and not hp.qps_measured
    assert hp.advice.line("sync") == 'app.limit("sync", concurrency=400, rate="70/s")'


def test_history_plan_without_qps_uses_the_measured_throughput():
    hp = planning.history_plan(planning.history("batch 'b'", _rows([1.0] * 4)))
    assert hp.qps_measured and hp.qps == pytest.approx(1.0) and hp.limit.theoretical == pytest.approx(1.0)


def test_history_without_durations_cannot_be_planned():
    h = planning.history("task 'x'", [planning.HistoryRow("FAILED", None, 5.0, 1)])
    assert h.mean_s is None and h.success_rate == 0
    with pytest.raises(ValueError, match="no finished task with a measured duration"):
        planning.history_plan(h)
