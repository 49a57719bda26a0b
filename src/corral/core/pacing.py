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
  chunk take a small rest of the group with it.
- :func:`default_prefetch` is how many units a worker may hold beyond its
  free slots, so a freed slot starts its next unit without waiting a claim.
"""

from __future__ import annotations

import math

#: One claim of a group brings about this much work (seconds) once durations are known.
CHUNK_TARGET_SECONDS = 1.0
#: The largest chunk chosen by itself (an explicit ``chunk_size`` may be larger).
AUTO_CHUNK_MAX = 200
#: Weight of the newest duration in the running mean.
_ALPHA = 0.05


class AutoChunk:
    """A running mean of task durations, and the chunk size it implies.

    Until ``warmup`` tasks have been measured the chunk is 1, so a worker
    knows nothing of its tasks before it chunks them. Not locked: slot
    threads that race may lose a sample, which only makes the mean a
    little older."""

    def __init__(self, target: float = CHUNK_TARGET_SECONDS, maximum: int = AUTO_CHUNK_MAX, warmup: int = 5) -> None:
        self.target = target
        self.maximum = maximum
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

    def size(self) -> int:
        """The chunk size to claim with now."""
        mean = self.mean
        if mean is None or self.samples < self.warmup:
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


def default_prefetch(concurrency: int) -> int:
    """Units a worker holds beyond its free slots by default: twice its
    slots, at most 64. Enough that each freed slot finds a unit waiting while
    the next claim (a durable write, several milliseconds on a busy server)
    is under way, and that a claim brings several units per write; few
    enough that a worker does not sit on much work another worker could
    start (each unit holds a lease). Measured: ``docs/benchmarks.md``."""
    return max(1, min(64, 2 * concurrency))
