"""Tiny runs of `corral bench`: the JSON has its fields and corral keeps group
order. No timing is asserted here; timing goals live in docs/benchmarks.md."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from corral.bench import bench

GROUP_FIELDS = {
    "variant",
    "label",
    "tasks",
    "completed",
    "wall_s",
    "ideal_s",
    "efficiency",
    "p95_latency_ms",
    "out_of_order",
    "rejections",
    "duplicates",
    "peak_rss_mb",
}


def _run(*args: str) -> dict:
    result = CliRunner().invoke(bench, list(args), catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_groups_memory_all_variants():
    report = _run("groups", "--tasks", "300", "--groups", "10", "--chunk-size", "5", "--json", "--no-progress")
    assert report["scenario"] == "groups"
    by_variant = {r["variant"]: r for r in report["variants"]}
    assert set(by_variant) == {"A", "B", "C"}
    for r in by_variant.values():
        assert GROUP_FIELDS <= set(r)
        assert r["completed"] == 300
    c = by_variant["C"]
    assert c["out_of_order"] == 0
    assert c["rejections"] == 0
    assert c["duplicates"] == 0


def test_groups_sqlite_worker_process():
    report = _run(
        "groups",
        "--tasks",
        "200",
        "--groups",
        "8",
        "--variants",
        "C",
        "--store",
        "sqlite",
        "--workers",
        "1",
        "--chunk-size",
        "5",
        "--json",
        "--no-progress",
    )
    (c,) = report["variants"]
    assert GROUP_FIELDS <= set(c)
    assert c["store"] == "sqlite"
    assert c["completed"] == 200
    assert c["out_of_order"] == 0


def test_throughput_memory():
    report = _run(
        "throughput",
        "--store",
        "memory",
        "--tasks",
        "300",
        "--io-tasks",
        "60",
        "--latency-tasks",
        "5",
        "--pause",
        "0.005",
        "--json",
        "--no-progress",
    )
    assert report["scenario"] == "throughput"
    assert report["enqueue"]["rate"] > 0
    assert report["process"][0]["rate"] > 0
    assert report["process"][1]["skipped"]
    (io,) = report["io"]
    assert 0 < io["efficiency"]
    assert 0 < io["claims"] <= 60 and io["claim_ms"] > 0
    assert report["latency"]["measured"] == 5


def test_throughput_memory_with_a_simulated_claim_round_trip():
    report = _run(
        "throughput",
        "--store",
        "memory",
        "--only",
        "io",
        "--io-tasks",
        "40",
        "--claim-delay-ms",
        "0,2",
        "--json",
        "--no-progress",
    )
    plain, delayed = report["io"]
    assert (plain["claim_delay_ms"], delayed["claim_delay_ms"]) == (0, 2)
    # the added round trip is part of every claim's measured time (a sleep lasts at
    # least its length; how fast a plain claim is belongs to benchmarks, not tests)
    assert delayed["claim_ms"] >= 2.0 and plain["claim_ms"] > 0


def test_throughput_with_groups():
    report = _run(
        "throughput",
        "--store",
        "sqlite",
        "--only",
        "process",
        "--processes",
        "1",
        "--tasks",
        "120",
        "--groups",
        "7",
        "--json",
        "--no-progress",
    )
    (run,) = report["process"]
    assert run["groups"] == 7 and run["rate"] > 0 and run["duplicates"] == 0


@pytest.mark.skipif(not __import__("os").path.isdir("/proc/self/task"), reason="reads /proc (Linux)")
def test_throughput_profile_says_where_the_workers_cpu_went():
    report = _run(
        "throughput", "--store", "sqlite", "--only", "process", "--processes", "2", "--tasks", "300",
        "--profile", "--json", "--no-progress",
    )  # fmt: skip
    prof = report["process"][0]["profile"]
    us = prof["us_per_task"]
    # every task was claimed, run in a slot and completed by a worker process that wrote its profile
    assert us["store.claim"] > 0 and us["store.complete"] > 0 and us["slots"] > 0
    assert prof["calls"]["claim"] >= 2  # one claim at least in each of the two processes
    assert prof["total_us_per_task"] >= sum(us.values()) - 1


def test_claim_delay_is_for_memory_only():
    result = CliRunner().invoke(bench, ["throughput", "--store", "sqlite", "--claim-delay-ms", "0.5"])
    assert result.exit_code != 0
    assert "memory only" in result.output


def test_bad_variant_is_a_usage_error():
    result = CliRunner().invoke(bench, ["groups", "--variants", "Z"])
    assert result.exit_code != 0
    assert "unknown variant" in result.output


@pytest.mark.parametrize(
    "args",
    [
        ["groups", "--tasks", "0"],
        ["throughput", "--processes", "x"],
        ["throughput", "--store", "memory", "--claim-delay-ms", "-1"],
        ["latency", "--rates", "0"],
        ["latency", "--rates", "x"],
        ["latency", "--store", "memory"],
        ["latency", "--seconds", "2", "--warmup", "2"],
    ],
)
def test_bad_numbers(args):
    assert CliRunner().invoke(bench, args).exit_code != 0


def test_dag_memory_and_sqlite():
    report = _run(
        "dag", "--nodes", "60", "--layers", "6", "--slots", "4", "--duration", "0.001", "--json", "--no-progress"
    )
    assert report["scenario"] == "dag"
    assert [r["store"] for r in report["runs"]] == ["memory", "sqlite"]
    for r in report["runs"]:
        assert r["nodes"] == 60 and r["layers"] == 6 and r["slots"] == 4
        assert r["ideal_makespan_s"] == pytest.approx(max(r["critical_path_s"], r["total_work_s"] / 4), abs=1e-3)
        assert 0 < r["ratio"] and r["makespan_s"] > 0
        assert r["parallelism"] == pytest.approx(r["parallelism_bound"] * r["ratio"], rel=0.02, abs=0.02)


def test_dag_graph_is_the_same_for_a_seed():
    from corral.bench.dag import layered_graph

    g = layered_graph(1000, 20, 3, seed=7)
    assert g == layered_graph(1000, 20, 3, seed=7)
    assert len(g) == 1000 and all(not deps for deps in g[:50])
    assert all(
        1 <= len(deps) <= 3 and all(50 * (i // 50 - 1) <= j < 50 * (i // 50) for j in deps)
        for i, deps in enumerate(g)
        if i >= 50
    )


LATENCY_FIELDS = {
    "rate",
    "submitted",
    "submit_rate",
    "measured",
    "started",
    "missing",
    "duplicates",
    "p50_ms",
    "p95_ms",
    "p99_ms",
    "max_ms",
    "pickup_p50_ms",
    "pickup_p95_ms",
    "pickup_p99_ms",
    "submit_call_p50_ms",
    "submit_call_p99_ms",
    "late_p99_ms",
}


def _latency_run(*args: str) -> dict:
    report = _run("latency", *args, "--rates", "50", "--seconds", "2", "--warmup", "0.5", "--json", "--no-progress")
    assert report["scenario"] == "latency"
    (run,) = report["runs"]
    assert run["workers"] == 2 and run["warmup_s"] == 0.5
    (r,) = run["results"]
    return {"store": run["store"], **r}


def test_latency_sqlite():
    # two submitting processes share the schedule: every task of it is submitted once
    r = _latency_run("--store", "sqlite", "--submitters", "2")
    _assert_sane_latency(r, "sqlite")
    assert r["submitters"] == 2 and r["submitted"] == 100


@pytest.mark.postgres
def test_latency_postgres(pg_admin_url):
    _assert_sane_latency(_latency_run("--store", "postgres", "--pg-url", pg_admin_url), "postgres")


def _assert_sane_latency(r: dict, store: str) -> None:
    assert r["store"] == store
    assert LATENCY_FIELDS <= set(r)
    assert r["rate"] == 50 and r["submitted"] > 0 and r["submitters"] >= 1
    # the first 0.5 s are warm-up: about three quarters of 2 s of submits are measured
    assert 0 < r["measured"] < r["submitted"]
    assert r["started"] == r["measured"] and r["missing"] == 0 and r["duplicates"] == 0
    assert 0 < r["submit_rate"] <= 50 * 1.05
    assert 0 < r["p50_ms"] <= r["p95_ms"] <= r["p99_ms"] <= r["max_ms"]
    # the pickup is the part of submit-to-start after the submit call returned (each task's pickup
    # is its submit-to-start less its submit call); a task may start before its submit call
    # returns, so the call's median is not bounded by submit-to-start's
    assert r["pickup_p50_ms"] <= r["p50_ms"] and r["submit_call_p50_ms"] > 0


def test_latency_schedule_is_steady_and_open_loop():
    from corral.bench.latency import figures, submit_steady

    class Clock:
        now = 0.0

        def __call__(self) -> float:
            return self.now

        def sleep(self, s: float) -> None:
            self.now += s

    clock = Clock()
    calls: list[float] = []

    def slow_submit(i: int) -> None:  # the 3rd submit takes 0.1 s: the next ones go at once until on time
        calls.append(clock.now)
        clock.now += 0.1 if i == 2 else 0.001

    sub = submit_steady(slow_submit, 100.0, 0.2, clock=clock, wall=clock, sleep=clock.sleep)
    assert len(sub) == 20 and calls[:3] == pytest.approx([0.0, 0.01, 0.02])
    assert calls[3:5] == pytest.approx([0.12, 0.121]) and sub.late[3] == pytest.approx(0.09)  # behind: no wait
    assert calls[-1] == pytest.approx(0.19)  # on time again, never ahead of its schedule
    assert all(c >= i / 100.0 - 1e-9 for i, c in enumerate(calls))

    starts = {i: sub.after[i] + 0.002 for i in range(20) if i != 19}  # the last one never started
    fig = figures(sub, starts, 100.0, warmup=0.05)
    assert fig["measured"] == 17 and fig["started"] == 16 and fig["missing"] == 1
    assert fig["pickup_p50_ms"] == pytest.approx(2.0)
    assert fig["max_ms"] is None  # a task that never started is slower than any that did


def test_latency_submitters_share_one_schedule():
    """Submitters k of n take the tasks k, k + n, ... of one schedule, each
    at its own due time; their notes merge in the schedule's order. The
    default gives one submitter per 150/s of the rate."""
    from corral.bench.latency import Submits, submit_steady, submitters_for

    parts = []
    for k in range(3):
        calls: list[tuple[int, float]] = []
        now = [0.0]

        def submit(i: int, calls=calls, now=now) -> None:
            calls.append((i, now[0]))
            now[0] += 0.001

        def sleep(s: float, now=now) -> None:
            now[0] += s

        part = submit_steady(
            submit,
            100.0,
            0.2,
            first=k,
            step=3,
            start=0.0,
            clock=lambda now=now: now[0],
            wall=lambda now=now: now[0],
            sleep=sleep,
        )
        assert [i for i, _ in calls] == list(range(k, 20, 3))
        assert [t for _, t in calls] == pytest.approx([i / 100.0 for i in range(k, 20, 3)])
        parts.append(part)
    merged = Submits.merged(parts)
    assert list(merged.ids) == list(range(20))
    assert list(merged.before) == pytest.approx([i / 100.0 for i in range(20)])
    assert merged.elapsed == max(p.elapsed for p in parts)
    assert [submitters_for(r) for r in (50, 100, 150, 151, 300, 1000)] == [1, 1, 1, 2, 2, 7]


def test_dashboard_bench_fetches_every_page_of_a_store_with_queued_work():
    report = _run("dashboard", "--tasks", "500", "--queued", "100", "--repeat", "1", "--json")
    assert report["queued"] == 100
    pages = {p["page"]: p for p in report["pages"]}
    assert {"/tasks?status=PENDING", "/tasks?status=RUNNING", "/over-time?window=day", "/schedules"} <= set(pages)
    assert [p["page"] for p in report["pages"] if p["status"] != 200] == []


def test_the_live_cost_counts_the_store_calls_of_a_dashboard_by_method():
    from corral.bench.live_cost import CountingStore
    from corral.edges.dashboard.sampler import Sampler
    from corral.stores import open_store

    store = CountingStore(open_store("memory://"))
    Sampler(store).tick()  # type: ignore[arg-type]
    Sampler(store).tick()  # type: ignore[arg-type]
    calls = store.taken()
    assert calls["active_counts"] == 2 and calls["limits"] == 2
    assert store.taken() == {}  # taken: counted again from zero


def test_dashboard_live_cost_runs_both_sides_and_the_stream_is_read():
    report = _run("dashboard", "--live-cost", "--rounds", "2", "--w1-tasks", "300", "--processes", "1", "--json")
    # pairs of turns, their order alternating
    assert [(t["pair"], t["live"]) for t in report["turns"]] == [(1, False), (1, True), (2, True), (2, False)]
    for live in (t for t in report["turns"] if t["live"]):
        assert live["stream_events"]["snapshot"] >= 1 and live["dashboard_cpu_s"] >= 0
        assert isinstance(live["store_calls"], dict)  # by method, counted in the dashboard's process
    assert len(report["pair_ratios"]) == 2
    assert report["ratio"]["min"] <= report["ratio"]["median"] <= report["ratio"]["max"]
    assert {"median_off", "median_on", "cost_pct", "dashboard_core_share", "store_calls_per_s"} <= set(report)
    assert len(report["load_before"]) == 3


SOAK_FIELDS = {
    "t_s",
    "phase",
    "offered_per_s",
    "started_per_s",
    "pending",
    "pickup_p50_ms",
    "pickup_p95_ms",
    "table_mb",
    "indexes_mb",
    "n_dead_tup",
    "events_dead",
    "events_live",
    "events_mb",
    "index_reads_per_scan",
    "claim_shape_ms",
}


@pytest.mark.postgres
def test_soak_pins_the_horizon_mid_run(pg_admin_url):
    args = ("--rate", "50", "--duration", "9s", "--pin-minutes", "0.05", "--sample", "3s", "--readers", "1")
    r = _run("soak", "--pg-url", pg_admin_url, *args, "--events-keep", "50", "--json")
    assert r["scenario"] == "soak" and r["rate"] == 50 and r["pin_s"] == 3 and r["pin_from_s"] == 3
    assert r["events_keep"] == 50
    assert [s["phase"] for s in r["samples"]] == ["clean", "pinned", "after"]
    assert all(SOAK_FIELDS <= set(s) for s in r["samples"])
    assert set(r["phases"]) == {"clean", "pinned", "after"}
    assert r["submitted"] > 0 and r["duplicates"] == 0
    assert sum(p["tasks"] for p in r["phases"].values()) == r["submitted"]
    assert all(p["missing"] == 0 for p in r["phases"].values())
