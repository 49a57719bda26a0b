"""Over time: each minute's throughput, failures, queue depth, and p50/p99 of
duration and wait, per queue and per task name, as the sweeper's leader
records them (``maintenance/minute_recorder.py``) and the dashboard draws them.

The storage is bounded: a minute holds at most :data:`NAMES_PER_MINUTE`
task names per queue (the busiest; the rest are counted under
:data:`OTHER`), and minutes older than :data:`KEEP` are deleted as new ones
are written. A row whose ``name`` is :data:`QUEUE_ROW` is its queue's total
(and the only one with a depth).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from corral.core.stats import percentile

#: A minute's rows are kept a day.
KEEP = 86_400.0
#: Task names recorded per queue and minute (the busiest); the others as one.
NAMES_PER_MINUTE = 20
#: The name of a queue's own row (all its tasks) and of the names beyond the busiest.
QUEUE_ROW = ""
OTHER = "(other)"
#: Finished tasks read per minute recorded: past it a minute's figures are
#: those of its first ones (the count says so: ``done`` stops there).
READ_PER_MINUTE = 100_000
FAILED_STATES = ("FAILED", "TIMEOUT")


@dataclass(frozen=True, slots=True)
class FinishedRun:
    """A finished task as a minute's figures need it."""

    id: int
    name: str
    queue: str
    status: str
    run_at: float
    started_at: float | None
    finished_at: float


@dataclass(frozen=True, slots=True)
class MinuteStat:
    """One queue's (or one task name's in it) figures for the minute starting at ``minute``."""

    minute: int
    queue: str
    name: str
    done: int
    failed: int
    depth: int
    dur_p50: float | None
    dur_p99: float | None
    wait_p50: float | None
    wait_p99: float | None


def minute_of(ts: float) -> int:
    return int(ts // 60) * 60


def _stat(minute: int, queue: str, name: str, runs: list[FinishedRun], depth: int) -> MinuteStat:
    durations = sorted(r.finished_at - r.started_at for r in runs if r.started_at is not None)
    waits = sorted(max(0.0, r.started_at - r.run_at) for r in runs if r.started_at is not None)
    return MinuteStat(
        minute,
        queue,
        name,
        done=len(runs),
        failed=sum(r.status in FAILED_STATES for r in runs),
        depth=depth,
        dur_p50=percentile(durations, 0.5, presorted=True),
        dur_p99=percentile(durations, 0.99, presorted=True),
        wait_p50=percentile(waits, 0.5, presorted=True),
        wait_p99=percentile(waits, 0.99, presorted=True),
    )


def aggregate(minute: int, runs: Iterable[FinishedRun], depths: Mapping[str, int]) -> list[MinuteStat]:
    """A minute's rows: per queue (with its depth), and per task name in it (the busiest ones)."""
    by_queue: dict[str, dict[str, list[FinishedRun]]] = {}
    for r in runs:
        by_queue.setdefault(r.queue, {}).setdefault(r.name, []).append(r)
    out = []
    for queue in sorted(set(by_queue) | {q for q, n in depths.items() if n}):
        names = by_queue.get(queue, {})
        every = [r for rs in names.values() for r in rs]
        out.append(_stat(minute, queue, QUEUE_ROW, every, int(depths.get(queue, 0))))
        ranked = sorted(names, key=lambda n: (-len(names[n]), n))
        for name in ranked[:NAMES_PER_MINUTE]:
            out.append(_stat(minute, queue, name, names[name], 0))
        rest = [r for n in ranked[NAMES_PER_MINUTE:] for r in names[n]]
        if rest:
            out.append(_stat(minute, queue, OTHER, rest, 0))
    return out


@dataclass(slots=True)
class Bucket:
    """Minutes drawn as one point: counts summed, depth at its end, p50 the
    median of the minutes' p50s, p99 the worst minute's (minutes' p99s cannot be merged)."""

    start: int
    done: int = 0
    failed: int = 0
    depth: int = 0
    dur_p50: float | None = None
    dur_p99: float | None = None
    wait_p50: float | None = None
    wait_p99: float | None = None


def buckets(rows: Iterable[MinuteStat], start: int, end: int, width: int) -> list[Bucket]:
    """``rows`` (one queue and name) as points of ``width`` seconds from ``start`` to ``end``."""
    out = [Bucket(t) for t in range(start, end, width)]
    parts: dict[int, list[MinuteStat]] = {}
    for r in rows:
        if start <= r.minute < end:
            parts.setdefault((r.minute - start) // width, []).append(r)
    for i, ms in parts.items():
        b = out[i]
        ms.sort(key=lambda m: m.minute)
        b.done = sum(m.done for m in ms)
        b.failed = sum(m.failed for m in ms)
        b.depth = sum(m.depth for m in ms if m.minute == ms[-1].minute)  # at its end, every queue's
        for attr in ("dur_p50", "wait_p50"):
            vals = sorted(v for v in (getattr(m, attr) for m in ms) if v is not None)
            setattr(b, attr, percentile(vals, 0.5, presorted=True) if vals else None)
        for attr in ("dur_p99", "wait_p99"):
            vals = [v for v in (getattr(m, attr) for m in ms) if v is not None]
            setattr(b, attr, max(vals) if vals else None)
    return out


__all__ = [
    "FinishedRun",
    "MinuteStat",
    "Bucket",
    "aggregate",
    "buckets",
    "minute_of",
    "KEEP",
    "NAMES_PER_MINUTE",
    "QUEUE_ROW",
    "OTHER",
    "READ_PER_MINUTE",
]
