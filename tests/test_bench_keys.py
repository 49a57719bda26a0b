"""`corral bench keys`: the checker of a key's bounds and the ideal it is held
to (pure), and tiny runs of the command. No timing is asserted here."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from corral.bench import bench
from corral.bench.keys import (
    Run,
    broken_bounds,
    ideal_seconds,
    key_figures,
    key_schedule,
    most_in_flight,
    most_in_window,
    tasks_for,
)


def test_in_flight_counts_overlaps_and_not_touching_runs():
    assert most_in_flight([]) == 0
    assert most_in_flight([(0, 1), (1, 2), (2, 3)]) == 1  # an end and a start at one instant
    assert most_in_flight([(0, 1), (0.5, 1.5), (0.9, 2)]) == 3
    assert most_in_flight([(0, 10), (1, 2), (3, 4), (5, 6)]) == 2


def test_starts_in_a_sliding_window_are_counted_half_open():
    assert most_in_window([], 1.0) == 0
    assert most_in_window([0.0, 0.2, 0.4, 0.6, 0.8, 1.0], 1.0) == 5  # 1.0 is out of [0, 1)
    assert most_in_window([0.0, 0.2, 0.4, 0.6, 0.8, 0.99], 1.0) == 6
    assert most_in_window([5.0, 0.0, 5.5, 5.9, 0.5], 1.0) == 3  # order does not matter


def _history(key_runs):
    return [Run(key, s, e, s) for key, runs in key_runs.items() for s, e in runs]


def test_a_third_in_flight_on_one_key_is_a_broken_bound():
    ok = {"a": [(0, 1), (0, 1), (1, 2)], "b": [(0, 1), (0.5, 1.5)]}
    fig = key_figures(_history(ok))
    assert fig["max_in_flight"] == 2 and broken_bounds(fig, 2, 5) == []
    bad = {**ok, "c": [(0, 1), (0.2, 1.2), (0.4, 0.6)]}
    fig = key_figures(_history(bad))
    assert (fig["max_in_flight"], fig["max_in_flight_key"]) == (3, "c")
    (why,) = broken_bounds(fig, 2, 5)
    assert "'c' had 3 in flight (bound 2)" in why


def test_a_sixth_start_in_a_second_is_a_broken_bound_on_the_store_starts():
    runs = [Run("k", 0.1 * i, 0.1 * i + 0.05, 0.15 * i) for i in range(6)]  # store starts 0 .. 0.75
    fig = key_figures(runs)
    assert fig["max_starts_per_window"] == 6 and fig["max_starts_key"] == "k"
    assert any("started 6 in one sliding second (bound 5)" in b for b in broken_bounds(fig, 2, 5))
    spread = [Run("k", 0.3 * i, 0.3 * i + 0.05, 0.3 * i) for i in range(6)]  # 0 .. 1.5: at most 4 a second
    assert broken_bounds(key_figures(spread), 2, 5) == []


def test_the_ideal_is_the_earliest_schedule_both_bounds_allow():
    # d = 0.25, C = 2, R = 5: two at once, the window closes after five starts
    assert key_schedule(10, 0.25, 2, 5) == [0, 0, 0.25, 0.25, 0.5, 1.0, 1.0, 1.25, 1.25, 1.5]
    assert ideal_seconds(10, 0.25, 2, 5) == pytest.approx(1.75)
    assert ideal_seconds(0, 0.25, 2, 5) == 0.0
    # the steady state: max(N / R, N d / C) for large N
    assert ideal_seconds(500, 0.1, 2, 5) == pytest.approx(500 / 5, rel=0.01)
    assert ideal_seconds(500, 1.0, 2, 5) == pytest.approx(500 * 1.0 / 2, rel=0.01)
    assert tasks_for(10, 0.25, 2, 5) == 50 and tasks_for(10, 1.0, 2, 5) == 20


def test_bench_keys_sqlite_tiny_run():
    result = CliRunner().invoke(
        bench,
        [
            "keys",
            "--keys",
            "4",
            "--tasks-per-key",
            "6",
            "--duration",
            "0.05",
            "--workers",
            "2",
            "--json",
            "--no-progress",
        ],
        catch_exceptions=False,
    )
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["scenario"] == "keys" and report["broken"] == []
    keyed, plain = report["keyed"], report["plain"]
    assert keyed["ran"] == keyed["tasks"] == 24 and plain["ran"] == 24
    assert keyed["keys"] == 4 and keyed["duplicates"] == 0
    assert keyed["max_in_flight"] <= 2 and keyed["max_starts_per_window"] <= 5
    assert report["ideal_s"] == pytest.approx(ideal_seconds(6, 0.05, 2, 5), abs=1e-3)
    assert report["throughput_ratio"] > 0 and report["keyed_vs_plain"] > 0


def test_bench_keys_claim_cost_memory():
    result = CliRunner().invoke(
        bench,
        [
            "keys",
            "--claim-cost",
            "--store",
            "memory",
            "--active-keys",
            "50",
            "--queued",
            "60",
            "--claims",
            "5",
            "--warmup",
            "1",
            "--json",
            "--no-progress",
        ],
        catch_exceptions=False,
    )
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout.strip().splitlines()[-1])
    by = {r["variant"]: r for r in report["results"]}
    assert set(by) == {"none", "limit", "keyed", "keyed_rate"}
    assert by["none"]["ratio"] == 1.0 and by["keyed"]["active_keys"] == 50
    assert all(r["held"] == 50 and r["tasks_per_claim"] == 10 for r in by.values())


@pytest.mark.parametrize(
    "args",
    [
        ["keys", "--store", "memory"],
        ["keys", "--keys", "0"],
        ["keys", "--claim-cost", "--queued", "10"],
        ["keys", "--claim-cost", "--claim-limits", "zz"],
    ],
)
def test_bench_keys_bad_input_is_refused(args):
    result = CliRunner().invoke(bench, args)
    assert result.exit_code != 0
