"""`corral bench limits`: its figures, and a small run of the rate scenario.

The small runs are also the test that a rate limit holds across worker
processes: two `corral worker` processes share one partner capped at 20
calls in any sliding second, and the partner itself counts what reached it.
No timing is asserted beyond what the partner enforces."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from corral.bench import bench
from corral.bench.limits import (
    breaker_figures,
    breaker_targets,
    cooldown_at,
    open_spans,
    rate_figures,
    retry_targets,
    sustain_figures,
    sustain_targets,
    window_rates,
)
from corral.core.model import BreakerEvent
from corral.edges.partner import Call


def _ev(at: float, before: str, after: str) -> BreakerEvent:
    return BreakerEvent(at, "partner_api", before, after, "", 0, 0)


# ---- figures (pure) -----------------------------------------------------------------------
def test_window_rates_leave_out_the_first_and_the_unfinished_last_second():
    # t0 = 10.0; seconds [11, 12) and [12, 13) are whole; [13, 13.5] is cut short
    times = [10.0, 10.1, 10.2, 11.0, 11.5, 12.2, 12.3, 12.9, 13.5]
    assert window_rates(times) == [2, 3]
    assert window_rates([]) == []
    assert window_rates([1.0, 1.5]) == []


def test_rate_figures_count_the_partners_answers_and_the_burst():
    log = [Call(100.0 + i * 0.1, 200, worker="a" if i % 2 else "b") for i in range(40)]
    log.append(Call(101.0, 429, worker="a"))
    fig = rate_figures(log, cap=20, rate=10.0, burst=5)
    assert fig["ok"] == 40 and fig["over_cap"] == 1
    assert fig["busiest_second"] == 10
    assert fig["min_rate"] == 10 and fig["median_rate"] == 10
    assert fig["expected_s"] == 3.5  # (40 - 5 burst) / 10 per second
    assert fig["calls_by_worker"] == [20, 20]


def test_open_spans_and_the_cooldown_in_force():
    events = [
        _ev(1.0, "CLOSED", "OPEN"),
        _ev(6.0, "OPEN", "HALF_OPEN"),
        _ev(6.2, "HALF_OPEN", "OPEN"),
        _ev(16.2, "OPEN", "HALF_OPEN"),
        _ev(16.5, "HALF_OPEN", "CLOSED"),
    ]
    assert open_spans(events, 30.0) == [(1.0, 6.0), (6.2, 16.2)]
    assert open_spans(events[:1], 30.0) == [(1.0, 30.0)]
    assert cooldown_at(events, 0.5, 5.0) is None
    assert cooldown_at(events, 3.0, 5.0) == 5.0
    assert cooldown_at(events, 10.0, 5.0) == 10.0  # a failed probe doubled it
    assert cooldown_at(events, 20.0, 5.0) is None


def test_breaker_figures_count_claims_made_while_open_by_the_claim_time():
    events = [_ev(1.0, "CLOSED", "OPEN"), _ev(6.0, "OPEN", "HALF_OPEN"), _ev(6.5, "HALF_OPEN", "CLOSED")]
    log = [
        Call(0.5, 503, claimed=0.49),
        Call(1.002, 503, claimed=0.999),  # claimed before it opened, called just after
        Call(3.0, 503, claimed=2.99),  # claimed while OPEN: an attempt burned
        Call(6.1, 200, claimed=6.05),
        Call(7.0, 200, claimed=6.9),
    ]
    fig = breaker_figures(log, (0.0, 5.0), events, 5.0)
    assert fig["outage_calls"] == 3
    assert fig["claimed_while_open"] == 1
    assert fig["recovery_to_first_ok_s"] == pytest.approx(1.1)
    assert fig["cooldown_at_recovery_s"] == 5.0
    verdict = {t["name"]: t["met"] for t in breaker_targets({"outage_calls": 100}, fig)}
    assert verdict == {
        "fewer outage calls with the breaker": True,
        "attempts claimed while OPEN": False,
        "recovery to first success (s)": True,
    }


def test_retry_target_is_the_ratio_of_the_p99_waits():
    (t,) = retry_targets({"p99_wait_ms": 10.0}, {"p99_wait_ms": 35.0})
    assert t["value"] == 3.5 and t["met"] is False
    (t,) = retry_targets({"p99_wait_ms": 10.0}, {"p99_wait_ms": 15.0})
    assert t["met"] is True


def test_sustain_figures_count_the_stores_starts_and_the_rate_held():
    starts = [100.0 + i / 20 for i in range(220)]  # 20 a second, evenly
    log = [Call(t + 0.01, 200, worker="a" if i % 2 else "b") for i, t in enumerate(starts)]
    fig = sustain_figures(log, starts, 20)
    assert fig["busiest_second_store"] == 20 and fig["busiest_second"] == 20
    # the pacing bucket's 2 tokens at once, then 20 a second: (220 - 2) / 20 s over 219 / 20 s
    assert fig["sustained"] == pytest.approx(218 / 219, abs=1e-3)
    assert all(t["met"] for t in sustain_targets(fig, 20))
    crowded = sustain_figures(log, starts[:1] * 21 + starts[21:], 20)
    assert crowded["busiest_second_store"] == 21
    assert not sustain_targets(crowded, 20)[0]["met"]


# ---- a small run: the limit holds across two worker processes ---------------------------------
def _rate_run(*store_args: str) -> dict:
    args = ["limits", "--scenarios", "rate", "--tasks", "60", "--cap", "20", "--hand-tasks", "0"]
    args += ["--workers", "2", "--concurrency", "8", "--timeout", "60", "--json", "--no-progress", *store_args]
    result = CliRunner().invoke(bench, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["scenario"] == "limits"
    (rate,) = report["results"]
    (run,) = rate["runs"]
    return run


def _assert_the_limit_held(run: dict) -> None:
    # corral plan's advice for 20 QPS at 200 ms: 8 at once, 14/s, burst 3
    assert run["limit"] == {"concurrency": 8, "rate": "14/s"}
    assert run["succeeded"] == 60 and run["ok"] == 60
    assert run["over_cap"] == 0, "the partner refused calls over its cap"
    assert run["busiest_second"] <= 20
    # both processes drew from the one bucket
    assert len(run["calls_by_worker"]) == 2 and sum(run["calls_by_worker"]) == 60


@pytest.mark.slow
def test_rate_limit_holds_across_two_worker_processes_sqlite():
    _assert_the_limit_held(_rate_run("--store", "sqlite"))


@pytest.mark.slow
@pytest.mark.postgres
def test_rate_limit_holds_across_two_worker_processes_postgres(pg_admin_url):
    _assert_the_limit_held(_rate_run("--store", "postgres", "--pg-url", pg_admin_url))


def test_bench_limits_refuses_the_memory_store_and_unknown_scenarios():
    runner = CliRunner()
    result = runner.invoke(bench, ["limits", "--store", "memory"])
    assert result.exit_code == 2 and "shared store" in result.output
    result = runner.invoke(bench, ["limits", "--scenarios", "rate,speed"])
    assert result.exit_code == 2 and "unknown scenario(s) speed" in result.output


def test_adaptive_figures_from_the_partners_log():
    from corral.bench.limits import adaptive_figures, adaptive_targets

    t0 = 1000.0
    log = []
    # 10 s: 20/s, then 95/s; 1 throttle a second from 10 s; the cap halves at 20 s: 48/s
    for k in range(30):
        ok = 20 if k < 10 else (95 if k < 20 else 48)
        log += [Call(t0 + k + i / ok, 200) for i in range(ok)]
        if k >= 10:
            log.append(Call(t0 + k + 0.5, 429))
    fig = adaptive_figures(log, t0, 20, 10, 100)
    assert fig["ok_per_second"][:11] == [20] * 10 + [95]
    assert fig["seconds_to_90pct"] == 15  # the first 5 s window averaging 90/s: seconds 10-14
    assert fig["throttled_pct_first"] == round(100 * 10 / (200 + 950 + 10), 2)
    assert fig["seconds_to_85pct_after_halving"] == 5
    assert fig["throughput_after_halving_20s_on"] is None  # the run is too short for it
    met = {t["name"]: t["met"] for t in adaptive_targets(fig, 100, burned=0)}
    assert met["seconds to 90 % of 100/s (5 s average)"] and met["attempts burned"]
    assert met["calls throttled 10 s after the halving on (%)"] is None  # no seconds that late: not measured


def test_handover_measures_the_rate_the_old_leader_left_against_the_new_leaders_first_decisions():
    from corral.bench.limits import handover

    events = [(18.2, 95.0), (19.2, 97.0), (23.4, 99.0), (24.4, 88.0), (25.4, 90.0), (30.0, 50.0)]
    sampled = [(19.0, 95.0), (20.0, 97.0), (22.0, 97.0), (23.5, 99.0), (24.5, 88.0), (29.0, 90.0)]
    h = handover(sampled, events, 20.0)
    assert h["rate_left"] == 97.0 and h["first_decision_after_kill_s"] == 3.4
    assert h["seconds_without_a_decision"] == 4.2
    assert h["new_leaders_first_rate"] == 99.0 and h["furthest_pct"] == 2.1  # to its first decision, not beyond
    sampled[2] = (22.0, 86.0)  # a sag while no one led
    assert handover(sampled, events, 20.0)["furthest_pct"] == -11.3
    assert handover(sampled, events[:2], 20.0)["decided_again"] is None  # no new leader: no figure


def test_the_leader_is_read_from_the_workers_logs(tmp_path):
    from corral.bench.limits import _leader

    class Proc:
        def __init__(self, pid):
            self.pid = pid

    class Fleet:
        procs = [Proc(11), Proc(22)]
        killed: set[int] = set()
        logs = {
            0: "sweeper h:11:aa took the lead\nsweeper h:11:aa lost the lead\n",
            1: "x\nsweeper h:22:bb took the lead\n",
        }

        def log_text(self, k):
            return self.logs[k]

    assert _leader(Fleet()) == 1
    Fleet.logs = {0: "sweeper h:11:aa took the lead\n", 1: "nothing\n"}
    assert _leader(Fleet()) == 0
    Fleet.killed = {0}
    assert _leader(Fleet()) is None
