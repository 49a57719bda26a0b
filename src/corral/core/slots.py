"""Per-queue slots inside one worker: ``corral worker APP -q default:8,bulk:2``.

A worker serving several queues with one pool of slots lets a flooded queue
take every slot. Giving each queue its own slots keeps room for the others:
a claim asks each queue for at most the slots it has free. Pure functions,
so the rules are tested without threads or a store.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from corral.errors import ConfigError

#: the most slots one queue may have (a worker has at most 1 000 in all)
MAX_QUEUE_SLOTS = 1000


def parse_queues(text: str) -> tuple[tuple[str, ...], dict[str, int] | None]:
    """``"a,b"`` -> ((a, b), None): one pool of slots; ``"a:8,b:2"`` ->
    ((a, b), {a: 8, b: 2}): each queue its own. Either every queue names its
    slots or none does, so no queue is left with an unclear share."""
    names: list[str] = []
    slots: dict[str, int] = {}
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        name, sep, count = part.partition(":")
        name = name.strip()
        if not name:
            raise ConfigError(f"queue {part!r} has no name")
        if name in names:
            raise ConfigError(f"queue {name!r} is named twice")
        names.append(name)
        if sep:
            try:
                n = int(count.strip())
            except ValueError:
                raise ConfigError(f"queue {name!r}: slots must be a whole number, not {count.strip()!r}") from None
            slots[name] = n
    if not names:
        raise ConfigError("no queue named")
    if slots and len(slots) != len(names):
        bare = ", ".join(n for n in names if n not in slots)
        raise ConfigError(f"give every queue its slots (name:N) or none; {bare} has none")
    if slots:
        check_slots(slots)
    return tuple(names), (slots or None)


def check_slots(slots: Mapping[str, int]) -> dict[str, int]:
    """Refuse per-queue slots that are not 1..MAX_QUEUE_SLOTS, or no queue at all."""
    if not slots:
        raise ConfigError("per-queue slots name no queue")
    out: dict[str, int] = {}
    for name, n in slots.items():
        if not isinstance(name, str) or not name:
            raise ConfigError(f"queue names must be non-empty strings, not {name!r}")
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_QUEUE_SLOTS:
            raise ConfigError(f"queue {name!r}: slots must be a whole number from 1 to {MAX_QUEUE_SLOTS}, not {n!r}")
        out[name] = n
    return out


def queue_budgets(
    order: Sequence[str], slots: Mapping[str, int], held: Mapping[str, int], want: int
) -> list[tuple[str, int]]:
    """How many units to ask of each queue, in ``order``, for a claim of at
    most ``want``: each queue at most its free slots (its slots less the
    units it holds). Queues with nothing free are left out."""
    out: list[tuple[str, int]] = []
    left = want
    for q in order:
        if left <= 0:
            break
        free = min(slots.get(q, 0) - held.get(q, 0), left)
        if free > 0:
            out.append((q, free))
            left -= free
    return out


def rotate(names: Sequence[str], turn: int) -> tuple[str, ...]:
    """``names`` starting at ``turn`` (mod their number): claims take turns
    at which queue asks first, so none is always served last."""
    if not names:
        return ()
    k = turn % len(names)
    return tuple(names[k:]) + tuple(names[:k])


def retry_room(slots: int, share: float, fresh_peak: int) -> int:
    """The most slots retries may hold in a worker where fresh work held up
    to ``fresh_peak`` slots a moment ago: room is kept for twice that many
    fresh units (arrivals come in bursts, and a slot a retry holds frees
    only when the retry ends), but retries always keep their share,
    ``ceil(slots * share)`` (at least 1). Without recent fresh work
    (``fresh_peak`` 0) retries may hold every slot."""
    own = max(1, math.ceil(slots * share - 1e-9))
    return max(own, slots - 2 * max(0, fresh_peak))


class RecentPeak:
    """The most of a count seen over roughly the last ``window`` seconds
    (between one and two windows: two buckets, no list kept)."""

    def __init__(self, window: float = 1.0) -> None:
        self.window = window
        self._start = -math.inf
        self._now_max = 0
        self._before_max = 0

    def _roll(self, now: float) -> None:
        if now - self._start >= 2 * self.window:
            self._start, self._now_max, self._before_max = now, 0, 0
        elif now - self._start >= self.window:
            self._start, self._before_max, self._now_max = now, self._now_max, 0

    def note(self, value: int, now: float) -> None:
        self._roll(now)
        self._now_max = max(self._now_max, value)

    def peak(self, now: float) -> int:
        self._roll(now)
        return max(self._now_max, self._before_max)


__all__ = ["MAX_QUEUE_SLOTS", "RecentPeak", "check_slots", "parse_queues", "queue_budgets", "retry_room", "rotate"]
