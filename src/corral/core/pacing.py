"""How much work a worker takes at once: chunk size and prefetch, chosen by default.

Each claim costs a store round trip (a durable write on SQLite and
PostgreSQL), and a slot that waits for one stands idle. Two knobs hide that
cost, both pure arithmetic here so they test without threads or a database:

- :class:`AutoChunk` sizes a group's chunk from the tasks' measured
  durations, so one claim brings about :data:`CHUNK_TARGET_SECONDS` of a
  group's work. A group runs its tasks one after another anyway, so a chunk
  costs the group nothing; it bounds how long a unit holds its slot (and a
  limit's place), which keeps round robin between groups fair. Long tasks get
  chunks of one, today's behaviour. :func:`chunk_reach` lets a group's last
  chunk take a small rest of the group with it, and :func:`tail_split`
  shortens the chunks as the queued work runs out, so the run ends evenly.
- :func:`default_prefetch` is how many units a worker may hold beyond its
  free slots, so a freed slot starts its next unit without waiting a claim;
  :func:`auto_prefetch` raises it for quick units, so that one claim brings
  many of them (most of a claim's cost is per statement, not per task).
- A unit under a capped limit cannot be prefetched (it would hold a place
  idle), so :func:`relay_due` says when a running one should ask for its
  successor instead: the successor is claimed under the running unit's own
  lease, in the place it holds, and starts there the moment it ends.
"""

from __future__ import annotations

import math

#: One claim of a group brings about this much work (seconds) once durations are known.
CHUNK_TARGET_SECONDS = 1.0
#: The largest chunk chosen by itself (an explicit ``chunk_size`` may be larger).
AUTO_CHUNK_MAX = 200
#: Weight of the newest duration in the running mean.
_ALPHA = 0.05


class RunningMean:
    """A running mean of durations: the plain mean while few are known, then
    a moving one. Not locked: slot threads that race may lose a sample,
    which only makes the mean a little older."""

    def __init__(self, warmup: int = 5) -> None:
        self.warmup = warmup
        self.samples = 0
        self.mean: float | None = None

    def observe(self, seconds: float) -> None:
        """Record one task's duration (wall time of its run)."""
        seconds = max(0.0, seconds)
        self.samples += 1
        mean = self.mean
        if mean is None:
            self.mean = seconds
        else:
            # the plain mean while few are known, then a moving one
            alpha = max(_ALPHA, 1.0 / self.samples)
            self.mean = mean + alpha * (seconds - mean)

    def known(self) -> float | None:
        """The mean once ``warmup`` durations are in, else None."""
        return self.mean if self.samples >= self.warmup else None


class AutoChunk(RunningMean):
    """A running mean of task durations, and the chunk size it implies.

    Until ``warmup`` tasks have been measured the chunk is 1, so a worker
    knows nothing of its tasks before it chunks them."""

    def __init__(self, target: float = CHUNK_TARGET_SECONDS, maximum: int = AUTO_CHUNK_MAX, warmup: int = 5) -> None:
        super().__init__(warmup)
        self.target = target
        self.maximum = maximum

    def size(self) -> int:
        """The chunk size to claim with now."""
        mean = self.known()
        if mean is None:
            return 1
        if mean <= 0:
            return self.maximum
        return max(1, min(self.maximum, math.floor(self.target / mean)))


def chunk_reach(chunk: int) -> int:
    """How far a chunk of ``chunk`` tasks may stretch to take the rest of its
    group: a quarter more. A group of 110 tasks under chunks of 100 runs as
    one unit, not as 100 and then 10 (a second turn through the claim and
    through the round robin for a tenth of the work), and a unit still holds
    its slot at most a quarter longer than the chunk target."""
    return chunk + chunk // 4


#: Near the end of the queued work a unit is at most this fraction of each
#: slot's share of the work left (see :func:`tail_split`).
TAIL_SHARE = 4


