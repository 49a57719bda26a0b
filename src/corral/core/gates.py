"""Flow control inside a claim: what every store decides the same way.

A claim holds the limits' rows (memory: its lock; SQLite: the write lock;
PostgreSQL: an advisory lock per limit) while it picks tasks. :class:`Gates`
answers, for each candidate, whether its limits and breakers let it start
now, charges what it takes, and says afterwards what to write back: the
rates' logs of starts and buckets, and the breakers' states. So a rate and a breaker's probes are
charged in the same transaction that takes the task, fleet-wide, and a task
that may not start yet is simply skipped: no attempt burned, its group waits.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field

from corral.core import breaker as brk
from corral.core.model import BreakerEvent, LimitSpec
from corral.core.rates import Bucket, Rate, Window, parse_rate

log = logging.getLogger("corral.breaker")

#: room of a gate that does not limit
_OPEN = 1 << 30
#: between a keyed limit's name and a key in the limit name a task is stored
#: with: ``merchant_api`` keyed by ``m-1001`` is the gate ``merchant_api\x1fm-1001``
KEY_SEP = "\x1f"


def keyed_name(limit: str, key: str) -> str:
    """The gate of ``limit``'s budget for ``key`` (a keyed limit, ``per_key=True``)."""
    return f"{limit}{KEY_SEP}{key}"


def split_key(name: str) -> tuple[str, str | None]:
    """``(limit, key)`` of a gate name; the key is None for a plain limit."""
    limit, sep, key = name.partition(KEY_SEP)
    return (limit, key) if sep else (name, None)


#: a worker behind a busy rate looks again when this many seconds' worth of
#: starts are allowed (see LimitState.wake)
WAKE_EVERY = 0.05


def fold_keys(usage: Iterable[tuple[str, int]]) -> dict[str, int]:
    """Places held per limit: a keyed limit's keys summed under its name (a
    view bounded by the limits declared, whatever the number of keys)."""
    out: dict[str, int] = {}
    for name, n in usage:
        if n:
            limit = split_key(name)[0]
            out[limit] = out.get(limit, 0) + n
    return out


def busiest_keys(usage: Iterable[tuple[str, int]], top: int = 5) -> dict[str, list[tuple[str, int]]]:
    """Per keyed limit, its ``top`` keys holding the most places (most first,
    then by key), and no other."""
    per: dict[str, list[tuple[str, int]]] = {}
    for name, n in usage:
        limit, key = split_key(name)
        if key is not None and n:
            per.setdefault(limit, []).append((key, n))
    return {limit: sorted(keys, key=lambda kn: (-kn[1], kn[0]))[: max(0, top)] for limit, keys in per.items()}


