"""Lists of tasks that find things: the Tasks page's filters, sorts and pages.

A :class:`TaskQuery` names what to keep (state, name, queue, group, batch,
trace id, key, the worker holding it, its age) and an order; :func:`find_tasks`
answers one page of it and the position of the next. Every page is read by
keyset, never by OFFSET, so page 1 000 costs what page 1 costs:

- ``submitted`` (newest first) and ``age`` (oldest first) walk task ids, which
  follow submit order;
- ``status`` walks the states in their order (queued, held, finished), each
  newest first: the position is a state and an id;
- an age bound becomes an id bound first: a binary search over ids, each step
  one primary-key probe (ids follow submit order), then the rows found are
  checked against the exact time;
- a worker filter reads the tasks that worker holds (``Store.held_tasks``,
  bounded by :data:`HELD_MAX`) and applies the rest here.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from corral.core.model import TaskFilter, TaskRecord
from corral.core.states import SHOWN_ORDER, State
from corral.stores.base import Store

#: The orders a list may take: query value -> what it means.
SORTS = {
    "submitted": "newest first",
    "age": "oldest first",
    "status": "queued, held, then finished",
}
#: The order of states in a ``status`` sort.
STATE_ORDER = [s.value for s in SHOWN_ORDER]
#: Tasks one worker may hold that a worker filter reads (slots and prefetch stay far below).
HELD_MAX = 2000
#: Filters given as text: query field -> TaskFilter field.
TEXT_FILTERS = {n: n for n in ("name", "queue", "group", "batch", "trace_id", "key")}


@dataclass(slots=True)
class TaskQuery:
    status: str | None = None
    name: str | None = None
    queue: str | None = None
    group: str | None = None
    batch: str | None = None
    trace_id: str | None = None
    key: str | None = None
    #: the worker id holding the task now (RUNNING or RESERVED)
    worker: str | None = None
    #: submitted at least / at most this many seconds before ``now``
    min_age: float | None = None
    max_age: float | None = None
    sort: str = "submitted"
    #: where the page starts: the ``next`` of the page before (opaque text)
    after: str | None = None
    #: only tasks with an id up to this one (a bulk action's set as it stood)
    max_id: int | None = None
    limit: int = 50

    def __post_init__(self) -> None:
        if self.sort not in SORTS:
            raise ValueError(f"unknown sort {self.sort!r}; one of {', '.join(SORTS)}")
        if self.status is not None and self.status not in STATE_ORDER:
            raise ValueError(f"unknown state {self.status!r}; one of {', '.join(STATE_ORDER)}")
        for bound in (self.min_age, self.max_age):
            if bound is not None and bound < 0:
                raise ValueError("an age is not negative")


@dataclass(slots=True)
class TaskPage:
    rows: list[TaskRecord] = field(default_factory=list)
    #: pass as ``after`` for the next page; None on the last
    next: str | None = None


def parse_age(text: str) -> float:
    """``90``, ``90s``, ``5m``, ``2h``, ``1d`` -> seconds (ValueError otherwise)."""
    t = text.strip().lower()
    units = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
    scale = units.get(t[-1:], None)
    number = t[:-1] if scale is not None else t
    try:
        value = float(number) * (scale or 1.0)
    except ValueError:
        raise ValueError(f"not an age: {text!r} (say 90s, 5m, 2h or 1d)") from None
    if value < 0 or value != value:
        raise ValueError(f"not an age: {text!r}")
    return value


def _first_id(store: Store, at_least: int) -> TaskRecord | None:
    """The task with the smallest id at or above ``at_least`` (one primary-key probe)."""
    rows = store.list_tasks(TaskFilter(limit=1, newest_first=False, after_id=at_least - 1))
    return rows[0] if rows else None


def first_id_after(store: Store, ts: float, *, strictly: bool) -> int | None:
    """The smallest id of a task submitted after ``ts`` (at or after, unless
    ``strictly``), taking submit times to grow with ids; None when none is.

    A binary search over ids, each step one primary-key probe: about 20 probes
    for a million ids, whatever the filters."""
    newest = store.list_tasks(TaskFilter(limit=1))
    oldest = store.list_tasks(TaskFilter(limit=1, newest_first=False))
    if not newest:
        return None

    def later(rec: TaskRecord) -> bool:
        return rec.created_at > ts if strictly else rec.created_at >= ts

    if not later(newest[0]):
        return None
    # the answer is the first task at or above some id in [lo, hi]; the first
    # task at or above hi is later (ids may have gaps: deleted rows, sequences)
    lo, hi = oldest[0].id, newest[0].id
    while lo < hi:
        mid = (lo + hi) // 2
        rec = _first_id(store, mid)  # exists: the newest is at or above mid
        if rec is None or later(rec):
            hi = mid
        else:  # it and every task before it are not later
            lo = rec.id + 1
    found = _first_id(store, lo)
    return found.id if found is not None else None


def _id_bounds(store: Store, q: TaskQuery, now: float) -> tuple[int | None, int | None] | None:
    """The id range an age bound leaves (None when it leaves nothing)."""
    lo: int | None = None
    hi: int | None = q.max_id
    if q.min_age is not None:  # submitted at or before now - min_age
        beyond = first_id_after(store, now - q.min_age, strictly=True)
        if beyond is not None:
            hi = beyond - 1 if hi is None else min(hi, beyond - 1)
    if q.max_age is not None:  # submitted at or after now - max_age
        first = first_id_after(store, now - q.max_age, strictly=False)
        if first is None:
            return None
        lo = first
    if lo is not None and hi is not None and lo > hi:
        return None
    return lo, hi


def _keeps(q: TaskQuery, rec: TaskRecord, now: float) -> bool:
    """The checks an index did not make: exact ages, and every filter of a worker's tasks."""
    if q.min_age is not None and rec.created_at > now - q.min_age:
        return False
    if q.max_age is not None and rec.created_at < now - q.max_age:
        return False
    if q.max_id is not None and rec.id > q.max_id:
        return False
    if q.worker is not None:
        if rec.worker_id != q.worker or (q.status is not None and rec.status.value != q.status):
            return False
        for attr, flt_attr in TEXT_FILTERS.items():
            want = getattr(q, attr)
            if want is not None and getattr(rec, flt_attr) != want:
                return False
    return True


