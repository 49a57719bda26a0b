"""A history checker for groups: did every group run one task at a time, in submit order?

Record every run of a task where it really happens (inside the task body, or
around it): its start and its end, with the task id, group, worker and lease.
Then :meth:`History.check` verifies, over every run that happened (runs a
crashed or stalled worker made included), that

- no task overlaps itself: a task runs again only once its previous run ended;
- each group runs serially: no two runs of one group overlap;
- each group runs in submit order: a retry of the head may run again, but no
  later task of the group starts before the head's final end (the end of its
  last run).

Submit order is the order of task ids (ids increase with submit), unless a run
gives ``order`` explicitly. Times are monotonic seconds
(:func:`time.monotonic`, which is one clock for every process of a machine).

A run whose end was never recorded is open until the end of the history, unless
its worker is known to have died (:meth:`History.died`): then it ended then.

Several processes record into one file through :class:`HistoryLog` (one
``O_APPEND`` write per line, so lines never interleave), read back with
:meth:`History.load`.
"""

from __future__ import annotations

import json
import math
import os
import threading
import time
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path


@dataclass(slots=True)
class Run:
    """One execution of a task. ``end`` None: never seen to end."""

    task_id: int
    group: str | None
    worker: str
    lease: str | None
    start: float
    end: float | None = None
    order: int | None = None

    @property
    def key(self) -> int:
        return self.task_id if self.order is None else self.order

    def until(self) -> float:
        return math.inf if self.end is None else self.end

    def __str__(self) -> str:
        end = "open" if self.end is None else f"{self.end:.6f}"
        return f"task {self.task_id} on {self.worker} [{self.start:.6f} .. {end}]"


@dataclass(frozen=True, slots=True)
class Violation:
    """One broken rule, with the two runs that break it."""

    rule: str  # "self-overlap", "group-overlap" or "group-order"
    group: str | None
    first: Run
    second: Run

    def __str__(self) -> str:
        where = f"group {self.group!r}" if self.group is not None else "ungrouped"
        return f"{self.rule} in {where}: {self.second} started while {self.first} had not ended"


class History:
    """Starts and ends of task runs, and the checks over them. Thread-safe."""

    def __init__(self) -> None:
        self.runs: list[Run] = []
        self._open: dict[tuple[int, str, str | None], list[Run]] = defaultdict(list)
        self._lock = threading.Lock()

    def start(
        self,
        task_id: int,
        group: str | None,
        worker: str,
        lease: str | None = None,
        at: float | None = None,
        order: int | None = None,
    ) -> Run:
        """Record that ``worker`` started a run of ``task_id`` (at ``at``, default now)."""
        run = Run(task_id, group, worker, lease, time.monotonic() if at is None else at, order=order)
        with self._lock:
            self.runs.append(run)
            self._open[(task_id, worker, lease)].append(run)
        return run

    def end(self, task_id: int, worker: str, lease: str | None = None, at: float | None = None) -> Run:
        """Record that the latest open run of ``task_id`` by ``worker`` under ``lease`` ended."""
        with self._lock:
            stack = self._open.get((task_id, worker, lease))
            if not stack:
                raise ValueError(f"end of task {task_id} on {worker} (lease {lease}) without a start")
            run = stack.pop()
            run.end = time.monotonic() if at is None else at
        return run

    def died(self, worker: str, at: float) -> None:
        """``worker`` died at ``at``: its open runs (started before then) ended then."""
        with self._lock:
            for run in self.runs:
                if run.worker == worker and run.end is None and run.start <= at:
                    run.end = at

    # ---- checks ------------------------------------------------------------------
    def check(self) -> list[Violation]:
        """Every broken rule (empty when the history is good)."""
        with self._lock:
            runs = list(self.runs)
        out: list[Violation] = []
        by_task: dict[int, list[Run]] = defaultdict(list)
        by_group: dict[str, list[Run]] = defaultdict(list)
        for run in runs:
            by_task[run.task_id].append(run)
            if run.group is not None:
                by_group[run.group].append(run)
        for task_runs in by_task.values():
            out += _overlaps(task_runs, "self-overlap", task_runs[0].group)
        for group, group_runs in by_group.items():
            # runs of one task overlapping each other are already reported above
            out += [v for v in _overlaps(group_runs, "group-overlap", group) if v.first.task_id != v.second.task_id]
            out += _order(group_runs, group)
        return out

    def assert_ok(self) -> None:
        """Raise AssertionError listing every broken rule (at most 20 shown)."""
        violations = self.check()
        if violations:
            shown = "\n".join(str(v) for v in violations[:20])
            raise AssertionError(f"{len(violations)} violation(s) of one-at-a-time, in-order runs:\n{shown}")

    def most_at_once(self, task_ids: Iterable[int]) -> int:
        """The most runs of the tasks ``task_ids`` ever in progress at once
        (a limit's or a key's concurrency, over every process that ran them)."""
        ids = set(task_ids)
        with self._lock:
            edges = [(r.start, 1) for r in self.runs if r.task_id in ids]
            edges += [(r.until(), -1) for r in self.runs if r.task_id in ids]
        most = now = 0
        for _, step in sorted(edges):  # an end before a start at the same instant
            now += step
            most = max(most, now)
        return most

    def runs_of(self, task_id: int) -> list[Run]:
        with self._lock:
            return sorted((r for r in self.runs if r.task_id == task_id), key=lambda r: r.start)

    # ---- files ---------------------------------------------------------------------
    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> History:
        """Read a file written by :class:`HistoryLog` (a missing file is an empty history)."""
        history = cls()
        p = Path(path)
        if not p.exists():
            return history
        lines = p.read_text().split("\n")
        # the last piece is what follows the final newline: empty, or a line
        # a writer is appending right now (a reader may see part of it)
        for line in lines[:-1]:
            if not line.strip():
                continue
            ev = json.loads(line)
            if ev["e"] == "S":
                history.start(ev["t"], ev["g"], ev["w"], ev["l"], ev["at"], ev.get("o"))
            elif ev["e"] == "E":
                history.end(ev["t"], ev["w"], ev["l"], ev["at"])
            else:
                history.died(ev["w"], ev["at"])
        return history