@dataclass(slots=True)
class LimitState:
    """A limit's row: its settings, its bucket and its log of recent starts
    (``starts``, JSON: a sliding window's, see :class:`corral.core.rates.Window`)."""

    spec: LimitSpec
    tokens: float | None = None
    counted_at: float | None = None
    starts: str | None = None

    def rate(self) -> Rate | None:
        if not self.spec.rate:
            return None
        try:
            return parse_rate(self.spec.rate, self.spec.burst)
        except ValueError:  # stored by another program: unreadable means no rate
            return None

    def bucket(self, rate: Rate, now: float) -> Bucket:
        if self.tokens is None or self.counted_at is None:
            return Bucket.full(rate, now)
        return Bucket(self.tokens, self.counted_at)

    def window(self) -> Window:
        return Window.from_json(self.starts)

    def room(self, rate: Rate, now: float) -> int:
        """How many may start at ``now`` under the rate: the bucket's whole
        tokens, and room in the window (a window's bucket paces it)."""
        room = int(math.floor(self.bucket(rate, now).level(rate, now) + 1e-9))
        if rate.window is not None:
            room = min(room, self.window().room(rate, now))
        return room

    def wait(self, rate: Rate, now: float) -> float:
        """Seconds from ``now`` until one more may start under the rate."""
        wait = self.bucket(rate, now).wait(rate, now)
        if rate.window is not None:
            wait = max(wait, self.window().wait(rate, now))
        return wait

    def wake(self, rate: Rate, now: float) -> float:
        """Seconds from ``now`` until a worker should look again: when
        :data:`WAKE_EVERY` seconds' worth of starts are allowed (one at
        least, half the pacing bucket at most, so none is lost to the
        bucket's cap), not at each one: at 200/s, a claim every 50 ms takes
        ten starts where one for each would take 200 claims a second."""
        wait = self.wait(rate, now)
        if rate.pace is None:
            return wait
        batch = min(math.floor(rate.per_second * WAKE_EVERY), math.floor(rate.pace / 2))
        if batch <= 1:
            return wait
        b = self.bucket(rate, now)
        return max(wait, (batch - b.level(rate, now)) / rate.per_second)

    def tokens_now(self, now: float) -> float | None:
        """Starts the rate allows at ``now``: tokens in the bucket, refilled
        since last counted, no more than room left in the window (None: no rate)."""
        rate = self.rate()
        if rate is None:
            return None
        level = self.bucket(rate, now).level(rate, now)
        if rate.window is not None:
            level = min(level, float(self.window().room(rate, now)))
        return level

    def frees_at(self, now: float) -> float | None:
        """When (store time) the rate lets the next task start, if it does
        not now (None: it does, or no rate). A pause's end counts too."""
        at = None
        rate = self.rate()
        if rate is not None and self.room(rate, now) < 1:
            at = now + self.wait(rate, now)
        paused = self.spec.paused_until
        if paused is not None and paused > now:
            at = max(at or paused, paused)
        return at


def key_at_rest(base: LimitSpec | None, own: LimitState, now: float) -> bool:
    """May the row of a key's budget (``own``, of the keyed limit ``base``)
    be forgotten at ``now``? Yes when it holds nothing a missing row would
    not: no pause in force, its bucket full again and its window empty. Its
    places need no row (they are counted from the running tasks), so a key
    forgotten and used again starts with the very budget it had."""
    if own.spec.paused_until is not None and own.spec.paused_until > now:
        return False
    rate_text = own.spec.rate or (base.rate if base is not None else None)  # the key's own rate, if it has one
    if base is None or not rate_text:
        return True
    state = LimitState(
        LimitSpec(own.spec.name, rate=rate_text, burst=base.burst), own.tokens, own.counted_at, own.starts
    )
    rate = state.rate()
    if rate is None:
        return True
    if state.bucket(rate, now).level(rate, now) < rate.bucket_size - 1e-9:
        return False
    return rate.window is None or state.window().used(rate, now) == 0


@dataclass(frozen=True, slots=True)
class Charge:
    """What a claim writes back to a rated limit's row."""

    tokens: float | None
    counted_at: float | None
    starts: str | None


@dataclass(slots=True)
class BreakerRow:
    name: str
    config: brk.BreakerConfig
    state: brk.Breaker


class LazyUsage(dict[str, int]):
    """Places held per limit, each read when first asked for: a claim asks
    for the limits of the candidates it meets, not every limit and key the
    store holds places under (``count`` reads one limit's places)."""

    def __init__(self, count: Callable[[str], int]) -> None:
        super().__init__()
        self._count = count

    def get(self, name: str, default: int = 0) -> int:  # type: ignore[override]
        if name not in self:
            self[name] = self._count(name)
        return dict.get(self, name, default)


