"""``corral bench overload``: its figures from notes and marks, and one short run."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from corral.bench import bench
from corral.bench.latency import Submits, submit_steady
from corral.bench.overload import capacity_of, level_changes, windows


def test_refused_submits_are_noted_apart():
    """A submit the store refuses (the call returns False) is noted as refused, and the schedule goes on."""
    now = [0.0]

    def submit(i: int) -> bool:
        now[0] += 0.001
        return i % 4 != 3

    sub = submit_steady(submit, 100.0, 0.2, clock=lambda: now[0], wall=lambda: now[0], sleep=lambda s: None)
    assert len(sub) == 20 and list(sub.refused) == [3, 7, 11, 15, 19]
    other = Submits()
    other.refused.append(1)
    assert list(Submits.merged([sub, other]).refused) == [1, 3, 7, 11, 15, 19]


def test_capacity_leaves_out_the_ramp_and_the_tail():
    # 1 000 starts a second, then a slow tail of 10 % that would halve a rate over all of them
    starts = [i / 1000.0 for i in range(900)] + [0.9 + i * 0.01 for i in range(100)]
    assert capacity_of(starts) == pytest.approx(1000.0, rel=0.01)
    assert capacity_of([1.0, 1.0, 1.0]) is None


def test_windows_count_throughput_backlog_pickup_and_level():
    sub = Submits()
    for i in range(40):  # 2 s of 20 submits a second; the first 20 start 50 ms after their submit returned
        sub.ids.append(i)
        sub.before.append(100.0 + i * 0.05)
        sub.after.append(100.0 + i * 0.05)
        sub.late.append(0.0)
    starts = {i: 100.0 + i * 0.05 + 0.05 for i in range(20)}
    samples = [(100.5, 7, 0, 0, ""), (101.5, 30, 0, 1, "signals call for WARNING")]
    w = windows(sub, starts, samples, 100.0, 102.0, 1.0, capacity=20.0)
    assert [x["throughput"] for x in w] == [19.0, 1.0]  # the 20th started just after the first second
    assert [x["submits"] for x in w] == [20.0, 20.0]
    assert [x["backlog"] for x in w] == [7, 30]
    assert [x["level"] for x in w] == ["NORMAL", "WARNING"]
    assert w[0]["of_capacity"] == pytest.approx(0.95) and w[0]["pickup_p50_ms"] == pytest.approx(50.0)
    changes = level_changes(samples + [(102.5, 30, 0, 1, "")], 100.0)
    assert [(c["at_s"], c["level"], c["backlog"]) for c in changes] == [(0.5, "NORMAL", 7), (1.5, "WARNING", 30)]


def test_overload_sqlite_short_run_with_a_bound():
    """Capacity, overload and drain end to end; a small bound refuses submits and loses none it took."""
    result = CliRunner().invoke(
        bench,
        [
            "overload",
            "--store",
            "sqlite",
            "--seconds",
            "3",
            "--task-ms",
            "20",
            "--capacity-tasks",
            "300",
            "--max-queued",
            "40",
            "--window",
            "1",
            "--json",
            "--no-progress",
        ],
    )
    assert result.exit_code == 0, result.output
    (run,) = json.loads(result.output)["runs"]
    assert run["store"] == "sqlite" and run["capacity"] > 0 and run["max_queued"] == 40
    assert run["offered"] == pytest.approx(run["capacity"] * 1.5, rel=0.01)
    assert run["refused"] > 0 and run["missing"] == 0 and run["duplicates"] == 0
    assert run["peak_backlog"] is not None and len(run["windows"]) >= 3
    assert run["levels"] and run["levels"][0]["level"] == "NORMAL"


@pytest.mark.parametrize(
    "args",
    [["--store", "memory"], ["--seconds", "0"], ["--capacity-tasks", "10"], ["--factor", "0"]],
)
def test_overload_bad_numbers(args):
    assert CliRunner().invoke(bench, ["overload", *args]).exit_code != 0