def tail_split(chunk: int, backlog: int, slots: int) -> tuple[int, int] | None:
    """Chunks for the end of the queued work, or None while it is far.

    A unit is a group's turn: the group runs it on one slot while the other
    groups wait for theirs. Near the end of the queue, units of ``chunk``
    tasks leave the run to end unevenly: the last units start at different
    moments and some slots stand idle for most of a unit while others
    finish theirs. So when a chunk is more than a quarter of each slot's
    share of the ``backlog`` (queued tasks, ``slots`` running them), groups
    are claimed in chunks of ``short`` (that quarter), as in guided
    self-scheduling; a group whose line has at least ``long`` tasks (a
    slot's whole share) keeps ``chunk``: the end of the run waits for it,
    and short units would send it round the rotation between each.
    Returns ``(short, long)``. Measured: ``docs/benchmarks.md`` (simulated first: its git history)."""
    if chunk <= 1 or slots <= 0 or backlog < 0:
        return None
    short = -(-backlog // (TAIL_SHARE * slots))
    if short >= chunk:
        return None
    return max(1, short), -(-backlog // slots)


def line_chunk(chunk: int, line: int, tail: tuple[int, int] | None) -> int:
    """The chunk for a group whose line holds ``line`` tasks (its head
    included), given a claim's ``tail`` (see :func:`tail_split`): ``short``
    for a line shorter than ``long``, else ``chunk``."""
    if tail is not None and line < tail[1]:
        return min(chunk, tail[0])
    return chunk


def tail_bound(chunk: int, slots: int) -> int:
    """How far a worker needs to count the backlog for :func:`tail_split`:
    at or beyond this many queued tasks, chunks are as usual."""
    return TAIL_SHARE * max(1, slots) * max(1, chunk)


def default_prefetch(concurrency: int) -> int:
    """Units a worker holds beyond its free slots by default: twice its
    slots, at most 64. Enough that each freed slot finds a unit waiting while
    the next claim (a durable write, several milliseconds on a busy server)
    is under way, and that a claim brings several units per write; few
    enough that a worker does not sit on much work another worker could
    start (each unit holds a lease). Measured: ``docs/benchmarks.md``."""
    return max(1, min(64, 2 * concurrency))


#: Work a worker holds ahead of its slots, in seconds of each slot's time,
#: when its units are quick (see :func:`auto_prefetch`).
PREFETCH_AHEAD_SECONDS = 0.02
#: The most units a worker holds ahead by itself (an explicit prefetch may be larger).
AUTO_PREFETCH_MAX = 256


def auto_prefetch(concurrency: int, unit_seconds: float | None) -> int:
    """Units to hold beyond the free slots, given the mean time a unit takes
    here (None: not known yet). Never fewer than :func:`default_prefetch`;
    for quick units as many as make :data:`PREFETCH_AHEAD_SECONDS` of each
    slot's work, at most :data:`AUTO_PREFETCH_MAX`. Much of a claim's cost is
    the statement, its triggers and its commit, whatever the number of
    units: a worker of 8 slots holding 16 no-op tasks ahead claimed 9 at a
    time and the database spent its time on claims. The work held ahead
    stays a few hundredths of a second, so no other worker waits on it for
    longer. Measured: ``docs/benchmarks.md``."""
    base = default_prefetch(concurrency)
    if unit_seconds is None:
        return base
    if unit_seconds <= 0:
        return max(base, AUTO_PREFETCH_MAX)
    return max(base, min(AUTO_PREFETCH_MAX, math.floor(concurrency * PREFETCH_AHEAD_SECONDS / unit_seconds)))


#: Ask for a relay this much earlier than the store's answer is expected: the
#: answer also waits for the completer's other writes (1.5: two-process
#: groups on PostgreSQL 0.939 and 0.941; 3: 0.965 and 0.955, in turns).
RELAY_MARGIN = 3.0
#: Lead before the store's handover time is known, and the most ever used (seconds).
RELAY_LEAD_DEFAULT = 0.05
RELAY_LEAD_MAX = 0.25


def relay_lead(write_seconds: float | None) -> float:
    """How long before its end a running unit asks for its successor: the
    time the completer's handover write takes here, with a margin (a
    successor that comes early waits in the place, which stays counted
    once; one that comes late leaves the place idle)."""
    if write_seconds is None:
        return RELAY_LEAD_DEFAULT
    return min(RELAY_LEAD_MAX, max(0.002, write_seconds * RELAY_MARGIN))


def relay_due(tasks_left: int, task_seconds: float | None, lead: float) -> bool:
    """Should a unit with ``tasks_left`` tasks to run (the one starting
    included), each taking about ``task_seconds``, ask for its successor now?"""
    if task_seconds is None or tasks_left <= 0:
        return False
    return tasks_left * task_seconds <= lead