@dataclass(slots=True)
class Gates:
    """Room left under each limit and breaker during one claim at ``now``."""

    now: float
    limits: dict[str, LimitState]
    usage: dict[str, int]
    breakers: dict[str, BreakerRow]
    _room: dict[str, int] = field(default_factory=dict)
    _taken: dict[str, int] = field(default_factory=dict)
    #: each key's budget met in this claim: its limit's settings, its own bucket and log
    _keyed: dict[str, LimitState | None] = field(default_factory=dict)
    #: seconds until a skipped candidate's gate may open (a token, a pause's end, a cooldown)
    wait: float | None = None
    #: reads the row of a key's budget when ``limits`` does not hold it (None: no
    #: row). A store passes its declared limits only and reads a key's row when a
    #: candidate of that key comes up: the claim touches the keys it looks at,
    #: however many keys the store holds.
    load_key: Callable[[str], LimitState | None] | None = None

    def _note_wait(self, seconds: float) -> None:
        if seconds > 0 and (self.wait is None or seconds < self.wait):
            self.wait = seconds

    def limit(self, name: str) -> LimitState | None:
        """The limit gating ``name``. A key's budget (see :func:`keyed_name`)
        has its limit's settings and its own state: the row of its key when
        a rate charged one (created on first use), else a full bucket; none
        of its places are counted but its own. A key's row that holds its own
        concurrency or rate (its own controller's, per-key adaptive) overrides
        the limit's."""
        if KEY_SEP not in name:
            return self.limits.get(name)
        if name in self._keyed:
            return self._keyed[name]
        base = self.limits.get(split_key(name)[0])
        got = None
        if base is not None:
            own = self.limits.get(name)
            if own is None and self.load_key is not None:
                own = self.load_key(name)
            if own is None:  # no row: a key idle or never seen has its whole budget
                own = LimitState(LimitSpec(name))
            # a key whose own controller (a per-key adaptive limit) set its values in its row
            # runs under them; any other key under its limit's
            conc = own.spec.concurrency if own.spec.concurrency is not None else base.spec.concurrency
            rate = own.spec.rate if own.spec.rate is not None else base.spec.rate
            spec = LimitSpec(name, conc, rate, base.spec.burst, own.spec.paused_until)
            got = LimitState(spec, own.tokens, own.counted_at, own.starts)
        self._keyed[name] = got
        return got

    def room(self, name: str) -> int:
        """How many more claims the gate ``name`` (a limit or a breaker) lets start now."""
        got = self._room.get(name)
        if got is not None:
            return got
        room = _OPEN
        lim = self.limit(name)
        if lim is not None:
            spec = lim.spec
            if spec.concurrency is not None:
                room = min(room, max(0, spec.concurrency - self.usage.get(name, 0)))
            if spec.paused_until is not None and spec.paused_until > self.now:
                room = 0
                self._note_wait(spec.paused_until - self.now)
            rate = lim.rate()
            if rate is not None and room:
                room = min(room, lim.room(rate, self.now))
                if not room:
                    self._note_wait(lim.wake(rate, self.now))
        row = self.breakers.get(name)
        if row is not None and room:
            n, _, _ = brk.admit(row.state, row.config, self.now, room)
            room = min(room, n)
            if not room:
                reopen = row.state.reopens_at()
                if reopen is not None and not row.state.forced:
                    self._note_wait(reopen - self.now)
        self._room[name] = room
        return room

    def gated(self, name: str) -> bool:
        """Whether ``name`` is a gate at all (a limit with a cap, rate or pause, or a breaker)."""
        lim = self.limit(name)
        if lim is not None and (lim.spec.concurrency is not None or lim.spec.rate or lim.spec.paused_until):
            return True
        return name in self.breakers

    def timed(self) -> bool:
        """Did a gate that opens with time take part in the claim so far: a
        rate, a pause's end, a breaker not closed?"""
        return self.wait is not None or any(self._charged_per_start(n) for n in self._room)

    def _charged_per_start(self, name: str) -> bool:
        """A rate, or a breaker not closed: a gate that counts each start and opens with time."""
        lim = self.limit(name)
        if lim is not None and lim.spec.rate:
            return True
        row = self.breakers.get(name)
        return row is not None and row.state.state is not brk.BreakerState.CLOSED

    def names_of(self, limits: Iterable[str], task_name: str) -> list[str]:
        out = [n for n in limits if n in self.breakers or self.limit(n) is not None]
        if task_name in self.breakers and task_name not in out:
            out.append(task_name)
        return out

    def fits(self, limits: Iterable[str], task_name: str) -> bool:
        return all(self.room(n) > 0 for n in self.names_of(limits, task_name))

    def solo(self, limits: Iterable[str], task_name: str) -> bool:
        """A unit under a rate or a probing breaker is one task: each start is charged."""
        return any(self._charged_per_start(n) for n in self.names_of(limits, task_name))

    def take(self, limits: Iterable[str], task_name: str) -> None:
        """Charge one claim to every gate of a task (call only after :meth:`fits`)."""
        for n in self.names_of(limits, task_name):
            self.room(n)
            self._room[n] -= 1
            self._taken[n] = self._taken.get(n, 0) + 1

    def rate_writes(self) -> dict[str, Charge]:
        """The rates to store: the buckets a claim took tokens from, and the
        windows it logged starts in."""
        out: dict[str, Charge] = {}
        for n, k in self._taken.items():
            lim = self.limit(n)
            rate = lim.rate() if lim is not None else None
            if lim is None or rate is None or k <= 0:
                continue
            _, b = lim.bucket(rate, self.now).take(rate, self.now, k)
            starts = lim.starts
            if rate.window is not None:
                starts = lim.window().take(rate, self.now, k).to_json()
            out[n] = Charge(b.tokens, b.at, starts)
        return out

    def breaker_writes(self) -> dict[str, tuple[brk.Breaker, BreakerEvent | None]]:
        """The breakers to store: probes handed out, or OPEN turned HALF_OPEN."""
        out: dict[str, tuple[brk.Breaker, BreakerEvent | None]] = {}
        for n, row in self.breakers.items():
            if row.state.state is brk.BreakerState.CLOSED or n not in self._room:
                continue
            _, after, change = brk.admit(row.state, row.config, self.now, self._taken.get(n, 0))
            if after != row.state:
                out[n] = (after, event(self.now, n, change) if change is not None else None)
        return out