class HistoryLog:
    """Appends starts and ends to a file that several processes share."""

    def __init__(self, path: str | os.PathLike[str], worker: str | None = None) -> None:
        self.path = os.fspath(path)
        self.worker = worker or str(os.getpid())

    def _write(self, event: dict) -> None:
        line = (json.dumps(event, separators=(",", ":")) + "\n").encode()
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line)
        finally:
            os.close(fd)

    def start(self, task_id: int, group: str | None, lease: str | None = None, order: int | None = None) -> None:
        self._write(
            {"e": "S", "t": task_id, "g": group, "w": self.worker, "l": lease, "o": order, "at": time.monotonic()}
        )

    def end(self, task_id: int, lease: str | None = None) -> None:
        self._write({"e": "E", "t": task_id, "w": self.worker, "l": lease, "at": time.monotonic()})

    def died(self, worker: str, at: float | None = None) -> None:
        """Record that ``worker`` died (now, by default): its open runs ended then."""
        self._write({"e": "D", "w": worker, "at": time.monotonic() if at is None else at})


def _overlaps(runs: Iterable[Run], rule: str, group: str | None) -> list[Violation]:
    out = []
    ordered = sorted(runs, key=lambda r: (r.start, r.until()))
    latest: Run | None = None  # the run that ends last among those seen
    for run in ordered:
        if latest is not None and run.start < latest.until():
            out.append(Violation(rule, group, latest, run))
        if latest is None or run.until() > latest.until():
            latest = run
    return out


def _order(runs: list[Run], group: str) -> list[Violation]:
    """No run of a later task starts before the final end of an earlier one."""
    by_task: dict[int, list[Run]] = defaultdict(list)
    for run in runs:
        by_task[run.key].append(run)
    out = []
    gate: Run | None = None  # the earlier task's last run that ends last
    for key in sorted(by_task):
        task_runs = sorted(by_task[key], key=lambda r: r.start)
        if gate is not None:
            for run in task_runs:
                if run.start < gate.until():
                    out.append(Violation("group-order", group, gate, run))
        last = task_runs[-1]
        if gate is None or last.until() > gate.until():
            gate = last
    return out