def _filter(q: TaskQuery, bounds: tuple[int | None, int | None], limit: int) -> TaskFilter:
    flt = TaskFilter(limit=limit, min_id=bounds[0], max_id=bounds[1])
    for attr, flt_attr in TEXT_FILTERS.items():
        setattr(flt, flt_attr, getattr(q, attr))
    return flt


def _sort_key(sort: str, rec: TaskRecord) -> tuple:
    if sort == "age":
        return (rec.id,)
    if sort == "status":
        return (STATE_ORDER.index(rec.status.value), -rec.id)
    return (-rec.id,)


def _position(sort: str, rec: TaskRecord) -> str:
    return f"{rec.status.value}:{rec.id}" if sort == "status" else str(rec.id)


def _parse_after(sort: str, after: str | None) -> tuple[int, int] | None:
    """``after`` as (state index, id); a malformed one starts at the top."""
    if not after:
        return None
    state, _, ident = after.rpartition(":")
    try:
        tid = int(ident)
    except ValueError:
        return None
    if sort == "status":
        return (STATE_ORDER.index(state), tid) if state in STATE_ORDER else None
    return (0, tid)


def find_tasks(store: Store, q: TaskQuery, now: float | None = None) -> TaskPage:
    """One page of ``q``, in its order, and where the next one starts."""
    now = store.now() if now is None else now
    bounds = _id_bounds(store, q, now) if (q.min_age is not None or q.max_age is not None) else (None, q.max_id)
    if bounds is None:
        return TaskPage()
    after = _parse_after(q.sort, q.after)
    want = q.limit + 1
    if q.worker is not None:
        found = [r for r in store.held_tasks(worker=q.worker, limit=HELD_MAX) if _keeps(q, r, now)]
        found = [r for r in found if bounds[0] is None or r.id >= bounds[0]]
        found.sort(key=lambda r: _sort_key(q.sort, r))
        if after is not None:
            mark = _mark(q.sort, after)
            found = [r for r in found if _sort_key(q.sort, r) > mark]
        found = found[:want]
    elif q.sort == "status":
        found = []
        start = after[0] if after is not None else 0
        for state in [q.status] if q.status else STATE_ORDER:
            i = STATE_ORDER.index(state)
            if i < start:
                continue
            flt = _filter(q, bounds, want - len(found))
            flt.status = State(state)
            flt.after_id = after[1] if after is not None and i == after[0] else None
            found += store.list_tasks(flt)
            if len(found) >= want:
                break
    else:
        flt = _filter(q, bounds, want)
        flt.status = State(q.status) if q.status else None
        flt.newest_first = q.sort != "age"
        flt.after_id = after[1] if after is not None else None
        found = store.list_tasks(flt)
    read = found[: q.limit]
    # a row the exact checks leave out still marks where the next page starts
    rows = [r for r in read if _keeps(q, r, now)]
    return TaskPage(rows, _position(q.sort, read[-1]) if len(found) > q.limit else None)


def _mark(sort: str, after: tuple[int, int]) -> tuple:
    """``after`` as a sort key (rows past it have a greater one)."""
    if sort == "status":
        return (after[0], -after[1])
    return (after[1],) if sort == "age" else (-after[1],)


def matching_ids(store: Store, q: TaskQuery, at_most: int, now: float | None = None) -> list[int]:
    """Ids of up to ``at_most`` tasks of ``q`` (one state, or any), by id in
    its order: one read of the ids alone when only the store's filters apply
    (no age, no worker), else page by page, by keyset."""
    if q.worker is None and q.min_age is None and q.max_age is None and (q.status or q.sort != "status"):
        flt = _filter(q, (None, q.max_id), max(0, at_most))
        flt.status = State(q.status) if q.status else None
        flt.newest_first = q.sort != "age"
        return store.task_ids(flt)
    now = store.now() if now is None else now
    page = replace(q, after=None, limit=min(500, max(1, at_most)))
    ids: list[int] = []
    while len(ids) < at_most:
        got = find_tasks(store, page, now)
        ids += [r.id for r in got.rows]
        if got.next is None:
            break
        page.after = got.next
    return ids[:at_most]


__all__ = [
    "TaskQuery",
    "TaskPage",
    "find_tasks",
    "matching_ids",
    "first_id_after",
    "parse_age",
    "SORTS",
    "STATE_ORDER",
    "HELD_MAX",
]
