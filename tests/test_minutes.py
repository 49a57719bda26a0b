"""The minutes' figures, pure: a minute's rows per queue and task name
(bounded names), and minutes drawn as points."""

from __future__ import annotations

from corral.core.minutes import NAMES_PER_MINUTE, OTHER, QUEUE_ROW, FinishedRun, MinuteStat, aggregate, buckets


def run(i: int, name: str = "t", queue: str = "q", status: str = "SUCCESS", took: float = 1.0) -> FinishedRun:
    return FinishedRun(i, name, queue, status, run_at=100.0, started_at=100.0 + i, finished_at=100.0 + i + took)


def test_a_minute_has_a_row_per_queue_and_per_busiest_name():
    runs = [run(i, took=float(i)) for i in range(1, 101)] + [run(200, "x", status="TIMEOUT")]
    rows = aggregate(120, runs, {"q": 5, "idle": 3})
    by = {(r.queue, r.name): r for r in rows}
    q = by[("q", QUEUE_ROW)]
    assert (q.done, q.failed, q.depth) == (101, 1, 5)
    t = by[("q", "t")]
    assert (t.done, t.dur_p50, t.dur_p99, t.depth) == (100, 50.0, 99.0, 0)
    assert t.wait_p50 == 50.0  # started_at - run_at
    assert by[("idle", QUEUE_ROW)].done == 0 and by[("idle", QUEUE_ROW)].depth == 3


def test_names_beyond_the_busiest_are_one_row():
    runs = [run(i, f"n{i:03d}") for i in range(NAMES_PER_MINUTE + 5)]
    rows = aggregate(0, runs, {})
    names = [r.name for r in rows if r.name != QUEUE_ROW]
    assert len(names) == NAMES_PER_MINUTE + 1 and names[-1] == OTHER
    assert next(r for r in rows if r.name == OTHER).done == 5


def test_points_add_counts_and_keep_the_worst_p99():
    def m(minute, done, p99, depth=0, queue="q"):
        return MinuteStat(minute, queue, QUEUE_ROW, done, 0, depth, 1.0, p99, 0.1, 0.2)

    rows = [m(0, 1, 2.0, 4), m(60, 2, 5.0, 6), m(60, 1, 1.0, 1, queue="r"), m(180, 4, 1.0)]
    pts = buckets(rows, 0, 240, 120)
    assert [(p.start, p.done, p.dur_p99, p.depth) for p in pts] == [(0, 4, 5.0, 7), (120, 4, 1.0, 0)]
    assert buckets([], 0, 180, 60)[1].done == 0 and buckets([], 0, 180, 60)[1].dur_p50 is None
