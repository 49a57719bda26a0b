"""Tiny runs of `corral bench scale` and `corral bench processes`: the JSON
has its fields and every task ran. No timing is asserted here."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from corral.bench import bench
from corral.bench.scale import checkpoints, tenths


def _run(*args: str) -> dict:
    result = CliRunner().invoke(bench, list(args), catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_reported_slices_are_the_first_10k_100k_and_the_last():
    assert checkpoints(1_000_000, 10_000) == [10_000, 100_000, 1_000_000]
    assert checkpoints(50_000, 1_000) == [1_000, 10_000, 50_000]
    assert checkpoints(300, 100) == [100, 300]
    assert checkpoints(50, 100) == [50]


def test_submit_rates_per_tenth_weigh_each_slice_by_its_time():
    # 100 slices of 10 tasks: the first ten at 10/s, the rest at 20/s
    rates = [10.0] * 10 + [20.0] * 90
    by_tenth = tenths(rates, [10] * 100)
    assert by_tenth == [10.0] + [20.0] * 9
    # two slices of 10 at 10/s and 30/s: 20 tasks in 1.33 s, not the mean of the rates
    assert tenths([10.0, 30.0] * 10, [10] * 20)[0] == 15.0
    assert tenths([5.0, 7.0], [1, 1]) == [5.0, 7.0]


def test_scale_sqlite():
    report = _run(
        "scale",
        *("--store", "sqlite", "--tasks", "600", "--groups", "20", "--slice", "200"),
        *("--workers", "2", "--concurrency", "2", "--latency-tasks", "5", "--json", "--no-progress"),
    )
    assert report["scenario"] == "scale"
    assert [s["at"] for s in report["submit"]["slices"]] == [200, 600]
    assert len(report["submit"]["slice_rates"]) == 3
    assert len(report["submit"]["tenths"]) == 3 and all(v > 0 for v in report["submit"]["tenths"])
    bare = report["submit"]["bare_line_index_tenths"]  # the B-tree's own cost, beside the store's
    assert len(bare) == 3 and all(v > 0 for v in bare)
    drain = report["drain"]
    assert drain["tasks"] == 600
    assert [s["at"] for s in drain["slices"]] == [200, 600]
    assert drain["slices"][0]["claims"] > 0  # a later slice may lie inside one big claim
    for s in drain["slices"]:
        if s["claims"]:
            assert s["claim_p50_ms"] is not None
            # claims are compared per task they brought: the worker sizes them
            assert 1 <= s["tasks_per_claim"] <= 600
            assert 0 < s["claim_us_per_task_p50"] <= s["claim_p99_ms"] * 1000
        assert s["worker_rss_max_mb"] is None or s["worker_rss_max_mb"] > 0
    assert report["latency_fresh"]["measured"] == 5
    assert report["latency_after"]["measured"] == 5


def test_scale_bounded_drain_skips_the_latency_after():
    report = _run(
        "scale",
        *("--store", "sqlite", "--tasks", "400", "--groups", "10", "--slice", "100", "--drain", "200"),
        *("--concurrency", "2", "--latency-tasks", "0", "--no-reference", "--json", "--no-progress"),
    )
    assert "bare_line_index_tenths" not in report["submit"]
    assert report["drain"]["tasks"] == 200
    assert [s["at"] for s in report["drain"]["slices"]] == [100, 200]
    assert "latency_fresh" not in report and "latency_after" not in report


@pytest.mark.postgres
def test_processes_postgres(pg_admin_url):
    report = _run(
        "processes",
        *("--pg-url", pg_admin_url, "--processes", "1,2", "--tasks", "300", "--concurrency", "2"),
        *("--json", "--no-progress"),
    )
    assert [r["processes"] for r in report["runs"]] == [1, 2]
    for r in report["runs"]:
        assert r["tasks_per_s"] > 0 and r["claims"] > 0
        assert r["xact_per_task"] > 0


@pytest.mark.parametrize(
    "args",
    [
        ["scale", "--store", "memory"],
        ["scale", "--tasks", "0"],
        ["processes", "--processes", "0"],
        ["processes", "--processes", "x"],
    ],
)
def test_bad_arguments(args):
    result = CliRunner().invoke(bench, args)
    assert result.exit_code != 0
