"""The group history checker catches what it promises to catch."""

from __future__ import annotations

import pytest

from corral.testing import History, HistoryLog


def _run(h: History, task: int, group: str | None, start: float, end: float | None, worker: str = "w1") -> None:
    h.start(task, group, worker, lease=f"{task}@{start}", at=start)
    if end is not None:
        h.end(task, worker, lease=f"{task}@{start}", at=end)


def rules(h: History) -> list[str]:
    return sorted(v.rule for v in h.check())


def test_serial_in_order_history_passes_with_a_retried_head():
    h = History()
    _run(h, 1, "g", 0, 1)
    _run(h, 1, "g", 2, 3)  # the head again (a retry), before anything later
    _run(h, 2, "g", 3, 4)  # starts exactly at the head's final end
    _run(h, 3, "h", 0.5, 5)  # another group runs alongside
    _run(h, 4, None, 0, 9)
    _run(h, 5, None, 0, 9)  # ungrouped tasks overlap freely
    assert h.check() == []
    h.assert_ok()


def test_two_tasks_of_a_group_in_flight_at_once_are_caught():
    h = History()
    _run(h, 1, "g", 0, 2)
    _run(h, 2, "g", 1, 3, worker="w2")
    assert rules(h) == ["group-order", "group-overlap"]
    with pytest.raises(AssertionError, match="group 'g'"):
        h.assert_ok()


def test_a_later_task_before_the_heads_final_end_is_caught_without_overlap():
    h = History()
    _run(h, 1, "g", 0, 1)
    _run(h, 2, "g", 1.5, 2)  # runs in a gap between the head's attempts
    _run(h, 1, "g", 3, 4)  # the head's retry: its final end is 4
    assert rules(h) == ["group-order"]


def test_reordering_is_caught():
    h = History()
    _run(h, 2, "g", 0, 1)
    _run(h, 1, "g", 2, 3)
    assert rules(h) == ["group-order"]


def test_a_task_overlapping_itself_is_caught_even_ungrouped():
    h = History()
    _run(h, 7, None, 0, 5, worker="zombie")
    _run(h, 7, None, 1, 2, worker="w2")
    assert rules(h) == ["self-overlap"]
    h2 = History()
    _run(h2, 7, "g", 0, 5, worker="zombie")
    _run(h2, 7, "g", 1, 2, worker="w2")
    assert rules(h2) == ["self-overlap"]  # reported once, not also as a group overlap


def test_an_open_run_lasts_until_its_worker_died():
    h = History()
    _run(h, 1, "g", 0, None, worker="victim")
    _run(h, 1, "g", 5, 6, worker="w2")
    _run(h, 2, "g", 6, 7, worker="w2")
    # open for ever: the re-run overlaps it, and so does the next task of the group
    assert rules(h) == ["group-overlap", "self-overlap"]
    h.died("victim", at=4)
    assert h.check() == []


def test_explicit_order_wins_over_ids():
    h = History()
    h.start(10, "g", "w", at=0, order=2)
    h.end(10, "w", at=1)
    h.start(20, "g", "w", at=2, order=1)
    h.end(20, "w", at=3)
    assert rules(h) == ["group-order"]


def test_an_end_without_a_start_is_refused():
    with pytest.raises(ValueError, match="without a start"):
        History().end(1, "w")


def test_a_log_shared_by_processes_reads_back(tmp_path):
    path = tmp_path / "runs.jsonl"
    a, b = HistoryLog(path, worker="a"), HistoryLog(path, worker="b")
    a.start(1, "g", lease="x")
    a.end(1, lease="x")
    b.start(2, "g", lease="y")
    a.start(3, "g", lease="z")  # never ends: a is killed
    a.died("a")
    b.end(2, lease="y")
    h = History.load(path)
    assert [(r.task_id, r.worker) for r in h.runs] == [(1, "a"), (2, "b"), (3, "a")]
    assert all(r.end is not None for r in h.runs)
    assert rules(h) == ["group-order", "group-overlap"]  # 3 started while 2 ran
    assert History.load(tmp_path / "missing").check() == []


def test_a_line_being_appended_while_the_log_is_read_is_left_for_later(tmp_path):
    path = tmp_path / "runs.log"
    log = HistoryLog(path, worker="w1")
    log.start(1, "g")
    log.end(1)
    with open(path, "a") as f:
        f.write('{"e":"S","t":2,"g":"g","w":"w1"')  # a writer is mid-way through this line
    history = History.load(path)
    assert [(r.key, r.end is not None) for r in history.runs] == [(1, True)]