#: How the log names a breaker's new state.
_VERBS = {
    brk.BreakerState.OPEN: "opened",
    brk.BreakerState.HALF_OPEN: "is half-open (probing)",
    brk.BreakerState.CLOSED: "closed",
}


def event(now: float, name: str, change: brk.Change) -> BreakerEvent:
    """The event of a change the fleet's own calls made (a claim's probes, an
    outcome), logged as a WARNING by the process that made it: an operator
    watching a worker's log sees its breakers open, probe and close. (A
    change forced by hand is the operator's own and only an event.)"""
    verb = _VERBS.get(change.after, change.after.value)
    if change.before is brk.BreakerState.HALF_OPEN and change.after is brk.BreakerState.OPEN:
        verb = "opened again"
    log.warning("breaker %r %s: %s", name, verb, change.reason)
    return BreakerEvent(
        now, name, change.before.value, change.after.value, change.reason, change.calls, change.failures
    )


def record_outcomes(
    rows: dict[str, BreakerRow], verdicts: Iterable[tuple[Collection[str], bool | None]], now: float
) -> tuple[dict[str, brk.Breaker], list[BreakerEvent]]:
    """Feed finished calls to the breakers they pass through.

    ``verdicts``: per outcome, the gate names of its task (its name and
    limits) and whether it failed (None: no verdict, a probe's place goes
    back). Returns the changed states and the events to log."""
    changed: dict[str, brk.Breaker] = {}
    events: list[BreakerEvent] = []
    for names, failed in verdicts:
        for n in names:
            row = rows.get(n)
            if row is None:
                continue
            before = changed.get(n, row.state)
            if failed is None:
                after, change = brk.give_back_probe(before), None
            else:
                after, change = brk.record(before, row.config, now, failed)
            if after != before:
                changed[n] = after
            if change is not None:
                events.append(event(now, n, change))
    return changed, events
